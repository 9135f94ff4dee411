"""The protocol-v2 planner: screen everything cheaply, test what the screen singles out, confirm at once, stop early.

Images are the cost that matters on real models, so this planner spends them where they pay:

- **A small baseline** (300 images by default): strong failures show against it; weak ones would need more images
  than an investigation should spend on one class.
- **Candidates**: the captions of clustered failures, each of their sentences alone, and every single-attribute
  perturbation of the class prompt (general vocabulary) the generator can render.
- **Screening on a ladder.** Every candidate gets 3 images. After each look its failure rate has a posterior (a
  Beta prior with the weight of two images, centred on the baseline rate); a candidate is *plausible* while its
  posterior probability of failing at least 3x as often as the class, and 5 points more, is 20% or more. Plausible
  candidates climb the ladder (12, then 32 images); the others are dropped. Screens are looks, not tests: they only
  choose what to test, and tests run on fresh seeds.
- **Tests** for candidates the screen makes likely (posterior 90%, or 60% at the top of the ladder): measure_rate
  with sequential looks from 30 images, so strong effects stop at the first look. Tests go in turn over the kinds of
  candidate (caption, background, domain, object, adjective) and the failure modes (wrong labels) within a kind,
  surest first, shortest caption first within a mode.
- **Confirmation at once** when a test is supported (fresh confirmation seeds and baseline), then a counterfactual
  test of the mechanism on 20 class images (each edited against its control-edited twin), then the record. While the
  screen is still running, one finding per kind is confirmed, so that the first confirmation comes a few hundred
  images after its screen and a strong background cannot crowd out a co-occurring object; the rest wait for the
  whole screen.
- **Distinct findings**: at most two per failure mode and three per kind, and none whose caption holds every content
  word of a finding and more. Other supported phrasings are listed, not confirmed again.
- **An investigation-level stop**: when no candidate is left that is plausible by the rule above, when the declared
  confirmation attempts are spent, or when the images left cannot pay for a confirmation; the answer says which.

The tools keep the statistics' guarantees whatever a planner does; this one only decides where images go.
Deterministic: the same results give the same turns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass, field

from scipy import stats as sps

from sleuth.agent.events import ToolCall
from sleuth.agent.modes import content_key
from sleuth.agent.planners.protocol_v1 import pct, ratio_text, top_confusion
from sleuth.agent.planners.script import Results, Script, ScriptPlanner, ok
from sleuth.agent.runner import Turn
from sleuth.tools import caption_failures, generate_and_classify, measure_rate, perturb_caption, record_finding
from sleuth.tools.defaults import MAX_CONFIRMATIONS

LADDER = (3, 12, 32)
"""Screening images a candidate has after each rung of the ladder."""
PRIOR_WEIGHT = 2.0
"""Weight (in images) of the Beta prior on a candidate's failure rate, centred on the baseline rate."""
MIN_RATIO = 3.0
MIN_GAIN = 0.05
"""A failure worth confirming: at least MIN_RATIO x the baseline rate and MIN_GAIN above it."""
DROP_BELOW = 0.2
TEST_AT = 0.9
TEST_AT_TOP = 0.6
"""Posterior probability of a failure worth confirming: below DROP_BELOW a candidate is dropped; at TEST_AT (or
TEST_AT_TOP at the top of the ladder) it is tested on fresh seeds."""


def worth(p0: float) -> float:
    """The failure rate a candidate must plausibly reach, given the baseline rate ``p0``."""
    return min(max(MIN_RATIO * p0, p0 + MIN_GAIN), (1 + p0) / 2)


def score(k: int, n: int, p0: float) -> float:
    """How surely a candidate fails often: the 20% quantile of its posterior failure rate (tests go surest first)."""
    return float(sps.beta.ppf(0.2, k + PRIOR_WEIGHT * p0, n - k + PRIOR_WEIGHT * (1 - p0)))


def sentences(caption: str) -> int:
    return len([x for x in caption.split(".") if x.strip()])


