"""The protocol-v1 planner (and wiles): Wiles et al.'s procedure, LANCE perturbations, counterfactual confirmation.

baseline -> caption failures, and screen every single-attribute perturbation of the class prompt the generator can
render (a few images each, no test) -> measure each caption hypothesis and the perturbations that screened worst
(sequential tests stop early for futility, so weak hypotheses cost little) -> refine the supported ones to the
shortest caption that keeps the effect -> test the mechanism (counterfactual edits of class images; a LANCE
perturbation of the attribute as a control) -> confirm on fresh seeds -> record -> finish. Deterministic: the same
results give the same turns.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass

from sleuth.agent.events import ToolCall
from sleuth.agent.modes import content_key
from sleuth.agent.planners.screening import screened, select
from sleuth.agent.planners.script import CallFailed, Results, Script, ScriptPlanner, ok
from sleuth.agent.runner import Turn
from sleuth.tools import caption_failures, generate_and_classify, measure_rate, perturb_caption, record_finding
from sleuth.tools.defaults import BASELINE_N
from sleuth.tools.stats import Rate, RatioCI


def pct(rate: Rate) -> str:
    if not rate.n:
        return "0/0"
    return f"{rate.k}/{rate.n} = {100 * rate.rate:.1f}% [{100 * rate.low:.1f}%, {100 * rate.high:.1f}%]"


def ratio_text(r: RatioCI | None) -> str:
    if r is None:
        return "n/a"
    return f"{r.ratio:.3g}x [{r.low:.3g}, {r.high:.3g}]"


@dataclass
class Measured:
    """A hypothesis measured in discovery, with the label it is suspected to be confused with."""

    result: measure_rate.Result
    target: str | None

    @property
    def caption(self) -> str:
        return self.result.caption

    @property
    def low(self) -> float:
        """The lower end of the rate ratio's interval: how surely the effect is large."""
        return self.result.rate_ratio.low if self.result.rate_ratio is not None else 0.0


def top_confusion(r: measure_rate.Result) -> str | None:
    conf = r.hypothesis.confusions if r.hypothesis is not None else []
    return conf[0].label if conf else None


def _round_robin(groups: list[list[Measured]]) -> list[Measured]:
    out: list[Measured] = []
    while any(groups):
        for q in groups:
            if q:
                out.append(q.pop(0))
    return out


def spread(items: list[Measured], kind: Callable[[Measured], str], mode: Callable[[Measured], str]) -> list[Measured]:
    """Round robin over kinds of hypothesis, strongest kind first; within a kind, round robin over its failure modes
    (the wrong label), each in order of its surest effect: a second phrasing of one failure waits for the others."""
    by_kind: dict[str, dict[str, list[Measured]]] = {}
    for m in sorted(items, key=lambda m: -m.low):
        by_kind.setdefault(kind(m), {}).setdefault(mode(m), []).append(m)
    return _round_robin([_round_robin(list(modes.values())) for modes in by_kind.values()])


def n_sentences(caption: str) -> int:
    return len([s for s in caption.split(".") if s.strip()])


def _key(caption: str) -> str:
    return " ".join(caption.lower().split())


def _same(m: Measured) -> Generator[Turn, Results, Measured]:
    """A caption with one attribute sentence is already as short as it gets."""
    return m
    yield  # pragma: no cover - makes this a generator


