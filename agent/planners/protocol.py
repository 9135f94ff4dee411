"""The protocol planner: an anytime search that spends the budget it is given, strong effects first.

Images are the cost that matters, so the search goes in passes, each aiming at a smaller effect than the last, and
stops only when the images left cannot pay for the next step:

- **Candidates**: the captions of clustered baseline failures, each of their sentences alone, and every
  single-attribute perturbation of the class prompt (general vocabulary) the generator can render.
- **Passes** (``PASSES``): a failure worth confirming is at least 3x the class's failure rate (and 5 points above
  it), then 2x (2 points), then 1.5x (1 point). Each pass's tests top the class baseline up so that its smaller
  target can show, and the class rate the screen compares with is updated from it; each pass screens on a ladder
  of looks, and tests and confirms what the screen singles out. A candidate's screening images are pooled over
  passes: what one pass dropped after a 3-image look, the next looks at again with more.
- **Screening** (looks, not tests; tests run on fresh seeds): after each look a candidate's failure rate has a
  posterior (a Beta prior with the weight of two images, centred on the baseline rate). It is tested when the
  posterior probability that it fails at the pass's target is 90% (60% at the top of the ladder), climbs the
  ladder while that probability is 20% or more, and is dropped for the pass below that, but never before the
  pass's floor of images, nor, in later passes, while its screen would be a likely one of a failure at the target
  (``Target.drop_evidence``). New candidates get their first look in chunks, in turn over the kinds of candidate, so
  the first tests come a few hundred images in.
- **Tests and confirmation**: the surest candidate first (``ladder.evidence``: the posterior probability that it
  fails at the pass's target, then its posterior mean rate); a supported test (or, in later passes, one whose
  unadjusted p-value would pass a confirmation) is confirmed at once on fresh seeds, its mechanism tested on class
  images edited against their control-edited twins, and recorded.
- **Distinct failure modes before phrasings** (agent/modes.py): before a candidate is tested or screened further,
  the failures of its screen are captioned; the sentence most of them share and neither the class's own failures
  nor what the other captioned candidates' failures show do is what the candidate changes (its *idea*, read again
  as more are captioned). A candidate that ``modes.link`` reads as another phrasing of a finding's cause ("on a
  rock" after "on a mountain top", both captioned "it is on the rocks"; or one holding every word of a finding's
  caption) waits: the runner places every finding in its failure mode, and distinct modes are tested and
  confirmed first. Different ideas are confirmed however they fail: two attributes that fail as the same wrong
  label are two modes. A phrasing whose own words differ from the finding's (two colours the captioner names
  alike) may be a cause of its own: once a later pass has screened and tested every distinct candidate, those its
  screens single out are tested in their own right, surest first, with what is left. Once two findings of one kind
  (background, colour, ...) fail as one wrong label, further candidates of that kind and label wait until the
  pass has screened and tested the rest (``KIND_LATER``).
- **Confirmation sizes** are declared with the first confirmation, before it draws the baseline (``pass_designs``):
  each later pass gets a share of the attempts, whatever the budget (so that what a run does with its first images
  does not depend on how many it was given); a pass whose share is spent confirms with another pass's sizes,
  larger first. Each pass's attempts compare with the first so many images of the
  confirmation baseline as its tests have class baseline images, at most 800 (300, 800, 800), drawn when first
  needed.
- **The stop** says which target the budget reached and which it could not.

The tools keep the statistics' guarantees whatever a planner does; this one only decides where images go.
Deterministic: the same results give the same turns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass, field

from sleuth.agent.events import ToolCall
from sleuth.agent.mode_summary import ModeSummary, effect_text, fails_as, mode_summaries
from sleuth.agent.modes import Idea, Trace, content_key, ideas_of, link, sentence_shares
from sleuth.agent.planners.protocol_v1 import pct, ratio_text, top_confusion
from sleuth.agent.planners.script import Results, Script, ScriptPlanner, ok
from sleuth.agent.runner import Turn
from sleuth.tools import caption_failures, generate_and_classify, measure_rate, perturb_caption, record_finding
from sleuth.tools.common import SampleSummary
from sleuth.tools.defaults import ALPHA, MAX_CONFIRMATIONS
from sleuth.tools.designs import ConfirmationDesign, Spending
from sleuth.tools.ladder import (
    DROP_BELOW,
    PASSES,
    TEST_AT,
    Target,
    evidence,
    judge,
    score,
)
from sleuth.tools.stats import RatioCI, binomial_rate

FIRST_LOOKS = 128
"""New candidates given their first look per turn (then what the screen singled out is tested, surest first)."""
CHUNK = 24
"""Candidates screened per turn after their first look."""
PREVIEW_MIN = 2
"""Failures a screen look needs for its captions to say what the candidate changes."""
TEST_BATCH = 2
COUNTERFACTUAL_N = 20
NAMED = 5
KIND_LATER = 2
"""Findings of one kind of cause failing as one wrong label after which further such candidates wait for the end of
the pass: a third colour that fails as the same label is worth less than the first test of another kind."""


def effect(conf: measure_rate.Result) -> RatioCI | None:
    """A confirmation's effect: corrected for its selection and early stop where the tool gives it."""
    return conf.effect or conf.rate_ratio