Mode = tuple[str, str | None]


def _round_robin(queues: list[list[Candidate]]) -> list[Candidate]:
    out: list[Candidate] = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def by_kind(cands: list[Candidate], p0: float, kinds: Counter[str] | None = None,
            modes: Counter[Mode] | None = None) -> list[Candidate]:
    """Test order: round robin over kinds of candidate (caption, background, domain, object, adjective), kinds with
    fewer confirmed findings first and among them the kind with the surest candidate; within a kind, round robin
    over its failure modes (the wrong label) the same way; within a mode the shortest caption first (the fewest
    attributes that carry the failure), then the surest. Equally sure candidates (a screen at its ceiling, 12/12, is
    common) go in order of ``mode_share``: failures that keep to one wrong label come before scattered ones."""
    kinds, modes = kinds or Counter(), modes or Counter()
    tree: dict[str, dict[str | None, list[Candidate]]] = {}
    for c in sorted(cands, key=lambda c: (-score(c.k, c.n, p0), -c.mode_share)):
        tree.setdefault(c.kind, {}).setdefault(c.confusion, []).append(c)
    per_kind = []
    for kind, by_label in sorted(tree.items(), key=lambda kv: kinds[kv[0]]):  # stable: surest first among equals
        ordered = sorted(by_label.items(), key=lambda kv: modes[(kind, kv[0])])
        per_kind.append(_round_robin([sorted(q, key=lambda c: (sentences(c.caption), -score(c.k, c.n, p0),
                                                               -c.mode_share))
                                      for _, q in ordered]))
    return _round_robin(per_kind)


def plausibility(k: int, n: int, p0: float) -> float:
    """Posterior probability that a candidate with ``k`` failures in ``n`` screening images fails at least at
    ``worth(p0)``, under a Beta prior of weight PRIOR_WEIGHT centred on the baseline rate."""
    a = k + PRIOR_WEIGHT * p0
    b = n - k + PRIOR_WEIGHT * (1 - p0)
    return float(sps.beta.sf(worth(p0), a, b))


@dataclass
class Candidate:
    caption: str
    kind: str
    """'caption' (a cluster of failures or one of its sentences) or the perturbation's edit type."""
    target: str | None = None
    k: int = 0
    n: int = 0
    confusions: Counter[str] = field(default_factory=Counter)
    state: str = "new"
    """new -> open (climbing the ladder) -> test | dropped; test -> tested."""

    @property
    def confusion(self) -> str | None:
        if self.target:
            return self.target
        return self.confusions.most_common(1)[0][0] if self.confusions else None

    @property
    def mode_share(self) -> float:
        """Share of the screen's images that failed as its failure mode (the wrong label it is tested against)."""
        mode = self.confusion
        return self.confusions[mode] / self.n if mode is not None and self.n else 0.0

    def rung(self) -> int:
        """Index of the next rung of the ladder (len(LADDER) at the top)."""
        return sum(self.n >= r for r in LADDER)


NAMED = 5
"""Untested candidates a run's summary names (surest first); the rest are counted."""


def _named(cands: list[Candidate], p0: float) -> str:
    """`` ('a' 12/12, 'b' 11/12, and 3 more)``: the surest of ``cands`` with their screens."""
    best = sorted(cands, key=lambda c: (-score(c.k, c.n, p0), c.caption))
    names = ", ".join(f"{c.caption!r} {c.k}/{c.n}" for c in best[:NAMED])
    more = f", and {len(best) - NAMED} more" if len(best) > NAMED else ""
    return f" ({names}{more})"


@dataclass
class Supported:
    candidate: Candidate
    result: measure_rate.Result

    @property
    def low(self) -> float:
        r = self.result.rate_ratio
        return r.low if r is not None else 0.0

    @property
    def mode(self) -> tuple[str, str | None]:
        return (self.candidate.kind, self.candidate.confusion or top_confusion(self.result))