class ProtocolV1Planner(ScriptPlanner):
    """Deterministic planner that follows the published procedure with adaptive allocation of the image budget."""

    explore_types = ("background", "domain", "object", "adjective")

    def __init__(self, label: str, class_prompt: str, *, baseline_n: int = BASELINE_N, max_hypotheses: int = 6,
                 max_refine: int = 10, max_n: int = 800, explore_n: int = 100, screen_n: int = 30,
                 explore_top: int = 24, explore_max_n: int = 400, explore_first_n: int = 50, explore: bool = True,
                 refine: bool = True, counterfactual: bool = True, budget: int | None = None,
                 screen_share: float = 0.25, name: str = "protocol-v1") -> None:
        """``explore_n``: perturbations per edit type asked of perturb_caption (100: every one the generator can
        render); each is screened on ``screen_n`` images, at most ``screen_share`` of the image ``budget`` in all
        (the rest is for tests), and the ``explore_top`` that fail most (one per failure mode first) are tested,
        with sequential looks from ``explore_first_n`` up to ``explore_max_n`` images."""
        super().__init__(name)
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
        self.budget = budget
        self.counterfactual_n = 100
        self.batch = 8
        """Discovery tests per turn when the budget is tight (checked between turns)."""
        self._confirmed_once = False
        """Class images a counterfactual test edits (each also sham-edited): 100 pairs show a strong mechanism."""
        self.max_screens = None if budget is None else int(budget * screen_share) // screen_n
        self.screen_n = screen_n
        self.explore_top = explore_top
        self.explore_max_n = explore_max_n
        self.explore_first_n = explore_first_n

    def measure(self, caption: str, **arguments: object) -> ToolCall:
        # Tests compare against a baseline of the planner's own size (the tool would top it up to its default).
        return self.call("measure_rate", caption=caption, **arguments, baseline_n=self.baseline_n)

    # -- the procedure ----------------------------------------------------------------------------------

    def script(self) -> Script:
        label, prompt = self.label, self.class_prompt
        (first,) = yield self.turn(
            f"I start with the baseline: how often does the classifier fail on {self.baseline_n} generated images "
            f"of {prompt!r}? Its failures are the material for hypotheses.",
            self.call("generate_and_classify", prompt=prompt, n=self.baseline_n),
        )
        base = ok(first, generate_and_classify.Result)
        if base is None:
            yield self.finish(f"The baseline could not be measured: {first.error}")
            return
        s = base.summary
        confusions = ", ".join(f"{c.label} ({c.count})" for c in s.confusions) or "none"
        failures = s.failures.k > 0
        calls = [self.call("perturb_caption", caption=prompt, types=list(self.explore_types), n=self.explore_n,
                           refinements=False)] if self.explore else []
        if failures:
            calls.insert(0, self.call("caption_failures", measurement_id=base.measurement_id))
        results: Results = []
        if calls:
            results = yield self.turn(
                f"Baseline failure rate {pct(s.failures)}; the classifier's wrong answers: {confusions}. "
                + ("I caption the failed images, clustered by predicted label and appearance, to form hypotheses. "
                   if failures else "There are no failures to caption. ")
                + ("Attributes that are rare among the class's natural images rarely show up among its failures, so I "
                   "also perturb the class prompt one attribute at a time (LANCE: background, domain, co-occurring "
                   "object, adjective) with every phrase of the general vocabulary the generator can render."
                   if self.explore else ""),
                *calls,
            )
        caps = ok(results[0], caption_failures.Result) if failures else None
        pert = ok(results[-1], perturb_caption.Result) if self.explore else None
        hyps = self._unique(caps.hypotheses if caps else [])[: self.max_hypotheses]
        kinds = {e.caption: e.type for e in (pert.edits if pert else [])}
        seen = {content_key(h.caption) for h in hyps}
        proposed = [c for c in kinds if content_key(c) not in seen]
        candidates = proposed[: self.max_screens]
        capped = (f" The budget pays for screening {len(candidates)} of them (a quarter of it; the rest is for tests)."
                  if len(candidates) < len(proposed) else "")
        explore: list[str] = []
        if candidates:
            screens = yield self.turn(
                f"perturb_caption proposes {len(proposed)} single-attribute perturbations the generator can render "
                f"(and left out {len(pert.not_rendered) if pert else 0} it cannot). Testing them all would spend the "
                f"budget and enlarge the family every p-value is corrected over, so I first screen each on "
                f"{self.screen_n} images: a look, not a test.{capped} Then I test on fresh seeds the "
                f"{self.explore_top} that fail most often, taking the strongest of each kind of failure (edit type, "
                "wrong label) first.",
                *[self.call("generate_and_classify", prompt=c, n=self.screen_n) for c in candidates],
            )
            looks = [x for c, r in zip(candidates, screens) if (x := screened(c, kinds[c], r)) is not None]
            explore = [x.caption for x in select(looks, s.failures.rate, self.explore_top)]
        if not hyps and not explore:
            yield self.finish(f"Baseline {pct(s.failures)}; no caption cluster and no perturbation that screened "
                              "above the baseline to test.")
            return
        listing = "; ".join(f"{h.caption!r} ({h.n_images} images, predicted {h.predicted_label})"
                            for h in hyps) or "none"
        hyp_n, explore_n, kept = self._discovery_sizes(len(hyps), len(explore))
        planned = [(h.caption, hyp_n, self.measure(h.caption, target_label=h.predicted_label, max_n=hyp_n,
                                                   first_n=min(100, hyp_n))) for h in hyps]
        planned += [(c, explore_n, self.measure(c, max_n=explore_n, first_n=min(self.explore_first_n, explore_n)))
                    for c in explore]
        intro = (f"{len(hyps)} caption hypotheses, largest cluster first: {listing}. And {len(explore)} "
                 "single-attribute perturbations that screened above the baseline. I measure each on fresh seeds "
                 "against the baseline; sequential stopping spends few images on hypotheses that show no effect, and "
                 "every p-value is adjusted over the whole family."
                 + (f" I keep {kept} images for refining, testing the mechanism and confirming, so each test here "
                    f"stops at {hyp_n} (caption hypotheses) or {explore_n} (perturbations) images, and I measure in "
                    "batches, strongest first, while the images outside that reserve pay for a batch's worst case."
                    if kept else ""))
        measured: Results = []
        while len(measured) < len(planned):
            batch = planned[len(measured):] if not kept else []
            if kept:
                room = (self.images_left() or 0) - kept
                for item in planned[len(measured):len(measured) + self.batch]:
                    if room < item[1]:
                        break
                    batch.append(item)
                    room -= item[1]
                if not batch:
                    measured += [CallFailed("not measured: the images left are kept for confirmation")] * (
                        len(planned) - len(measured))
                    break
            measured += (yield self.turn(intro if not measured else
                                         f"Next {len(batch)} hypotheses ({len(measured)} of {len(planned)} measured).",
                                         *[call for _, _, call in batch]))
        tested: dict[str, Measured] = {}
        targets: list[str | None] = [h.predicted_label for h in hyps] + [None] * len(explore)
        for c, target, r in zip([h.caption for h in hyps] + explore, targets, measured):
            got = ok(r, measure_rate.Result)
            if got is not None:
                tested[c] = Measured(got, target or top_confusion(got))
        supported = spread([m for m in tested.values() if m.result.verdict == "supported"],
                           lambda m: kinds.get(m.caption, "caption"), lambda m: str(m.target))
        summary = "; ".join(f"{c!r}: {ratio_text(m.result.rate_ratio)}, adjusted p={m.result.adjusted_p:.2g}"
                            for c, m in tested.items() if m.result.verdict == "supported")
        if not supported:
            yield self.finish(f"Baseline {pct(s.failures)}. None of {len(tested)} hypotheses was supported "
                              "after correction for the whole family.")
            return

        findings: list[str] = []
        stopped = ""
        done: set[frozenset[str]] = set()
        attempts = 0
        yield self.turn(f"{len(supported)} of {len(tested)} hypotheses are supported after correction: {summary}. "
                        f"I refine and confirm at most {self.max_refine}, taking the strongest of each kind "
                        "(caption cluster, background, domain, object, adjective) in turn, and within a kind a new "
                        "wrong label before a second phrasing of one already taken, so that one kind of failure "
                        "does not crowd out the others.")
        for m in supported:
            if attempts == self.max_refine:
                break
            if not self._can_confirm():
                stopped = " The images left cannot pay for another confirmation, so I stop here."
                break
            refined = yield from (self._refine(m, tested) if self.refine and n_sentences(m.caption) > 2
                                  and self._affords(2 * self.max_n) else _same(m))
            key = content_key(refined.caption)  # one hypothesis, however its sentences are joined
            if key in done:
                continue
            done.add(key)
            attempts += 1
            confirmed = yield from self._mechanism_and_confirm(refined, tested)
            if confirmed:
                findings.append(confirmed)
        ruled_out = [c for c, m in tested.items() if m.result.verdict != "supported"]
        text = (f"Baseline for {label}: {pct(s.failures)}. "
                + (f"Confirmed findings: {'; '.join(findings)}. " if findings else "No finding was confirmed. ")
                + f"{len(ruled_out)} of {len(tested)} hypotheses were not supported." + stopped)
        yield self.finish(text)

    def _per_confirmation(self) -> int:
        """Images one refined hypothesis may take after discovery: its confirmation (up to ``max_n``) and, with
        counterfactuals, ``counterfactual_n`` class images edited and sham-edited."""
        return self.max_n + (self.counterfactual_n * 3 if self.counterfactual else 0)

    def _can_confirm(self) -> bool:
        """Whether the images left pay for a confirmation's first look (and its baseline, once)."""
        left = self.images_left()
        if left is None or self.budget is None:
            return True
        return left >= 100 + (0 if self._confirmed_once else self.baseline_n)

    def _affords(self, extra: int) -> bool:
        """Whether the images left pay for ``extra`` and still for a confirmation (and its baseline, once)."""
        left = self.images_left()
        if left is None or self.budget is None:
            return True
        return left >= extra + self.max_n + (0 if self._confirmed_once else self.baseline_n)

    def _discovery_sizes(self, n_hyps: int, n_explore: int) -> tuple[int, int, int]:
        """Most images per discovery test (caption hypotheses, perturbations) and the images kept back for what
        follows: discovery may not eat the budget the confirmations need. Without a known budget, the defaults."""
        left = self.images_left()
        if left is None or self.budget is None or not n_hyps + n_explore:
            return self.max_n, self.explore_max_n, 0
        keep = min(self.baseline_n + self.max_refine * self._per_confirmation(), left // 3)
        allowance = left - keep
        # Sequential tests stop early for futility on most hypotheses: they use about 60% of their maximum.
        expected = 0.6 * (n_hyps * self.max_n + n_explore * self.explore_max_n)
        if expected <= allowance:
            return self.max_n, self.explore_max_n, keep
        scale = allowance / expected
        return (max(50, int(self.max_n * scale) // 10 * 10), max(30, int(self.explore_max_n * scale) // 10 * 10),
                keep)

    def _unique(self, hyps: list[caption_failures.Hypothesis]) -> list[caption_failures.Hypothesis]:
        seen: set[str] = set()
        out = []
        for h in hyps:
            if _key(h.caption) not in seen:
                seen.add(_key(h.caption))
                out.append(h)
        return out

    def _refine(self, m: Measured, tested: dict[str, Measured]) -> Generator[Turn, Results, Measured]:
        r, target = m.result, m.target
        assert r.hypothesis is not None
        (first,) = yield self.turn(
            f"{r.caption!r} is supported: {pct(r.hypothesis.failures)} vs baseline {pct(r.baseline)}, "
            f"rate ratio {ratio_text(r.rate_ratio)}. I look for the shortest caption that keeps the effect "
            "(each sentence alone, adjectives dropped).",
            self.call("perturb_caption", caption=r.caption, types=[], refinements=True),
        )
        pert = ok(first, perturb_caption.Result)
        proposed = [e.caption for e in pert.refinements] if pert else []
        candidates = [c for c in proposed if c not in tested]
        if candidates:
            results = yield self.turn(
                f"Measuring {len(candidates)} refinements: " + "; ".join(repr(c) for c in candidates) + ".",
                *[self.measure(c, target_label=target, max_n=self.max_n) for c in candidates],
            )
            for c, res in zip(candidates, results):
                if (got := ok(res, measure_rate.Result)) is not None:
                    tested[c] = Measured(got, target)
        # Refinements measured earlier (e.g. as single-attribute perturbations) count too.
        family = [tested[c] for c in [r.caption, *proposed] if c in tested and tested[c].result.verdict == "supported"]
        # Shortest caption first; among equals, the one whose effect is surely largest.
        return min(family, key=lambda x: (n_sentences(x.caption), len(x.caption), -x.low))

    def _mechanism_and_confirm(self, m: Measured, tested: dict[str, Measured]) -> Generator[Turn, Results, str | None]:
        caption, target = m.caption, m.target
        if not self.counterfactual:
            return (yield from self._confirm(m, None, "no counterfactual test in this procedure"))
        if not self._affords(3 * self.counterfactual_n + self.explore_max_n):
            return (yield from self._confirm(m, None, "no counterfactual test: the images left are kept for the "
                                                      "confirmation"))
        (first,) = yield self.turn(
            f"Refined hypothesis {caption!r} ({ratio_text(m.result.rate_ratio)}). To test the mechanism I edit fresh "
            "class images so that only the captioned attribute changes (paired McNemar test), and I measure a LANCE "
            "perturbation of the caption as a control.",
            self.call("perturb_caption", caption=caption, types=["background", "domain", "object"], n=1,
                      refinements=False),
        )
        pert = ok(first, perturb_caption.Result)
        controls = [e.caption for e in (pert.edits if pert else []) if e.caption not in tested][:1]
        results = yield self.turn(
            "Counterfactual edits, and the control " + (repr(controls[0]) if controls else "(none available)") + ".",
            self.measure(caption, target_label=target, mode="counterfactual", max_n=self.counterfactual_n),
            *[self.measure(c, target_label=target, max_n=self.max_n) for c in controls],
        )
        cf = ok(results[0], measure_rate.Result)
        for c, res in zip(controls, results[1:]):
            if (got := ok(res, measure_rate.Result)) is not None:
                tested[c] = Measured(got, target)
        if cf is not None and cf.mcnemar is not None:
            cf_text = (f"edits flipped {cf.mcnemar.b} images to failure and {cf.mcnemar.c} back "
                       f"(McNemar p={cf.mcnemar.p_value:.2g})")
        else:
            why = results[0].error if isinstance(results[0], CallFailed) else "no result"
            cf_text = f"counterfactual unavailable ({why})"
        return (yield from self._confirm(m, cf, cf_text))

    def _confirm(self, m: Measured, cf: measure_rate.Result | None, cf_text: str
                 ) -> Generator[Turn, Results, str | None]:
        caption, target = m.caption, m.target
        (first,) = yield self.turn(
            f"Mechanism: {cf_text}. Now the confirmation: the same caption on fresh seeds, disjoint from every "
            "image used so far.",
            self.measure(caption, target_label=target, confirm=True, max_n=self.max_n),
        )
        self._confirmed_once = True
        conf = ok(first, measure_rate.Result)
        if conf is None or conf.verdict != "supported":
            why = first.error if conf is None else (
                f"{pct(conf.hypothesis.failures) if conf.hypothesis else 'n/a'}, adjusted p={conf.adjusted_p:.2g}")
            yield self.turn(f"{caption!r} did not replicate on fresh seeds ({why}); it is not recorded.")
            return None
        assert conf.hypothesis is not None
        (rec,) = yield self.turn(
            f"Confirmed: {pct(conf.hypothesis.failures)} vs {pct(conf.baseline)} on fresh seeds "
            f"(adjusted p={conf.adjusted_p:.2g}). Recording the finding.",
            self.call("record_finding", caption=caption, discovery_test=m.result.test_id,
                      confirmation_test=conf.test_id, counterfactual_test=cf.test_id if cf is not None else None,
                      summary=f"{caption!r} fails {pct(conf.hypothesis.failures)}, "
                              f"{ratio_text(conf.rate_ratio)} the baseline; {cf_text}."),
        )
        if ok(rec, record_finding.Result) is None:
            return None
        return f"{caption!r} ({ratio_text(conf.rate_ratio)}, confirmed)"
