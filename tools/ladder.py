"""The screening ladder: when a cheap look at a caption says test it, look again, or drop it.

A screen is a look, not a test: a few images of each candidate caption on discovery seeds, never a p-value and never a
member of a family. Selecting on it and then testing on fresh seeds keeps the tests valid whatever it selected. After
each look a candidate's failure rate has a posterior (a Beta prior with the weight of PRIOR_WEIGHT images, centred on
the class's failure rate); against a ``Target`` (a failure worth confirming: ``ratio`` x the class rate and ``gain``
above it) it is

- *test*: the posterior probability of a failure worth confirming is TEST_AT (TEST_AT_TOP at the top of the ladder)
  and it has ``test_from`` screening images, or it is TEST_SURE with the target's ``floor`` of images (a screen that
  sure is tested now, not after more looks);
- *dropped*: the probability is under DROP_BELOW, it has the target's ``floor`` of images, and a failure worth
  confirming would give as few failures as its screen's with at most ``drop_evidence`` (or it reached the top of the
  ladder without being singled out);
- *open*: otherwise; it climbs to the next rung.

The protocol planner judges its candidates with these rules (``judge``), pass by pass; ``screen`` runs the whole
ladder over a list of captions in one call, which is how generate_and_classify screens several prompts for any
planner, a language model's included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from scipy import stats as sps

from sleuth.tools.designs import Spending

Verdict = Literal["test", "open", "dropped"]


@dataclass(frozen=True)
class Target:
    """One pass of the search: the effect it looks for and the images it may spend on one candidate."""

    ratio: float
    gain: float
    """A failure worth confirming: at least ``ratio`` x the class rate and ``gain`` above it."""
    ladder: tuple[int, ...]
    """Screening images a candidate has after each rung."""
    floor: int
    """No candidate is dropped in this pass before it has this many screening images."""
    test_n: int
    """Most images of a test (and of a confirmation)."""
    first_n: int
    """Images of a test's first look."""
    baseline_n: int
    """The class baseline's size for this pass's tests."""
    test_from: int
    """Screening images a candidate needs before it is tested: among a hundred candidates some screen high by
    chance, and a look of this size costs less than the test it saves."""
    spending: Spending = "pocock"
    """How its tests and confirmations spread their alpha over their looks. Evenly (Pocock): most candidates a screen
    singles out fail far above the class and stop at an early look, for a third to a half of the images
    O'Brien-Fleming spending needs. O'Brien-Fleming for the 2x and 1.5x passes, to keep the last look's power for
    weak effects, found no more bugs on the benchmark (docs/planner.md)."""
    confirmation_baseline: int = 0
    """Confirmation baseline images its confirmations compare with (the first so many of it); 0: ``baseline_n``."""
    drop_evidence: float = 1.0
    """A candidate is dropped only once a failure rate worth confirming would give as few failures as its screen's
    with at most this probability. In a class that seldom fails the prior holds a screen with no failure at almost
    zero, and a failure of 1% shows none in 69 images half the time: the later passes, whose targets are a point or
    half a point above the class, do not drop it on so little."""

    def worth(self, p0: float) -> float:
        """The failure rate a candidate must plausibly reach, given the class rate ``p0``."""
        return min(max(self.ratio * p0, p0 + self.gain), (1 + p0) / 2)

    @property
    def name(self) -> str:
        return f"{self.ratio:g}x"


PASSES = (
    Target(3.0, 0.05, (3, 12, 32), 3, 300, 30, 300, 3),
    Target(2.0, 0.01, (12, 32, 80, 200), 12, 800, 50, 800, 80, drop_evidence=0.5),
    Target(1.5, 0.005, (80, 200, 500), 32, 2000, 100, 1500, 200, confirmation_baseline=800, drop_evidence=0.5),
)
"""The 1.5x pass confirms against 800 baseline images, not its tests' 1,500: with 1,500 it confirmed failures of
1.2-2x at about 2% that the benchmark's oracle (3,000 images) cannot tell from 1.2x, so counts as false."""
PRIOR_WEIGHT = 2.0
"""Weight (in images) of the Beta prior on a candidate's failure rate, centred on the baseline rate."""
DROP_BELOW = 0.2
TEST_AT = 0.9
TEST_AT_TOP = 0.6
TEST_SURE = 0.99
"""Posterior probability of a failure worth confirming: below DROP_BELOW a candidate is dropped (at or above the
floor); at TEST_AT (or TEST_AT_TOP at the top of the ladder) it is tested on fresh seeds, at TEST_SURE as soon as it
has the pass's floor of images: 5 failures in 12 where the class fails 3% make twice the class rate all but certain,
and the 68 more screening images the 2x pass would ask for first delay its test by a thousand images or more."""

