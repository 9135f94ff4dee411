"""Screening perturbations before testing them: a cheap look that decides which become hypotheses.

A general vocabulary proposes far more single-attribute perturbations than a budget can test properly, and every
test enlarges the family its p-values are corrected over. So a planner first *screens*: a few images of each
perturbation (generate_and_classify, which tests nothing), then tests only the most promising on fresh seeds with
measure_rate. Selecting on the screen and testing on fresh seeds keeps the tests valid. Perturbations that fail the
same way (same edit type, same wrong label) are most likely one failure mode under several phrasings, so the
selection takes the strongest of each mode before a second of any.
"""

from __future__ import annotations

from dataclasses import dataclass

from sleuth.tools import generate_and_classify


@dataclass(frozen=True)
class Screened:
    caption: str
    type: str
    k: int
    n: int
    confusion: str | None
    """The wrong label the screen's failures most often got."""

    @property
    def rate(self) -> float:
        return self.k / self.n if self.n else 0.0


def screened(caption: str, edit_type: str, result: object) -> Screened | None:
    """A generate_and_classify result as a screen, or None if the call failed."""
    if not isinstance(result, generate_and_classify.Result):
        return None
    s = result.summary
    return Screened(caption, edit_type, s.failures.k, s.failures.n, s.confusions[0].label if s.confusions else None)


def select(screens: list[Screened], baseline_rate: float, top: int) -> list[Screened]:
    """At most ``top`` screens that failed more often than the baseline: the strongest of each (type, confusion)
    mode first, modes in order of their strongest; ties keep the screens' order."""
    above = sorted((s for s in screens if s.rate > baseline_rate), key=lambda s: -s.rate)
    modes: dict[tuple[str, str | None], list[Screened]] = {}
    for s in above:
        modes.setdefault((s.type, s.confusion), []).append(s)
    queues = list(modes.values())
    out: list[Screened] = []
    while len(out) < top and any(queues):
        for q in queues:
            if q and len(out) < top:
                out.append(q.pop(0))
    return out
