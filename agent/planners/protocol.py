"""The offline protocol planner: Wiles et al.'s procedure, LANCE perturbations and counterfactual confirmation.

baseline -> caption failures, and screen every single-attribute perturbation of the class prompt the generator can
render (a few images each, no test) -> measure each caption hypothesis and the perturbations that screened worst
(sequential tests stop early for futility, so weak hypotheses cost little) -> refine the supported ones to the
shortest caption that keeps the effect -> test the mechanism (counterfactual edits of class images; a LANCE
perturbation of the attribute as a control) -> confirm on fresh seeds -> record -> finish. Deterministic: the same
results give the same turns.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

from sleuth.agent.events import Event, ToolCall
from sleuth.agent.loop import Turn
from sleuth.agent.planners.screening import content_key, screened, select

Results = list[dict[str, Any]]
Script = Generator[Turn, Results, None]


def _pct(rate: dict[str, Any]) -> str:
    if not rate.get("n"):
        return "0/0"
    return f"{rate['k']}/{rate['n']} = {100 * rate['rate']:.1f}% [{100 * rate['low']:.1f}%, {100 * rate['high']:.1f}%]"


def _float(x: float | str | None) -> float:
    """A number from a tool result: JSON has no infinity, so an infinite ratio (a baseline with no failures) may
    arrive as null or as the string "Infinity"."""
    if x is None:
        return float("inf")
    return float(x)


def _num(x: float | str | None) -> str:
    return f"{_float(x):.3g}"


def _ratio(r: dict[str, Any] | None) -> str:
    if not r:
        return "n/a"
    return f"{_num(r['ratio'])}x [{_num(r['low'])}, {_num(r['high'])}]"


def _top_confusion(r: dict[str, Any]) -> str | None:
    conf = (r.get("hypothesis") or {}).get("confusions") or []
    return conf[0]["label"] if conf else None


def _round_robin(groups: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while any(groups):
        for q in groups:
            if q:
                out.append(q.pop(0))
    return out


def _spread(results: list[dict[str, Any]], kind: Callable[[dict[str, Any]], str],
            mode: Callable[[dict[str, Any]], str]) -> list[dict[str, Any]]:
    """Round robin over kinds of hypothesis, strongest kind first; within a kind, round robin over its failure modes
    (the wrong label), each in order of its surest effect: a second phrasing of one failure waits for the others."""
    by_kind: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in sorted(results, key=lambda r: -_float(r["rate_ratio"]["low"])):
        by_kind.setdefault(kind(r), {}).setdefault(mode(r), []).append(r)
    return _round_robin([_round_robin(list(modes.values())) for modes in by_kind.values()])


def _same(r: dict[str, Any]) -> Generator[Turn, Results, dict]:
    """A caption with one attribute sentence is already as short as it gets."""
    return r
    yield  # pragma: no cover - makes this a generator


def _n_sentences(caption: str) -> int:
    return len([s for s in caption.split(".") if s.strip()])


class ProtocolPlanner:
    """Deterministic planner that follows the published procedure with adaptive allocation of the image budget."""

    deterministic = True
    """The same tool results give the same turns: resume and fork can fast-forward it."""
    name = "protocol"

    explore_types = ("background", "domain", "object", "adjective")

    def __init__(self, label: str, class_prompt: str, *, baseline_n: int = 1000, max_hypotheses: int = 6,
                 max_refine: int = 8, max_n: int = 800, explore_n: int = 100, screen_n: int = 30,
                 explore_top: int = 24, explore_max_n: int = 400, explore_first_n: int = 50, explore: bool = True,
                 refine: bool = True, counterfactual: bool = True, name: str = "protocol") -> None:
        """``explore_n``: perturbations per edit type asked of perturb_caption (100: every one the generator can
        render); each is screened on ``screen_n`` images and the ``explore_top`` that fail most (one per failure mode
        first) are tested, with sequential looks from ``explore_first_n`` up to ``explore_max_n`` images."""
        self.name = name
        self.explore = explore
        self.refine = refine
        self.counterfactual = counterfactual
        self.label = label
        self.class_prompt = class_prompt
        self.baseline_n = baseline_n
        self.max_hypotheses = max_hypotheses
        self.max_refine = max_refine
        self.max_n = max_n
        self.explore_n = explore_n
        self.screen_n = screen_n
        self.explore_top = explore_top
        self.explore_max_n = explore_max_n
        self.explore_first_n = explore_first_n
        self._script: Script | None = None
        self._calls = 0

    # -- Planner protocol -------------------------------------------------------------------------------

    def next_turn(self, events: Sequence[Event]) -> Turn:
        if self._script is None:
            self._script = self._run()
            return next(self._script)
        return self._script.send(self._last_results(events))

    @staticmethod
    def _last_results(events: Sequence[Event]) -> Results:
        """Results (or {'error': ...}) of the calls made in the latest planner turn, in call order."""
        out: list[dict[str, Any]] = []
        for e in reversed(events):
            if e.kind == "planner_turn":
                break
            if e.kind == "tool_returned":
                out.append(e.result if e.ok and e.result is not None else {"error": e.error or "failed"})
        return list(reversed(out))

    def _call(self, name: str, **arguments: Any) -> ToolCall:
        self._calls += 1
        if name == "measure_rate":
            # Tests compare against a baseline of the planner's own size (the tool would top it up to its default).
            arguments.setdefault("baseline_n", self.baseline_n)
        return ToolCall(id=f"call_{self._calls}", name=name, arguments=arguments)

    def _turn(self, reasoning: str, *calls: ToolCall) -> Turn:
        return Turn(reasoning=reasoning, tool_calls=list(calls), model="protocol")

    # -- the procedure ----------------------------------------------------------------------------------

    def _run(self) -> Script:
        label, prompt = self.label, self.class_prompt
        (base,) = yield self._turn(
            f"I start with the baseline: how often does the classifier fail on {self.baseline_n} generated images "
            f"of {prompt!r}? Its failures are the material for hypotheses.",
            self._call("generate_and_classify", prompt=prompt, n=self.baseline_n),
        )
        if "error" in base:
            yield self._finish(f"The baseline could not be measured: {base['error']}")
            return
        s = base["summary"]
        confusions = ", ".join(f"{c['label']} ({c['count']})" for c in s["confusions"]) or "none"
        calls = [self._call("perturb_caption", caption=prompt, types=list(self.explore_types), n=self.explore_n,
                            refinements=False)] if self.explore else []
        if s["failures"]["k"] > 0:
            calls.insert(0, self._call("caption_failures", measurement_id=base["measurement_id"]))
        results: Results = []
        if calls:
            results = yield self._turn(
                f"Baseline failure rate {_pct(s['failures'])}; the classifier's wrong answers: {confusions}. "
                + ("I caption the failed images, clustered by predicted label and appearance, to form hypotheses. "
                   if s["failures"]["k"] > 0 else "There are no failures to caption. ")
                + ("Attributes that are rare among the class's natural images rarely show up among its failures, so I "
                   "also perturb the class prompt one attribute at a time (LANCE: background, domain, co-occurring "
                   "object, adjective) with every phrase of the general vocabulary the generator can render."
                   if self.explore else ""),
                *calls,
            )
        caps = results[0] if s["failures"]["k"] > 0 else {}
        pert = results[-1] if self.explore else {}
        hyps = self._unique(caps.get("hypotheses", []))[: self.max_hypotheses]
        kinds = {e["caption"]: e["type"] for e in pert.get("edits", [])}
        seen = {content_key(h["caption"]) for h in hyps}
        candidates = [c for c in kinds if content_key(c) not in seen]
        explore: list[str] = []
        if candidates:
            screens = yield self._turn(
                f"perturb_caption proposes {len(candidates)} single-attribute perturbations the generator can render "
                f"(and left out {len(pert.get('not_rendered', []))} it cannot). Testing them all would spend the "
                f"budget and enlarge the family every p-value is corrected over, so I first screen each on "
                f"{self.screen_n} images: a look, not a test. Then I test on fresh seeds the {self.explore_top} that "
                "fail most often, taking the strongest of each kind of failure (edit type, wrong label) first.",
                *[self._call("generate_and_classify", prompt=c, n=self.screen_n) for c in candidates],
            )
            base_rate = s["failures"]["k"] / max(s["failures"]["n"], 1)
            looks = [x for c, r in zip(candidates, screens) if (x := screened(c, kinds[c], r)) is not None]
            explore = [x.caption for x in select(looks, base_rate, self.explore_top)]
        if not hyps and not explore:
            yield self._finish(f"Baseline {_pct(s['failures'])}; no caption cluster and no perturbation that screened "
                               "above the baseline to test.")
            return
        listing = "; ".join(f"{h['caption']!r} ({h['n_images']} images, predicted {h['predicted_label']})"
                            for h in hyps) or "none"
        measured = yield self._turn(
            f"{len(hyps)} caption hypotheses, largest cluster first: {listing}. And {len(explore)} single-attribute "
            "perturbations that screened above the baseline. I measure each on fresh seeds against the baseline; "
            "sequential stopping spends few images on hypotheses that show no effect, and every p-value is adjusted "
            "over the whole family.",
            *[self._call("measure_rate", caption=h["caption"], target_label=h["predicted_label"], max_n=self.max_n)
              for h in hyps],
            *[self._call("measure_rate", caption=c, max_n=self.explore_max_n, first_n=self.explore_first_n)
              for c in explore],
        )
        tested: dict[str, dict[str, Any]] = {}
        targets = [h["predicted_label"] for h in hyps] + [None] * len(explore)
        for c, target, r in zip([h["caption"] for h in hyps] + explore, targets, measured):
            if "error" not in r:
                tested[c] = {**r, "_target": target or _top_confusion(r)}
        supported = _spread([r for r in tested.values() if r["verdict"] == "supported"],
                            lambda r: kinds.get(r["caption"], "caption"), lambda r: str(r["_target"]))
        summary = "; ".join(f"{c!r}: {_ratio(r['rate_ratio'])}, adjusted p={r['adjusted_p']:.2g}"
                            for c, r in tested.items() if r["verdict"] == "supported")
        if not supported:
            yield self._finish(f"Baseline {_pct(s['failures'])}. None of {len(tested)} hypotheses was supported "
                               "after correction for the whole family.")
            return

        findings: list[str] = []
        done: set[frozenset[str]] = set()
        attempts = 0
        yield self._turn(f"{len(supported)} of {len(tested)} hypotheses are supported after correction: {summary}. "
                         f"I refine and confirm at most {self.max_refine}, taking the strongest of each kind "
                         "(caption cluster, background, domain, object, adjective) in turn, and within a kind a new "
                         "wrong label before a second phrasing of one already taken, so that one kind of failure "
                         "does not crowd out the others.")
        for r in supported:
            if attempts == self.max_refine:
                break
            refined = yield from (self._refine(r, tested) if self.refine and _n_sentences(r["caption"]) > 2
                                  else _same(r))
            key = content_key(refined["caption"])  # one hypothesis, however its sentences are joined
            if key in done:
                continue
            done.add(key)
            attempts += 1
            confirmed = yield from self._mechanism_and_confirm(refined, tested)
            if confirmed:
                findings.append(confirmed)
        ruled_out = [c for c, r in tested.items() if r["verdict"] != "supported"]
        text = (f"Baseline for {label}: {_pct(s['failures'])}. "
                + (f"Confirmed findings: {'; '.join(findings)}. " if findings else "No finding was confirmed. ")
                + f"{len(ruled_out)} of {len(tested)} hypotheses were not supported.")
        yield self._finish(text)

    def _unique(self, hyps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        seen: set[str] = set()
        out = []
        for h in hyps:
            key = " ".join(h["caption"].lower().split())
            if key not in seen:
                seen.add(key)
                out.append(h)
        return out

    def _refine(self, r: dict[str, Any], tested: dict[str, dict[str, Any]]) -> Generator[Turn, Results, dict]:
        caption, target = r["caption"], r["_target"]
        (pert,) = yield self._turn(
            f"{caption!r} is supported: {_pct(r['hypothesis']['failures'])} vs baseline {_pct(r['baseline'])}, "
            f"rate ratio {_ratio(r['rate_ratio'])}. I look for the shortest caption that keeps the effect "
            "(each sentence alone, adjectives dropped).",
            self._call("perturb_caption", caption=caption, types=[], refinements=True),
        )
        proposed = [e["caption"] for e in pert.get("refinements", [])]
        candidates = [c for c in proposed if c not in tested]
        if candidates:
            results = yield self._turn(
                f"Measuring {len(candidates)} refinements: " + "; ".join(repr(c) for c in candidates) + ".",
                *[self._call("measure_rate", caption=c, target_label=target, max_n=self.max_n) for c in candidates],
            )
            for c, res in zip(candidates, results):
                if "error" not in res:
                    tested[c] = {**res, "_target": target}
        # Refinements measured earlier (e.g. as single-attribute perturbations) count too.
        family = [tested[c] for c in [caption, *proposed] if c in tested and tested[c]["verdict"] == "supported"]
        # Shortest caption first; among equals, the one whose effect is surely largest.
        return min(family, key=lambda x: (_n_sentences(x["caption"]), len(x["caption"]), -_float(x["rate_ratio"]["low"])))

    def _mechanism_and_confirm(self, r: dict[str, Any], tested: dict[str, dict[str, Any]]
                               ) -> Generator[Turn, Results, str | None]:
        caption, target = r["caption"], r["_target"]
        if not self.counterfactual:
            return (yield from self._confirm(r, None, "no counterfactual test in this procedure"))
        (pert,) = yield self._turn(
            f"Refined hypothesis {caption!r} ({_ratio(r['rate_ratio'])}). To test the mechanism I edit fresh class "
            "images so that only the captioned attribute changes (paired McNemar test), and I measure a LANCE "
            "perturbation of the caption as a control.",
            self._call("perturb_caption", caption=caption, types=["background", "domain", "object"], n=1,
                       refinements=False),
        )
        controls = [e["caption"] for e in pert.get("edits", []) if e["caption"] not in tested][:1]
        results = yield self._turn(
            "Counterfactual edits, and the control " + (repr(controls[0]) if controls else "(none available)") + ".",
            self._call("measure_rate", caption=caption, target_label=target, mode="counterfactual"),
            *[self._call("measure_rate", caption=c, target_label=target, max_n=self.max_n) for c in controls],
        )
        cf = results[0]
        for c, res in zip(controls, results[1:]):
            if "error" not in res:
                tested[c] = {**res, "_target": target}
        cf_text = (f"edits flipped {cf['mcnemar']['b']} images to failure and {cf['mcnemar']['c']} back "
                   f"(McNemar p={cf['mcnemar']['p_value']:.2g})" if "error" not in cf and cf.get("mcnemar")
                   else f"counterfactual unavailable ({cf.get('error', 'no result')})")
        return (yield from self._confirm(r, cf if "error" not in cf else None, cf_text))

    def _confirm(self, r: dict[str, Any], cf: dict[str, Any] | None, cf_text: str
                 ) -> Generator[Turn, Results, str | None]:
        caption, target = r["caption"], r["_target"]
        (conf,) = yield self._turn(
            f"Mechanism: {cf_text}. Now the confirmation: the same caption on fresh seeds, disjoint from every "
            "image used so far.",
            self._call("measure_rate", caption=caption, target_label=target, confirm=True, max_n=self.max_n),
        )
        if "error" in conf or conf["verdict"] != "supported":
            why = conf.get("error") or f"{_pct(conf['hypothesis']['failures'])}, adjusted p={conf['adjusted_p']:.2g}"
            yield self._turn(f"{caption!r} did not replicate on fresh seeds ({why}); it is not recorded.")
            return None
        (rec,) = yield self._turn(
            f"Confirmed: {_pct(conf['hypothesis']['failures'])} vs {_pct(conf['baseline'])} on fresh seeds "
            f"(adjusted p={conf['adjusted_p']:.2g}). Recording the finding.",
            self._call("record_finding", caption=caption, discovery_test=r["test_id"],
                       confirmation_test=conf["test_id"],
                       counterfactual_test=cf["test_id"] if cf is not None else None,
                       summary=f"{caption!r} fails {_pct(conf['hypothesis']['failures'])}, "
                               f"{_ratio(conf['rate_ratio'])} the baseline; {cf_text}."),
        )
        if "error" in rec:
            return None
        return f"{caption!r} ({_ratio(conf['rate_ratio'])}, confirmed)"

    def _finish(self, summary: str) -> Turn:
        return self._turn(summary, self._call("finish", summary=summary))