class ProtocolV2Planner(ScriptPlanner):
    """Screen every candidate on a ladder, test what the screen singles out, confirm at once, stop when nothing
    plausible is left."""

    explore_types = ("background", "domain", "object", "adjective")

    def __init__(self, label: str, class_prompt: str, *, baseline_n: int | None = None, budget: int | None = None,
                 max_hypotheses: int = 4, test_batch: int = 2, first_n: int = 30,
                 max_n: int = 300, counterfactual_n: int = 20, per_mode: int = 2, per_kind: int = 3,
                 name: str = "protocol-v2") -> None:
        super().__init__(name)
        self.label = label
        self.class_prompt = class_prompt
        self.baseline_n = baseline_n or 300
        self.budget = budget
        self.max_hypotheses = max_hypotheses
        self.test_batch = test_batch
        self.first_n = first_n
        self.max_n = max_n
        self.counterfactual_n = counterfactual_n
        self.per_mode = per_mode
        self.per_kind = per_kind
        self._attempts = 0
        self._confirmed_once = False

    # -- budget ------------------------------------------------------------------------------------------

    def _left(self) -> int | None:
        return self.images_left() if self.budget is not None else None

    def _confirm_cost(self) -> int:
        """Images a confirmation's first look takes (and its baseline, the first time)."""
        return self.first_n + (0 if self._confirmed_once else self.baseline_n)

    def _affords(self, extra: int) -> bool:
        """Whether the images left pay for ``extra`` and still for a confirmation's first look."""
        left = self._left()
        return left is None or left >= extra + self._confirm_cost()

    def measure(self, caption: str, target: str | None, **arguments: object) -> ToolCall:
        return self.call("measure_rate", caption=caption, target_label=target, baseline_n=self.baseline_n,
                         **arguments)

    # -- the procedure -------------------------------------------------------------------------------------

    def script(self) -> Script:
        prompt = self.class_prompt
        (first,) = yield self.turn(
            f"I start with a baseline of {self.baseline_n} images of {prompt!r}: its failures are the material for "
            "hypotheses and its rate the yardstick. Images are the cost, so I keep it small; strong failures show "
            "against it.",
            self.call("generate_and_classify", prompt=prompt, n=self.baseline_n),
        )
        base = ok(first, generate_and_classify.Result)
        if base is None:
            yield self.finish(f"The baseline could not be measured: {first.error}")
            return
        s = base.summary
        p0 = (s.failures.k + 0.5) / (s.failures.n + 1)
        calls = [self.call("perturb_caption", caption=prompt, types=list(self.explore_types), n=100,
                           refinements=False)]
        if s.failures.k:
            calls.insert(0, self.call("caption_failures", measurement_id=base.measurement_id))
        results = yield self.turn(
            f"Baseline failure rate {pct(s.failures)}. "
            + ("I caption the failed images (clustered by wrong label and appearance) " if s.failures.k else "")
            + "and perturb the class prompt one attribute at a time with the general vocabulary: every candidate "
              "gets a cheap screen before any is tested.",
            *calls,
        )
        caps = ok(results[0], caption_failures.Result) if s.failures.k else None
        pert = ok(results[-1], perturb_caption.Result)
        hyps = []
        seen_h: set[frozenset[str]] = set()
        for h in caps.hypotheses if caps else []:
            if content_key(h.caption) not in seen_h:
                seen_h.add(content_key(h.caption))
                hyps.append(h)
        hyps = hyps[: self.max_hypotheses]
        long = [h for h in hyps if sentences(h.caption) > 2]
        parts: Results = []
        if long:
            parts = yield self.turn(
                "A failure cluster's caption mixes several attributes; each sentence alone is a candidate too, so the "
                "screen can tell which of them carries the failures.",
                *[self.call("perturb_caption", caption=h.caption, types=[], refinements=True) for h in long],
            )
        cands: list[Candidate] = []
        keys: set[frozenset[str]] = {content_key(prompt)}

        def add(caption: str, kind: str, target: str | None) -> None:
            key = content_key(caption)
            if key not in keys:
                keys.add(key)
                cands.append(Candidate(caption, kind, target))

        refined = {h.caption: ok(r, perturb_caption.Result) for h, r in zip(long, parts)}
        for h in hyps:
            add(h.caption, "caption", h.predicted_label)
            got = refined.get(h.caption)
            for e in got.refinements if got else []:
                if e.type == "single_sentence":
                    add(e.caption, "caption", h.predicted_label)
        for e in pert.edits if pert else []:
            add(e.caption, e.type, None)
        if not cands:
            yield self.finish(f"Baseline {pct(s.failures)}; no caption cluster and no perturbation to screen.")
            return
        target_rate = worth(p0)

        supported: list[Supported] = []
        findings: list[Supported] = []
        modes: Counter[Mode] = Counter()
        kinds: Counter[str] = Counter()
        repeats: list[Supported] = []
        skipped: list[Candidate] = []
        screened_images = 0
        stop = ""
        intro = (f"{len(cands)} candidates. I screen each on {LADDER[0]} images first. A candidate stays in play while "
                 f"the screen leaves at least a {DROP_BELOW:.0%} chance that "
                 f"it fails at {100 * target_rate:.0f}% or more ({MIN_RATIO:g}x the baseline and "
                 f"{100 * MIN_GAIN:.0f} points above it: a failure worth confirming); those climb to "
                 f"{', '.join(map(str, LADDER[1:]))} images; the likely ones are then tested on fresh seeds, surest "
                 "first.")
        # Rounds: test (and confirm) what the screen has singled out, then screen one more rung (every new candidate
        # first, then the plausible ones one rung up), until nothing is left to screen or test. While the screen is
        # still running, one finding per edit type: the surest failure of each kind is confirmed at once, and the
        # kinds a shortcut could hide behind (a strong background crowding out a co-occurring object) wait for the
        # whole screen.
        announced = False
        held: list[Supported] = []
        while not stop:
            screening = any(c.state in ("new", "open") for c in cands)

            def eligible(c: Candidate, screening: bool = screening) -> bool:
                return kinds[c.kind] < (1 if screening else self.per_kind)

            def repeat(c: Candidate) -> bool:
                """A failure mode confirmed per_mode times, or a caption that holds every content word of a finding
                and more: that failure again."""
                return modes[(c.kind, c.confusion)] >= self.per_mode or kinds[c.kind] >= self.per_kind or any(
                    content_key(f.candidate.caption) <= content_key(c.caption) for f in findings)

            # Supported tests held back while the screen ran come first, in test order.
            for sup in [h for h in held if eligible(h.candidate)]:
                held.remove(sup)
                if repeat(sup.candidate):
                    repeats.append(sup)
                    continue
                stop = self._cannot_confirm()
                if stop:
                    break
                if (yield from self._confirm(sup)):
                    findings.append(sup)
                    modes[sup.mode] += 1
                    kinds[sup.candidate.kind] += 1
            if stop:
                break
            queue = by_kind([c for c in cands if c.state == "test"], p0, kinds, modes)
            if queue and not announced:
                announced = True
                yield self.turn(
                    f"The screen singles out {len(queue)} candidates so far: "
                    + "; ".join(f"{c.caption!r} {c.k}/{c.n}" for c in queue[:12])
                    + ("; ..." if len(queue) > 12 else "")
                    + ". I test them on fresh seeds, surest first, in turn over the kinds of edit and the failure "
                      "modes within a kind, and confirm each supported one at once: while the screen runs, one per "
                      "kind.")
            while queue and not stop:
                for c in queue:
                    if repeat(c):
                        c.state = "skipped"
                        skipped.append(c)
                queue = [c for c in queue if c.state == "test" and eligible(c)]
                if not queue:
                    break
                stop = self._cannot_confirm()
                if stop:
                    break
                # One candidate per failure mode in a batch: if it is confirmed, the others of its mode need no test.
                batch: list[Candidate] = []
                for c in queue:
                    if len(batch) == self.test_batch or not self._affords(self.first_n * (len(batch) + 1)):
                        break
                    if all((c.kind, c.confusion) != (b.kind, b.confusion) for b in batch):
                        batch.append(c)
                if not batch:
                    stop = "The images left cannot pay for another test and a confirmation."
                    break
                queue = [c for c in queue if c not in batch]
                for c in batch:
                    c.state = "tested"
                out = yield self.turn(
                    "Testing on fresh seeds: "
                    + "; ".join(f"{c.caption!r} ({c.k}/{c.n} in the screen)" for c in batch) + ".",
                    *[self.measure(c.caption, c.confusion, max_n=self._test_n(), first_n=self.first_n)
                      for c in batch],
                )
                new = [Supported(c, r) for c, res in zip(batch, out)
                       if (r := ok(res, measure_rate.Result)) is not None and r.verdict == "supported"]
                supported += new
                for sup in sorted(new, key=lambda x: -x.low):
                    if repeat(sup.candidate):
                        repeats.append(sup)
                        continue
                    if not eligible(sup.candidate):
                        held.append(sup)
                        continue
                    stop = self._cannot_confirm()
                    if stop:
                        break
                    if (yield from self._confirm(sup)):
                        findings.append(sup)
                        modes[sup.mode] += 1
                        kinds[sup.candidate.kind] += 1
                # The order may change with what was confirmed.
                queue = by_kind(queue, p0, kinds, modes)
            if stop:
                break
            fresh = [c for c in cands if c.state == "new"]
            climbing = [c for c in cands if c.state == "open"]
            plan = [(c, LADDER[0]) for c in fresh] if fresh else [(c, LADDER[c.rung()] - c.n) for c in climbing]
            if not plan:
                break
            left = self._left()
            if left is not None:
                room = left - self._confirm_cost() - 2 * self.first_n
                fitted = []
                for c, more in plan:
                    if more <= room:
                        fitted.append((c, more))
                        room -= more
                if not fitted:
                    stop = "The images left cannot pay for more screening and still for a test and a confirmation."
                    break
                plan = fitted
            looks = yield self.turn(
                (intro + " " if not screened_images else "")
                + f"Screening {len(plan)} candidates ({sum(m for _, m in plan)} images), "
                + ("new." if fresh else "one rung up the ladder."),
                *[self.call("generate_and_classify", prompt=c.caption, n=more) for c, more in plan],
            )
            for (c, more), res in zip(plan, looks):
                look = ok(res, generate_and_classify.Result)
                if look is None:
                    c.state = "dropped"
                    continue
                screened_images += more
                c.k += look.summary.failures.k
                c.n += look.summary.failures.n
                c.confusions.update({x.label: x.count for x in look.summary.confusions})
                if look.summary.unrendered:
                    c.state = "dropped"  # not really this caption: nothing to test
                    continue
                p = plausibility(c.k, c.n, p0)
                top = c.rung() >= len(LADDER)
                if p >= TEST_AT or (top and p >= TEST_AT_TOP):
                    c.state = "test"
                elif p < DROP_BELOW or top:
                    c.state = "dropped"
                else:
                    c.state = "open"
        if not stop:
            stop = (f"No candidate is left that plausibly fails at {100 * target_rate:.0f}% or more (each one "
                    f"screened and not tested has under a {DROP_BELOW:.0%} chance), and none is proposed.")

        findings.sort(key=lambda x: -x.low)
        counts = Counter(c.state for c in cands)
        untested = [c for c in cands if c.state == "test"]
        text = (f"Baseline for {self.label}: {pct(s.failures)}. {len(cands)} candidates screened on "
                f"{screened_images} images; {counts['tested']} tested, {len(supported)} supported. "
                + (("Confirmed findings, surest effect first: "
                    + "; ".join(f"{f.candidate.caption!r} ({ratio_text(f.result.rate_ratio)} in discovery)"
                                for f in findings) + ". ") if findings else "No finding was confirmed. ")
                + (("Supported but not confirmed again, the failure mode of a finding already confirmed: "
                    + "; ".join(repr(r.candidate.caption) for r in repeats) + ". ") if repeats else "")
                + (f"Not tested, as their screens fail the way a confirmed finding does: {len(skipped)}"
                   + _named(skipped, p0) + ". " if skipped else "")
                + (f"Singled out by the screen but not tested before the stop: {len(untested)}"
                   + _named(untested, p0) + ". " if untested else "")
                + f"Stopped: {stop}")
        yield self.finish(text)

    def _cannot_confirm(self) -> str:
        """Why no further confirmation can be made, or ''."""
        if self._attempts >= MAX_CONFIRMATIONS:
            return (f"The investigation's {MAX_CONFIRMATIONS} confirmation attempts are spent (each is tested at "
                    f"alpha/{MAX_CONFIRMATIONS}).")
        if not self._affords(0):
            return "The images left cannot pay for another confirmation."
        return ""

    def _test_n(self) -> int:
        """Most images for a discovery test: the default unless the images left are short."""
        left = self._left()
        if left is None:
            return self.max_n
        return max(self.first_n, min(self.max_n, (left - self._confirm_cost()) // 2))

    def _confirm(self, sup: Supported) -> Generator[Turn, Results, bool]:
        c, r = sup.candidate, sup.result
        target = c.confusion or top_confusion(r)
        (first,) = yield self.turn(
            f"{c.caption!r} is supported in discovery: {pct(r.hypothesis.failures) if r.hypothesis else 'n/a'} vs "
            f"{pct(r.baseline)}, {ratio_text(r.rate_ratio)}, adjusted p={r.adjusted_p:.2g}. I confirm it now, on "
            "fresh seeds disjoint from every image so far.",
            self.measure(c.caption, target, confirm=True, max_n=self.max_n, first_n=self.first_n),
        )
        self._confirmed_once = True
        self._attempts += 1
        conf = ok(first, measure_rate.Result)
        if conf is None or conf.verdict != "supported" or conf.hypothesis is None:
            why = first.error if conf is None else f"adjusted p={conf.adjusted_p:.2g}"
            yield self.turn(f"{c.caption!r} did not replicate on fresh seeds ({why}); it is not recorded.")
            return False
        cf: measure_rate.Result | None = None
        cf_text = "no counterfactual test: the images left are kept for confirmations"
        if self._affords(3 * self.counterfactual_n):
            (got,) = yield self.turn(
                f"Confirmed: {pct(conf.hypothesis.failures)} vs {pct(conf.baseline)} (adjusted p="
                f"{conf.adjusted_p:.2g}). Before recording, the mechanism: {self.counterfactual_n} class images "
                "edited to the caption, each against its control-edited twin (exact McNemar).",
                self.measure(c.caption, target, mode="counterfactual", max_n=self.counterfactual_n),
            )
            cf = ok(got, measure_rate.Result)
            cf_text = (f"edits flipped {cf.mcnemar.b} images to failure and {cf.mcnemar.c} back (McNemar "
                       f"p={cf.mcnemar.p_value:.2g})" if cf is not None and cf.mcnemar is not None
                       else "counterfactual unavailable")
        (rec,) = yield self.turn(
            f"Recording {c.caption!r}.",
            self.call("record_finding", caption=c.caption, discovery_test=r.test_id, confirmation_test=conf.test_id,
                      counterfactual_test=cf.test_id if cf is not None else None,
                      summary=f"{c.caption!r} fails {pct(conf.hypothesis.failures)}, {ratio_text(conf.rate_ratio)} "
                              f"the baseline on fresh seeds; {cf_text}."),
        )
        return ok(rec, record_finding.Result) is not None