def pass_designs(passes: tuple[Target, ...], m: int, budget: int | None = None,
                 baseline_n: int = 0) -> list[ConfirmationDesign]:
    """The confirmation sizes of the passes, declared before any baseline: each later pass the budget can pay for
    twice over (its baseline, a test and a confirmation at its sizes) gets a fifth of the ``m`` attempts, and the
    first pass (strong effects, the most attempts) the rest.

    Each pass's attempts compare with the first ``confirmation_baseline`` images of the confirmation baseline (at
    least ``baseline_n``): the first 300 for strong effects, so that the first confirmation is cheap; the first 800
    for the 2x and 1.5x passes, against which a weak failure of a class that seldom fails can be confirmed (28/800
    against 1/300 has Fisher p = 0.001, against 3/800 2e-6)."""
    keys: dict[tuple[int, int], int] = {}
    spending: dict[tuple[int, int], Spending] = {}
    base: dict[tuple[int, int], int] = {}
    for i, t in enumerate(passes):
        key = (min(t.first_n, t.test_n), t.test_n)
        reachable = i == 0 or budget is None or budget >= 2 * (t.baseline_n + 2 * t.test_n)
        if key not in keys and reachable:
            keys[key] = 0 if i == 0 else m // 5
            spending[key] = t.spending
            base[key] = max(baseline_n, t.confirmation_baseline or t.baseline_n)
    first = next(iter(keys))
    if sum(keys.values()) >= m:
        keys = dict.fromkeys(keys, 0)
    keys[first] = m - sum(keys.values())
    return [ConfirmationDesign(first_n=f, max_n=n, attempts=a, spending=spending[f, n], baseline_n=base[f, n])
            for (f, n), a in keys.items() if a > 0]


def sentences(caption: str) -> int:
    return len([x for x in caption.split(".") if x.strip()])


@dataclass(eq=False)
class Candidate:
    caption: str
    kind: str
    """'caption' (a cluster of failures or one of its sentences) or the perturbation's edit type."""
    target: str | None = None
    k: int = 0
    n: int = 0
    confusions: Counter[str] = field(default_factory=Counter)
    looks: list[tuple[str, int]] = field(default_factory=list)
    """Its screening looks: (measurement id, failures)."""
    previewed: int = 0
    """Failures of the screen look whose captions were read last (a look with more is read again)."""
    state: str = "new"
    """new | open (climbing) | test | dropped (this pass) | tested (this pass) | found | other (a finding's phrasing) |
    unrendered."""
    idea: Idea = field(default_factory=Idea)
    """What the captions of its failures say it changes (``idea_of``), read again as more candidates are captioned."""
    captioned: list[caption_failures.Hypothesis] = field(default_factory=list)
    """The captions of its failures read last (a screen look's or a supported test's)."""
    tested_in: int = -1
    """The last pass that tested it."""
    source: str = "vocabulary"
    """Who proposed it: the failure captions and the vocabulary, or a language model ('llm')."""
    tested: Counter[str] = field(default_factory=Counter)
    """The wrong labels of its supported test's failures (``_read``)."""
    tested_k: int = 0
    tested_n: int = 0
    """Its supported test's failures and images."""
    worded: bool = False
    """Its caption narrows or widens a finding's (a phrasing by its words, not only by its failures): it says nothing
    the finding's caption does not, or adds to it, so it is never tested in its own right."""

    @property
    def confusion(self) -> str | None:
        if self.target:
            return self.target
        return self.confusions.most_common(1)[0][0] if self.confusions else None

    def trace(self, class_prompt: str) -> Trace:
        """What its screens and tests measured of its cause (agent/modes.py): the wrong labels of its test once it has
        one, else of its screen (and the label a cluster of failures gave it)."""
        if self.tested_n:
            return Trace(self.caption, self.tested, self.idea, class_prompt, k=self.tested_k, n=self.tested_n)
        return Trace(self.caption, self.confusions, self.idea, class_prompt, self.target, k=self.k, n=self.n)


def _named(cands: list[Candidate], p0: float) -> str:
    best = sorted(cands, key=lambda c: (-score(c.k, c.n, p0), c.caption))
    names = ", ".join(f"{c.caption!r} {c.k}/{c.n}" for c in best[:NAMED])
    more = f", and {len(best) - NAMED} more" if len(best) > NAMED else ""
    return f" ({names}{more})"


def _round_robin(queues: list[list[Candidate]]) -> list[Candidate]:
    out: list[Candidate] = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


@dataclass
class Found:
    candidate: Candidate
    discovery: measure_rate.Result
    confirmation: measure_rate.Result
    label: str | None
    phrasings: list[str] = field(default_factory=list)
    cf_tried: bool = False
    """Its counterfactual test was run (or attempted)."""
    finding_id: str = ""

    def labels(self) -> Counter[str]:
        """The wrong labels its discovery and confirmation images failed as."""
        out: Counter[str] = Counter()
        for r in (self.discovery, self.confirmation):
            summary = getattr(r, "hypothesis", None)
            for x in summary.confusions if summary is not None else []:
                out[x.label] += x.count
        return out

    def trace(self, class_prompt: str) -> Trace:
        """What its tests measured of its cause, its idea as its candidate reads now (agent/modes.py)."""
        c = self.confirmation.hypothesis if self.confirmation is not None else None
        return Trace(self.candidate.caption, self.labels(), self.candidate.idea, class_prompt, self.label,
                     k=c.failures.k if c is not None else 0, n=c.failures.n if c is not None else 0)