def posterior(k: int, n: int, p0: float) -> tuple[float, float]:
    return k + PRIOR_WEIGHT * p0, n - k + PRIOR_WEIGHT * (1 - p0)


def plausibility(k: int, n: int, p0: float, target: Target) -> float:
    """Posterior probability that a candidate with ``k`` failures in ``n`` screening images fails at
    ``target.worth(p0)`` or more."""
    return float(sps.beta.sf(target.worth(p0), *posterior(k, n, p0)))


def evidence(k: int, n: int, p0: float, target: Target) -> tuple[float, float]:
    """How surely a candidate fails at ``target``'s rate, then how strongly: the posterior probability that it does
    (``plausibility``, to 3 places, so that near-certain candidates tie) and its posterior mean failure rate. Sorted
    descending, the order in which what waits for a test or a look is taken up."""
    a, b = posterior(k, n, p0)
    return round(plausibility(k, n, p0, target), 3), a / (a + b)


def score(k: int, n: int, p0: float) -> float:
    """How surely a candidate fails often: the 20% quantile of its posterior failure rate (surest first)."""
    return float(sps.beta.ppf(0.2, *posterior(k, n, p0)))


def class_rate(k: int, n: int) -> float:
    """The class's failure rate a screen compares with: its baseline's, kept off zero."""
    return (k + 0.5) / (n + 1)


def judge(k: int, n: int, p0: float, t: Target) -> Verdict:
    """What the ladder does with a candidate that failed ``k`` times in ``n`` screening images (module docstring)."""
    p = plausibility(k, n, p0, t)
    top = n >= t.ladder[-1]
    if (p >= TEST_AT and n >= t.test_from) or (p >= TEST_SURE and n >= t.floor) or (top and p >= TEST_AT_TOP):
        return "test"
    if top or (p < DROP_BELOW and n >= t.floor and sps.binom.cdf(k, n, t.worth(p0)) <= t.drop_evidence):
        return "dropped"
    return "open"


def next_look(n: int, t: Target) -> int:
    """Images a candidate with ``n`` screening images gets at its next look: to the first rung, to the target's floor,
    then one rung up (0 at the top)."""
    if n < t.ladder[0]:
        return t.ladder[0] - n
    if n < t.floor:
        return t.floor - n
    return next((r - n for r in t.ladder if r > n), 0)


def target_for(ratio: float) -> Target:
    """The pass of ``PASSES`` that looks for ``ratio`` x the class rate."""
    for t in PASSES:
        if t.ratio == ratio:
            return t
    raise ValueError(f"no screening target at {ratio:g}x (known: {', '.join(t.name for t in PASSES)})")


@dataclass
class Screened:
    """One candidate of a screen: its pooled looks and the ladder's verdict."""

    caption: str
    k: int = 0
    n: int = 0
    verdict: Verdict | Literal["new", "unrendered"] = "new"
    looks: list[int] = field(default_factory=list)
    """Images of each look this screen gave it."""


Look = Callable[[str, int], tuple[int, int, bool]]
"""``look(caption, n)``: ``n`` more images of the caption, as (images made, failures, rendered)."""


def screen(cands: Sequence[Screened], p0: float, t: Target, look: Look, max_images: int) -> tuple[int, str]:
    """Runs the ladder over ``cands`` (each may start with earlier looks pooled in) until every one is singled out for
    a test or dropped, or the next look would take more than ``max_images`` in all: rung by rung, the surest first,
    all new candidates' first looks before anything climbs. Returns the images spent and why it stopped: ``done``
    or ``max_images``."""
    spent = 0
    for c in cands:
        if c.verdict == "new" and c.n:
            c.verdict = judge(c.k, c.n, p0, t)
    while True:
        todo = [c for c in cands if c.verdict in ("new", "open")]
        if not todo:
            return spent, "done"
        fresh = [c for c in todo if c.verdict == "new"]
        batch = fresh or sorted(todo, key=lambda c: (-score(c.k, c.n, p0), c.caption))
        plan = [(c, next_look(c.n, t) if c.n else t.ladder[0]) for c in batch]
        fitted = []
        room = max_images - spent
        for c, more in plan:
            if 0 < more <= room:
                fitted.append((c, more))
                room -= more
        if not fitted:
            return spent, "max_images"
        for c, more in fitted:
            made, failed, rendered = look(c.caption, more)
            spent += made
            c.k += failed
            c.n += made
            c.looks.append(made)
            c.verdict = judge(c.k, c.n, p0, t) if rendered else "unrendered"