class ProtocolPlanner(ScriptPlanner):
    """Passes at smaller and smaller effects while images remain; distinct findings by what the failures show."""

    explore_types = ("background", "domain", "object", "adjective")

    def __init__(self, label: str, class_prompt: str, *, baseline_n: int | None = None, budget: int | None = None,
                 max_hypotheses: int = 4, passes: tuple[Target, ...] = PASSES, confirmations: int = MAX_CONFIRMATIONS,
                 name: str = "protocol", designs: list[ConfirmationDesign] | None = None,
                 proposer: str = "vocabulary") -> None:
        super().__init__(name)
        self.proposer = proposer
        """'llm': a language model adds candidates (perturb_caption with the failure captions, one request)."""
        self.label = label
        self.class_prompt = class_prompt
        self.baseline_n = baseline_n or passes[0].baseline_n
        self.budget = budget
        self.max_hypotheses = max_hypotheses
        self.passes = passes
        self.confirmations = confirmations
        """The declared confirmation attempts (the session's family; each is tested at alpha / this)."""
        self._attempts = 0
        self._pass = 0
        """The pass under way."""
        # Declared for every pass whatever the budget: sizes that followed the budget would make a run's first
        # thousands of images depend on how many it was given.
        self.designs = designs if designs is not None else pass_designs(passes, confirmations, None, self.baseline_n)
        """The declared confirmation sizes (each with its share of the attempts)."""
        self._used: Counter[tuple[int, int]] = Counter()
        self._confirmed_once = False
        self._conf_drawn = 0
        """Confirmation baseline images drawn so far."""
        self._conf_n: int | None = None
        """The confirmation baseline's size where an earlier attempt fixed it (designs without their own)."""
        self._prior: list[str] = []
        """Findings recorded before this planner took over (in a chat, by the user), as the summary names them."""
        self._p0 = 0.0
        self._have = 0
        """The class baseline's size so far (later passes top it up to their size)."""
        self._base_k = 0
        """Its failures."""
        self._cf_cost = 3 * COUNTERFACTUAL_N
        """Images a counterfactual test is expected to cost: its class images, their edits and their control edits,
        or what the costliest so far was charged (an editor on a diffusion model charges its inversions and edits in
        generator images, several hundred a test)."""
        self._common: dict[str, float] = {}
        self._cands: list[Candidate] = []

    # -- budget ------------------------------------------------------------------------------------------

    def confirmation_baseline(self, design: ConfirmationDesign | None = None) -> int:
        """The confirmation baseline images an attempt of ``design`` compares with: its declared size (the first so
        many images, drawn up to it when first needed), or, for designs declared without one, the size the first
        attempt draws once for all."""
        if design is not None and design.baseline_n is not None:
            return design.baseline_n
        return self._conf_n or self.baseline_n

    def adopt(self, designs: list[ConfirmationDesign], used: dict[tuple[int, int], int],
              baseline_n: int | None) -> None:
        """Go on from confirmations made before this planner took over (in a chat, the user's): the sizes they
        declared, the attempts each has spent and the confirmation baseline they drew (``baseline_n``; None: not
        drawn yet)."""
        self.designs = list(designs)
        self._used = Counter(used)
        self._attempts = sum(used.values())
        self._confirmed_once = True
        self._conf_drawn = baseline_n or 0
        if baseline_n is not None and all(d.baseline_n is None for d in designs):
            self._conf_n = baseline_n

    def _class_rate(self, k: int, n: int) -> None:
        """The class baseline grew to ``k`` failures in ``n`` images: the rate every screen and test compares with."""
        if n >= self._have:
            self._base_k, self._have = k, n
            self._p0 = (k + 0.5) / (n + 1)

    def _left(self) -> int | None:
        return self.images_left() if self.budget is not None else None

    def _confirm_cost(self, t: Target) -> int:
        """Images a confirmation in pass ``t`` needs before its first look ends: the look and what it adds to the
        confirmation baseline."""
        d = self._design(t)
        if d is None or d.baseline_n is None:
            return t.first_n + (0 if self._confirmed_once else self.baseline_n)
        return t.first_n + max(0, d.baseline_n - self._conf_drawn)

    def _topup(self, t: Target) -> int:
        """Images the next test of pass ``t`` adds to the class baseline."""
        return max(0, self._base_n(t) - self._have)

    def _affords(self, extra: int, t: Target) -> bool:
        """Whether ``extra`` images leave enough for the baseline's top-up and a confirmation."""
        left = self._left()
        return left is None or left >= extra + self._topup(t) + self._confirm_cost(t)

    def _base_n(self, t: Target) -> int:
        return max(self.baseline_n, t.baseline_n)

    def measure(self, caption: str, target: str | None, t: Target, **arguments: object) -> ToolCall:
        return self.call("measure_rate", caption=caption, target_label=target, baseline_n=self._base_n(t),
                         spending=t.spending, futility_rate=self._futility(t), **arguments)

    def _futility(self, t: Target) -> float:
        """A test or confirmation stops, not supported, once its failure rate is surely under what pass ``t`` looks
        for: a weaker effect is looked for again, on more images, by a later pass."""
        return round(t.worth(self._p0), 4)

    def _design(self, t: Target) -> ConfirmationDesign | None:
        """The declared sizes for a confirmation in pass ``t``: its own while they have attempts left, else another
        pass's, larger first."""
        own = (min(t.first_n, t.test_n), t.test_n)
        order = sorted(self.designs, key=lambda d: (d.key != own, d.max_n < t.test_n, abs(d.max_n - t.test_n)))
        return next((d for d in order if self._used[d.key] < d.attempts), None)

    def _cannot_confirm(self, t: Target) -> str:
        if self._attempts >= self.confirmations or self._design(t) is None:
            return (f"the investigation's {self.confirmations} confirmation attempts are spent (each is tested at "
                    f"alpha/{self.confirmations})")
        if not self._affords(0, t):
            return "the images left cannot pay for another confirmation"
        return ""

    # -- the procedure -------------------------------------------------------------------------------------

    def script(self) -> Script:
        prompt = self.class_prompt
        if self._view is not None:
            self._prior = [f"{f.finding_id} {f.caption!r}" for f in self._view.findings if f.confirmed]
        (first,) = yield self.turn(
            f"I start with a baseline of {self.baseline_n} images of {prompt!r}: its failures are the material for "
            "hypotheses and its rate the yardstick. Strong failures show against it; later passes top it up for "
            "weaker ones.",
            self.call("generate_and_classify", prompt=prompt, n=self.baseline_n),
        )
        base = ok(first, generate_and_classify.Result)
        if base is None:
            yield self.finish(f"The baseline could not be measured: {first.error}")
            return
        s = base.summary
        self._p0 = (s.failures.k + 0.5) / (s.failures.n + 1)
        self._have = s.failures.n
        self._base_k = s.failures.k
        by_llm = self.proposer == "llm"
        calls = [] if by_llm else [self.call("perturb_caption", caption=prompt, types=list(self.explore_types), n=100,
                                             refinements=False)]
        if s.failures.k:
            calls.insert(0, self.call("caption_failures", measurement_id=base.measurement_id, max_sentences=3))
        results = yield self.turn(
            f"Baseline failure rate {pct(s.failures)}. "
            + ("I caption the failed images (clustered by wrong label and appearance) " if s.failures.k else "")
            + "and perturb the class prompt one attribute at a time with the general vocabulary: every candidate "
              "gets a cheap screen before any is tested.",
            *calls,
        )
        caps = ok(results[0], caption_failures.Result) if s.failures.k else None
        if by_llm:
            context = [h.caption for h in caps.hypotheses[:8]] if caps else []
            (res,) = yield self.turn(
                "A language model proposes candidates of its own besides the vocabulary's (one request"
                + (f", given the captions of {len(context)} clusters of failures" if context else "")
                + "); every one is screened like the rest.",
                self.call("perturb_caption", caption=prompt, types=list(self.explore_types), n=100,
                          refinements=False, context=context))
            pert = ok(res, perturb_caption.Result)
        else:
            pert = ok(results[-1], perturb_caption.Result)
        self._common = sentence_shares(caps.hypotheses) if caps else {}
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

        def add(caption: str, kind: str, target: str | None, source: str = "vocabulary") -> None:
            key = content_key(caption)
            if key not in keys:
                keys.add(key)
                cands.append(Candidate(caption, kind, target, source=source))

        refined = {h.caption: ok(r, perturb_caption.Result) for h, r in zip(long, parts)}
        for h in hyps:
            add(h.caption, "caption", h.predicted_label)
            got = refined.get(h.caption)
            for e in got.refinements if got else []:
                if e.type == "single_sentence":
                    add(e.caption, "caption", h.predicted_label)
        edits = pert.edits if pert else []
        # The vocabulary's first, so that a language model's candidates are the ones the vocabulary does not have.
        for e in [e for e in edits if e.source != "llm"] + [e for e in edits if e.source == "llm"]:
            add(e.caption, e.type, None, e.source)
        if by_llm:
            yield self.turn(self._proposed_text(pert, cands))
        if not cands:
            yield self.finish(f"Baseline {pct(s.failures)}; no caption cluster and no perturbation to screen.")
            return
        # First looks in turn over the kinds of candidate, so that every kind is looked at early.
        by_kind: dict[str, list[Candidate]] = {}
        for c in cands:
            by_kind.setdefault(c.kind, []).append(c)
        cands = _round_robin(list(by_kind.values()))
        self._cands = cands

        found: list[Found] = []
        tested = supported = screened_images = 0
        reached: list[str] = []
        stop = ""
        for i, t in enumerate(self.passes):
            self._pass = i
            if i:
                back = []
                for c in cands:
                    if c.state in ("open", "test", "later", "dropped", "tested"):
                        c.state = "open"
                    elif c.state == "other" and self._repeat_of(c, found) is None:
                        c.state = "open"  # read again against more captions, no longer a finding's phrasing
                        back.append(c)
                        for g in found:
                            if c.caption in g.phrasings:
                                g.phrasings.remove(c.caption)
                if back:
                    yield self.turn(
                        f"Read against the captions of more candidates, {len(back)} that waited as another phrasing "
                        "of a finding say something of their own" + _named(back, self._p0) + "; they are screened "
                        "again.")
                if not self._affords(self._pass_cost(t, cands), t):
                    stop = (f"the images left cannot pay for a pass at {t.name} (its baseline of "
                            f"{self._base_n(t)} images, a test and a confirmation)")
                    break
                more = self._topup(t)
                if more:
                    # The pass's tests would draw these at its first test; drawn now, its screen judges every
                    # candidate against the class rate its tests use. A 300-image baseline of a class that fails 2%
                    # puts its rate between 0.9% and 4.3%, and this pass's threshold is twice that.
                    (res,) = yield self.turn(
                        f"Pass {i + 1} compares with {self._base_n(t)} images of {prompt!r}; I draw the {more} more "
                        "now, so that its screen judges candidates against the class rate its tests will use.",
                        self.call("generate_and_classify", prompt=prompt, n=more))
                    top = ok(res, generate_and_classify.Result)
                    if top is not None:
                        self._class_rate(self._base_k + top.summary.failures.k, self._have + top.summary.failures.n)
            yield self.turn(self._pass_intro(i, t, cands))
            released = False
            while not stop:
                # Tests first: what the screen has singled out, surest first; a kind of cause with KIND_LATER
                # findings waits until the pass has screened and tested the rest.
                queue = self._order([c for c in cands if c.state == "test"], t)
                if not released:
                    for c in queue:
                        if self._saturated(c, found):
                            c.state = "later"
                    queue = [c for c in queue if c.state == "test"]
                if queue:
                    stop = self._cannot_confirm(t)
                    if stop:
                        break
                    if found:
                        yield from self._preview(queue[:TEST_BATCH * 3])
                    queue = [c for c in queue if not self._repeats(c, found)]
                if queue:
                    batch: list[Candidate] = []
                    for c in queue:
                        if len(batch) == TEST_BATCH or not self._affords(t.first_n * (len(batch) + 1), t):
                            break
                        batch.append(c)
                    if not batch:
                        stop = "the images left cannot pay for another test and a confirmation"
                        break
                    for c in batch:
                        c.state = "tested"
                        c.tested_in = i
                    tested += len(batch)
                    out = yield self.turn(
                        f"Testing on fresh seeds ({t.name} pass): "
                        + "; ".join(f"{c.caption!r} ({c.k}/{c.n} in the screen)" for c in batch) + ".",
                        *[self.measure(c.caption, c.confusion, t, max_n=self._test_n(t), first_n=t.first_n)
                          for c in batch],
                    )
                    for c, res in zip(batch, out):
                        r = ok(res, measure_rate.Result)
                        if r is None:
                            continue
                        self._class_rate(r.baseline.k, r.baseline.n)
                        if not self._worth_confirming(r, i):
                            continue
                        supported += 1
                        yield from self._read(c, r)
                        if self._repeats(c, found):
                            continue
                        stop = self._cannot_confirm(t)
                        if stop:
                            break
                        f = yield from self._confirm(c, r, t)
                        if f is not None:
                            c.state = "found"
                            found.append(f)
                            for g in found:  # a finding of its own now, no longer another's phrasing
                                if c.caption in g.phrasings:
                                    g.phrasings.remove(c.caption)
                    continue
                plan = self._screen_plan(t, cands)
                if not plan:
                    if any(c.state == "test" for c in cands):
                        continue  # the re-judged screen singled out candidates: test them first
                    later = self._release(cands) if not released else []
                    released = True
                    if later:
                        yield self.turn(
                            f"The rest of the {t.name} pass is screened and tested; now the {len(later)} candidates "
                            "that waited because findings of their kind already fail as their wrong label"
                            + _named(later, self._p0) + ".")
                        continue
                    break
                left = self._left()
                if left is not None:
                    room = left - self._topup(t) - self._confirm_cost(t) - 2 * t.first_n
                    fitted = []
                    for c, more in plan:
                        if more <= room:
                            fitted.append((c, more))
                            room -= more
                    if not fitted:
                        last = self._last_shot(cands, found, t)
                        if last is not None:
                            yield self.turn(
                                "The images left cannot pay for more screening, but they can pay for a test and a "
                                "confirmation: I test the surest candidate the screen has not dropped, "
                                f"{last.caption!r} ({last.k}/{last.n} in the screen).")
                            continue
                        stop = "the images left cannot pay for more screening and still a test and a confirmation"
                        break
                    plan = fitted
                if found:  # what reads as a finding's idea waits for the end instead of climbing the ladder
                    yield from self._preview([c for c, _ in plan], screening=True)
                    plan = [(c, more) for c, more in plan if not self._repeats(c, found)]
                    if not plan:
                        continue
                fresh = all(c.state == "new" for c, _ in plan)
                looks = yield self.turn(
                    f"Screening {len(plan)} candidates ({sum(m for _, m in plan)} images), "
                    + ("a first look." if fresh else f"one rung up the {t.name} ladder."),
                    *[self.call("generate_and_classify", prompt=c.caption, n=more) for c, more in plan],
                )
                for (c, more), res in zip(plan, looks):
                    look = ok(res, generate_and_classify.Result)
                    if look is None:
                        c.state = "unrendered"
                        continue
                    screened_images += more
                    c.k += look.summary.failures.k
                    c.n += look.summary.failures.n
                    c.looks.append((look.measurement_id, look.summary.failures.k))
                    c.confusions.update({x.label: x.count for x in look.summary.confusions})
                    if look.summary.unrendered:
                        c.state = "unrendered"  # not really this caption: nothing to test
                        continue
                    c.state = self._judge(c, t)
            yield from self._mechanisms(found, t)
            if stop:
                break
            reached.append(t.name)
        # Other phrasings of findings, with what is left.
        t = self.passes[min(len(reached), len(self.passes) - 1)]
        others = sorted((c for c in cands if c.state == "other"), key=lambda c: (*self._rank(c, t), c.caption))
        if others and not stop:
            for c in others:
                if self._cannot_confirm(t) or not self._affords(t.first_n, t):
                    break
                if self._repeat_of(c, found) is not None and c.worded:
                    continue
                (res,) = yield self.turn(
                    f"Images and confirmation attempts are left, so I test {c.caption!r}, another phrasing of a "
                    "finding, in case it fails for a reason of its own.",
                    self.measure(c.caption, c.confusion, t, max_n=self._test_n(t), first_n=t.first_n))
                tested += 1
                r = ok(res, measure_rate.Result)
                if r is not None:
                    self._class_rate(r.baseline.k, r.baseline.n)
                if r is None or not self._worth_confirming(r, len(self.passes) - 1):
                    continue
                supported += 1
                yield from self._read(c, r)
                if self._repeat_of(c, found, ("idea", "states")) is not None:
                    continue  # its own failures read as a finding's idea too
                f = yield from self._confirm(c, r, t)
                if f is not None:
                    c.state = "found"
                    found.append(f)
                    for other in found:  # a finding of its own now, no longer another's phrasing
                        if c.caption in other.phrasings:
                            other.phrasings.remove(c.caption)
        yield from self._mechanisms(found, t)
        yield self.finish(self._summary(s, cands, found, tested, supported, screened_images, reached, stop))

    # -- pieces --------------------------------------------------------------------------------------------

    def _pass_intro(self, i: int, t: Target, cands: list[Candidate]) -> str:
        worth = t.worth(self._p0)
        head = (f"{len(cands)} candidates. " if not i else
                f"Pass {i + 1}: images remain, so I look for smaller effects. ")
        return (head + f"A failure worth confirming now fails at {100 * worth:.1f}% or more ({t.ratio:g}x the class "
                f"and {100 * t.gain:g} point{'' if 100 * t.gain == 1 else 's'} above it). A candidate climbs a "
                f"ladder of {', '.join(map(str, t.ladder))} screening images while the screen leaves at least a "
                f"{DROP_BELOW:.0%} chance that it fails that often"
                + (f" (none is dropped before {t.floor} images)" if t.floor > t.ladder[0] or i else "")
                + f"; at {TEST_AT:.0%} it is tested on fresh seeds (up to {t.test_n} images), surest first, and a "
                  "supported test is confirmed at once.")

    def _pass_cost(self, t: Target, cands: list[Candidate]) -> int:
        """The least a pass must be able to pay besides its baseline top-up and a confirmation: two tests' first
        looks."""
        return 2 * t.first_n

    def _order(self, queue: list[Candidate], t: Target) -> list[Candidate]:
        """Test order: by the evidence of the screen (``ladder.evidence``: the posterior probability that it fails at
        the pass's target, then its posterior mean failure rate), then the shortest caption; never by order of
        arrival. Phrasings of a finding are not in the queue: they wait for what the passes leave."""
        return sorted(queue, key=lambda c: (*self._rank(c, t), sentences(c.caption), c.caption))

    def _rank(self, c: Candidate, t: Target) -> tuple[float, float]:
        """Sort key, surest first: ``ladder.evidence`` negated."""
        p, mean = evidence(c.k, c.n, self._p0, t)
        return -p, -mean

    @staticmethod
    def _release(cands: list[Candidate]) -> list[Candidate]:
        """The candidates that waited for the end of the pass, back in the test queue."""
        for c in cands:
            if c.state == "later":
                c.state = "test"
        return [c for c in cands if c.state == "test"]

    def _last_shot(self, cands: list[Candidate], found: list[Found], t: Target) -> Candidate | None:
        """When the images left pay for a test and a confirmation but no more screening: the candidate still climbing
        the ladder most plausibly worth confirming (not a finding's phrasing), put in the test queue. The screen keeps
        back a test and a confirmation's images so that what it singles out can be tested; this spends them on its
        best guess instead of leaving them unused."""
        for c in sorted((c for c in cands if c.state == "open" and c.n), key=lambda c: (*self._rank(c, t), c.caption)):
            if found and (self._repeat_of(c, found) is not None or self._saturated(c, found)):
                continue
            c.state = "test"
            return c
        return None

    def _saturated(self, c: Candidate, found: list[Found]) -> bool:
        """Whether KIND_LATER findings of the candidate's kind (background, colour, ...) already fail as its wrong
        label."""
        return c.confusion is not None and sum(f.candidate.kind == c.kind and f.label == c.confusion
                                               for f in found) >= KIND_LATER

    def _judge(self, c: Candidate, t: Target) -> str:
        return judge(c.k, c.n, self._p0, t)

    def _screen_plan(self, t: Target, cands: list[Candidate]) -> list[tuple[Candidate, int]]:
        """The next look: new candidates first, then those below the pass's floor, then those still climbing, one
        rung up; surest first, CHUNK at a time, so that what a look singles out is tested before the next. Nothing
        while a candidate waits for its test."""
        fresh = [c for c in cands if c.state == "new"]
        if fresh:
            return [(c, t.ladder[0]) for c in fresh[:FIRST_LOOKS]]
        for c in cands:  # a new pass's verdict on what earlier passes screened
            if c.state == "open" and c.n:
                c.state = self._judge(c, t)
        if any(c.state == "test" for c in cands):
            return []

        def surest(cs: list[Candidate]) -> list[Candidate]:
            return sorted(cs, key=lambda c: (*self._rank(c, t), c.caption))[:CHUNK]

        low = surest([c for c in cands if c.state == "open" and c.n < t.floor])
        if low:
            return [(c, t.floor - c.n) for c in low]
        out = []
        for c in surest([c for c in cands if c.state == "open" and c.n < t.ladder[-1]]):
            rung = next(r for r in t.ladder if r > c.n)
            out.append((c, rung - c.n))
        return out

    def _test_n(self, t: Target) -> int:
        left = self._left()
        if left is None:
            return t.test_n
        return max(t.first_n, min(t.test_n, (left - self._topup(t) - self._confirm_cost(t)) // 2))

    def _worth_confirming(self, r: measure_rate.Result, i: int) -> bool:
        """Supported after correction over every discovery test, or (after the first pass, when the family of
        tests has grown) an unadjusted p-value a confirmation attempt would pass."""
        if r.hypothesis is None or r.rate_ratio is None or r.rate_ratio.ratio <= 1:
            return False
        return r.verdict == "supported" or (i > 0 and r.p_value <= ALPHA / self.confirmations)

    def _preview(self, queue: list[Candidate], screening: bool = False) -> Generator[Turn, Results, None]:
        """Captions the failures of the screens of candidates about to be tested or screened again (their look with
        the most, if it has PREVIEW_MIN or more and more than the look read before): one that reads as a finding's
        idea waits for the end instead of taking a test or more screening images."""
        todo = [c for c in queue if c.looks and max(k for _, k in c.looks) >= max(PREVIEW_MIN, c.previewed + 1)]
        for c in todo:
            c.previewed = max(k for _, k in c.looks)
        if not todo:
            return
        out = yield self.turn(
            f"Before {'screening them again' if screening else 'testing'}, I caption the failures of their screens: "
            "one that reads as another phrasing of a finding waits for the end.",
            *[self.call("caption_failures", measurement_id=max(c.looks, key=lambda x: x[1])[0], max_clusters=1,
                        max_sentences=3, min_cluster_size=1) for c in todo])
        for c, res in zip(todo, out):
            got = ok(res, caption_failures.Result)
            if got is not None:
                c.captioned = list(got.hypotheses)
        self._refresh_ideas()

    def _read(self, c: Candidate, r: measure_rate.Result) -> Generator[Turn, Results, None]:
        """Captions the failures of a supported test: the candidate's idea; the wrong labels of its test are how it
        fails from now on (as the runner reads a finding's, agent/modes.py)."""
        if r.hypothesis is not None:
            c.tested = Counter({x.label: x.count for x in r.hypothesis.confusions})
            c.tested_k, c.tested_n = r.hypothesis.failures.k, r.hypothesis.failures.n
        if r.measurement_id is None:
            return
        (res,) = yield self.turn(
            f"Before confirming {c.caption!r}, I caption the failures of its test: the sentences most of them share "
            "and the class's own failures do not say what it changes, so that another phrasing of a finding is not "
            "confirmed twice.",
            self.call("caption_failures", measurement_id=r.measurement_id, max_clusters=1, max_sentences=3,
                      min_cluster_size=1))
        got = ok(res, caption_failures.Result)
        if got is not None:
            c.captioned = list(got.hypotheses)
            self._refresh_ideas()

    def _refresh_ideas(self) -> None:
        """Reads the idea of every captioned candidate again (``modes.ideas_of``): the more candidates are captioned,
        the surer what is said of most images of the class."""
        done = [c for c in self._cands if c.captioned]
        ideas = ideas_of({c.caption: c.captioned for c in done}, self._common, self.class_prompt)
        for c in done:
            c.idea = ideas[c.caption]

    def _repeats(self, c: Candidate, found: list[Found]) -> bool:
        """Another phrasing of a finding (the same idea, or every content word of a finding's caption and more,
        failing as a wrong label the finding fails as): it waits for the end, and the finding lists it. One whose
        failures go mostly to a label the finding seldom fails as fails in a way of its own, whatever its captions
        share."""
        f = self._repeat_of(c, found)
        if f is None:
            return False
        f.phrasings.append(c.caption)
        c.state = "other"
        return True

    def _repeat_of(self, c: Candidate, found: list[Found], kinds: tuple[str, ...] = ("idea", "states", "narrower",
                                                                                       "wider")) -> Found | None:
        """The finding a candidate is most surely another phrasing of, if any (``modes.link``, of the kinds given);
        ``c.worded`` says whether the link is one of words (its caption narrows or widens the finding's)."""
        me = c.trace(self.class_prompt)
        best: tuple[int, Found, bool] | None = None
        for f in found:
            theirs = f.trace(self.class_prompt)
            # A tested candidate is read as the runner reads a finding (both ways); a screen's few failures cannot yet
            # say which labels it fails as, so only its own is held against the finding's.
            got = link(me, theirs, symmetric=bool(c.tested_n))
            if got is not None and got.kind in kinds and (best is None or got.strength > best[0]):
                best = (got.strength, f, bool(me.words) and (me.words <= theirs.words or theirs.words <= me.words))
        if best is None:
            return None
        c.worded = best[2]
        return best[1]

    def _confirm(self, c: Candidate, r: measure_rate.Result, t: Target) -> Generator[Turn, Results, Found | None]:
        target = c.confusion or top_confusion(r)
        design = self._design(t)
        assert design is not None, "_cannot_confirm is checked before every confirmation"
        (first,) = yield self.turn(
            f"{c.caption!r} is supported in discovery: {pct(r.hypothesis.failures) if r.hypothesis else 'n/a'} vs "
            f"{pct(r.baseline)}, {ratio_text(r.rate_ratio)}, p={r.p_value:.2g} (adjusted {r.adjusted_p:.2g}). I "
            "confirm it now, on fresh seeds disjoint from every image so far.",
            self.call("measure_rate", caption=c.caption, target_label=target, confirm=True, max_n=design.max_n,
                      first_n=design.first_n, baseline_n=self.confirmation_baseline(design),
                      futility_rate=self._futility(t),
                      # The first attempt declares every pass's sizes, before it draws the confirmation baseline.
                      **({} if self._confirmed_once else {"designs": [d.model_dump(exclude_none=True)
                                                                      for d in self.designs]})),
        )
        conf = ok(first, measure_rate.Result)
        if conf is not None:  # a refused call drew nothing and is no attempt
            self._confirmed_once = True
            self._conf_drawn = max(self._conf_drawn, self.confirmation_baseline(design))
            self._attempts += 1
            self._used[design.key] += 1
        if conf is None:  # refused before drawing anything: no evidence either way
            yield self.turn(f"The confirmation of {c.caption!r} was refused ({first.error}); it is not recorded.")
            return None
        if conf.verdict != "supported" or conf.hypothesis is None:
            yield self.turn(f"{c.caption!r} did not replicate on fresh seeds (adjusted p={conf.adjusted_p:.2g}); it "
                            "is not recorded.")
            return None
        # Recorded as soon as it is confirmed; its counterfactual follows when the pass ends (``_mechanisms``), so
        # the mechanism tests of the findings before it never delay a finding.
        (rec,) = yield self.turn(
            f"Confirmed: {pct(conf.hypothesis.failures)} vs {pct(conf.baseline)} (adjusted p={conf.adjusted_p:.2g}). "
            f"Recording {c.caption!r} now; its mechanism is tested when this pass ends.",
            self.call("record_finding", caption=c.caption, discovery_test=r.test_id, confirmation_test=conf.test_id,
                      summary=self._finding_text(c, conf)),
        )
        got = ok(rec, record_finding.Result)
        if got is None:
            return None
        return Found(c, r, conf, target, finding_id=got.finding_id)

    @staticmethod
    def _finding_text(c: Candidate, conf: measure_rate.Result, cf: measure_rate.Result | None = None) -> str:
        assert conf.hypothesis is not None
        text = (f"{c.caption!r} fails {pct(conf.hypothesis.failures)}, {ratio_text(effect(conf))} the baseline on "
                "fresh seeds")
        if cf is not None and cf.mcnemar is not None:
            text += (f"; edits flipped {cf.mcnemar.b} images to failure and {cf.mcnemar.c} back (McNemar "
                     f"p={cf.mcnemar.p_value:.2g})")
        return text + "."

    def _mechanisms(self, found: list[Found], t: Target) -> Generator[Turn, Results, None]:
        """The counterfactual test of each finding that has none yet, added to its record: as many as the images
        left afford while keeping a confirmation's worth for the next pass."""
        batch: list[Found] = []
        for f in found:
            if f.cf_tried:
                continue
            if not self._affords(self._cf_cost * (len(batch) + 1), t):
                break
            batch.append(f)
        if not batch:
            return
        for f in batch:
            f.cf_tried = True
        got = yield self.turn(
            f"The mechanism of {len(batch)} finding{'s' * (len(batch) != 1)} recorded in this pass: "
            f"{COUNTERFACTUAL_N} class images edited to each caption, each against its control-edited twin "
            "(exact McNemar).",
            *[self.call("measure_rate", caption=f.candidate.caption, target_label=f.label, mode="counterfactual",
                        max_n=COUNTERFACTUAL_N, baseline_n=self._base_n(t)) for f in batch],
        )
        records = []
        for f, res in zip(batch, got):
            cf = ok(res, measure_rate.Result)
            if cf is not None and cf.budget_charged:
                self._cf_cost = max(self._cf_cost, cf.budget_charged)
            if cf is not None:
                records.append(self.call(
                    "record_finding", caption=f.candidate.caption, discovery_test=f.discovery.test_id,
                    confirmation_test=f.confirmation.test_id, counterfactual_test=cf.test_id,
                    summary=self._finding_text(f.candidate, f.confirmation, cf)))
        if records:
            yield self.turn("Adding each counterfactual test to its finding.", *records)

    @staticmethod
    def _proposed_text(pert: perturb_caption.Result | None, cands: list[Candidate]) -> str:
        if pert is None:
            return "The language model's proposals could not be had; the vocabulary's candidates are screened."
        if pert.source == "vocabulary":
            why = "; ".join(pert.notes) or "it proposed nothing; these are the vocabulary's"
            return f"The language model's proposals: {why}."
        mine = [c for c in cands if c.source == "llm"]
        asked = sum(e.source == "llm" for e in pert.edits)
        names = ", ".join(repr(c.caption) for c in mine[:NAMED]) + (f", and {len(mine) - NAMED} more"
                                                                    if len(mine) > NAMED else "")
        return (f"The language model proposed {asked} edit{'' if asked == 1 else 's'} the generator can render; "
                f"{len(mine)} {'is a candidate' if len(mine) == 1 else 'are candidates'} the vocabulary does not have"
                + (f": {names}." if mine else "."))

    @staticmethod
    def _proposals_outcome(cands: list[Candidate]) -> str:
        mine = [c for c in cands if c.source == "llm"]
        if not mine:
            return ""
        found = [c for c in mine if c.state == "found"]
        tested = [c for c in mine if c.tested_in >= 0]
        screened = [c for c in mine if c.n]
        return (f" Of the language model's {len(mine)} {'candidate' if len(mine) == 1 else 'candidates'}, "
                f"{len(screened)} {'was' if len(screened) == 1 else 'were'} screened, {len(tested)} "
                f"tested and {len(found)} confirmed" + (": " + ", ".join(repr(c.caption) for c in found) if found
                                                        else "") + ".")

    def _modes_listing(self, modes: list[ModeSummary], found: list[Found]) -> str:
        """The failure modes in words, as the modes table shows them (each its claim's effect; a weak one in words),
        grouped by the label they fail as, surest first: the mode's other findings, then the captions read as its
        phrasings (tested or not) that no finding holds."""
        view = self._view
        assert view is not None
        captions = {f.finding_id: f.caption for f in view.findings}
        tests = {t.test_id: t.caption for t in view.tests}
        by_id = {f.finding_id: f for f in found}
        recorded = set(captions.values())

        def one(m: ModeSummary) -> str:
            others = [captions[i] for i in m.phrasings if i in captions]
            read = [tests[t] for t in m.tests if t in tests]
            read += [p for i in m.findings if i in by_id for p in by_id[i].phrasings]
            read = [p for p in dict.fromkeys(read) if p not in recorded]
            more = ([f"also found as {', '.join(repr(c) for c in others)}"] if others else []) + (
                [f"{'and' if others else 'also'} phrased {', '.join(repr(c) for c in read[:3])}"
                 + (f" and {len(read) - 3} more" if len(read) > 3 else "")] if read else [])
            return f"{m.caption!r} ({m.mode_id}) {effect_text(m)}" + (f" ({', '.join(more)})" if more else "")

        groups: dict[str, list[ModeSummary]] = {}
        for m in sorted(modes, key=lambda m: -(m.ratio_ci[0] or 0.0)):
            groups.setdefault(fails_as(m), []).append(m)
        return " ".join(f"Failing as {'other labels' if label == '–' else label}: " + "; ".join(map(one, ms)) + "."
                        for label, ms in groups.items())

    def _summary(self, s: SampleSummary, cands: list[Candidate], found: list[Found],
                 tested: int, supported: int, screened_images: int, reached: list[str], stop: str) -> str:
        base = s.failures if self._have <= s.failures.n else binomial_rate(self._base_k, self._have)
        modes = mode_summaries(self._view) if self._view is not None and found else []
        untested = [c for c in cands if c.state in ("test", "later")]
        names = [t.name for t in self.passes]
        unreached = [n for n in names if n not in reached]
        reach = (f"Searched for effects down to {reached[-1]} the class rate"
                 if reached else "No pass was completed")
        text = (f"Baseline for {self.label}: {pct(base)}. {len(cands)} candidates screened on {screened_images} "
                f"images; {tested} tests, {supported} supported, {len(found)} confirmed"
                + (f" in {len(modes)} failure mode{'s' * (len(modes) != 1)}. Failure modes, by the wrong label: "
                   f"{self._modes_listing(modes, found)} " if modes else
                   ". " if found else ". No further finding was confirmed. " if self._prior else
                   ". No finding was confirmed. ")
                + (f"Recorded before this procedure: {'; '.join(self._prior)}. " if self._prior else "")
                + (f"Singled out by the screen but not tested before the stop: {len(untested)}"
                   + _named(untested, self._p0) + ". " if untested else "")
                + f"{reach}"
                + (f"; not reached: {', '.join(unreached)} ({stop})." if unreached and stop else
                   f"; stopped: {stop}." if stop else "; every pass ran to its end.")
                + self._proposals_outcome(cands))
        return text
