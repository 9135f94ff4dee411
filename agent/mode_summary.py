"""Failure modes as every output shows them: one claim per mode, in one shape, with the same numbers everywhere.

A mode's claim is its best-evidenced finding's confirmation (``agent/modes.py``): its failures against the
confirmation baseline, its effect corrected for selection with a 95% interval, and its adjusted p. ``ModeSummary``
holds it in strict JSON (non-finite numbers as ``null``, as ``FindingSummary`` does): ``investigate --json``, an
audit's ``summary.json`` and the report store it, and the terminal, the report, the answer key and the LLM's ledger
print it through the functions below, so a mode reads the same wherever it is shown.

A claim is *weak* when its effect's interval reaches 1 or below (or there is no estimate): the confirmation shows
the rate is higher than the class's, but the correction for selection leaves open by how much, and a bare ratio
would say more than the data do. Weak claims are said so in words (``WEAK``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from sleuth.agent.modes import ModeClaim, effect_of
from sleuth.tools.findings import Counts
from sleuth.tools.stats import RatioCI
from sleuth.tools.text import pv

if TYPE_CHECKING:
    from sleuth.agent.view import InvestigationView

WEAK = "weak: the rate is higher, by how much is not known"
"""What a weak claim says instead of its ratio."""


def is_weak(effect: RatioCI) -> bool:
    """The effect's interval reaches 1 or below, or it has no estimate (nan)."""
    return not (effect.low > 1 and effect.ratio == effect.ratio)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


class ModeSummary(BaseModel):
    """A failure mode and its one claim, in strict JSON, the same shape wherever sleuth prints or stores modes."""

    label: str = Field(description="The class under audit.")
    mode_id: str
    idea: str | None = Field(None, description="What the mode's failures show, in one sentence (none: not read).")
    labels: list[str] = Field(default_factory=list, description="The wrong labels the mode fails as, most first.")
    best: str = Field(description="Id of the best-evidenced finding, whose confirmation is the mode's claim.")
    caption: str = Field(description="The best-evidenced finding's caption.")
    findings: list[str] = Field(description="Ids of the mode's findings in the order they joined, its founder first.")
    reasons: dict[str, str] = Field(default_factory=dict, description="Why each finding is in the mode.")
    confirmation: Counts = Field(description="The best finding's failures on fresh confirmation seeds.")
    baseline: Counts = Field(description="The class's failures on the confirmation's baseline seeds.")
    ratio: float | None = Field(description=(
        "The claim's effect: the confirmation's rate ratio corrected for selection where it gives one; null when "
        "infinite or undefined."))
    ratio_ci: tuple[float | None, float | None]
    adjusted_p: float = Field(description="The confirmation's p, adjusted over the declared confirmation family.")
    weak: bool = Field(description="The effect's interval reaches 1 or below: higher, by how much is not known.")
    counterfactual_p: float | None = Field(None, description=(
        "Adjusted p of the best finding's counterfactual edits (exact McNemar); null when not tested."))
    tests: list[str] = Field(default_factory=list, description=(
        "Supported tests behind no finding whose failures read as another phrasing of this mode (not confirmed: "
        "the mode's claim already stands for them)."))

    @classmethod
    def of(cls, label: str, claim: ModeClaim, tests: Sequence[str] = ()) -> ModeSummary:
        m, best = claim.mode, claim.best
        c, r = best.confirmation, effect_of(best)
        ids = [f.finding_id for f in claim.findings]
        return cls(label=label, mode_id=m.mode_id, idea=m.idea, labels=list(m.labels), best=best.finding_id,
                   caption=best.caption, findings=ids, reasons={i: m.reasons[i] for i in ids if i in m.reasons},
                   confirmation=Counts.of(c.hypothesis), baseline=Counts.of(c.baseline), ratio=_finite(r.ratio),
                   ratio_ci=(_finite(r.low), _finite(r.high)), adjusted_p=c.adjusted_p, weak=is_weak(r),
                   counterfactual_p=best.counterfactual.adjusted_p if best.counterfactual is not None else None,
                   tests=list(tests))

    @property
    def phrasings(self) -> list[str]:
        """Its findings other than the best-evidenced one, in the order they joined."""
        return [f for f in self.findings if f != self.best]


def mode_summaries(view: InvestigationView) -> list[ModeSummary]:
    """The modes of a transcript's view, in the order they formed."""
    label = str(view.started.config.get("class", "")) if view.started is not None else ""
    tests = view.test_modes()
    return [ModeSummary.of(label, c, [t for t, m in tests.items() if m == c.mode.mode_id])
            for c in view.mode_claims()]


def mode_ids(modes: Sequence[ModeSummary]) -> dict[str, str]:
    """Finding id -> the id of the mode that holds it."""
    return {f: m.mode_id for m in modes for f in m.findings}


# -- the same words in every view ------------------------------------------------------------------------------


def _x(v: float | None, none: str) -> str:
    return none if v is None else f"{v:.3g}"


def counts_text(m: ModeSummary) -> str:
    """``21/30 vs 13/300``: the best finding's confirmation failures against its baseline."""
    return f"{m.confirmation.k}/{m.confirmation.n} vs {m.baseline.k}/{m.baseline.n}"


def effect_text(m: ModeSummary, *, interval: bool = True) -> str:
    """``15.8× [8.02, 33.6]``; a weak claim in words, then (``interval``) the interval that makes it weak."""
    low, high = m.ratio_ci
    ci = f"[{_x(low, 'n/a')}, {_x(high, '∞')}]"
    if m.weak:
        return f"{WEAK} (95% CI {ci})" if interval else WEAK
    return f"{_x(m.ratio, '∞')}× {ci}"


def p_text(m: ModeSummary) -> str:
    return pv(m.adjusted_p)


def fails_as(m: ModeSummary) -> str:
    """The wrong label the mode's failures go to most ('–' when none was read)."""
    return m.labels[0] if m.labels else "–"


def phrasings_text(m: ModeSummary) -> str:
    """``+3: f4, f18, f25; 2 tests``: how many other findings phrase the same cause, and which, then how many tests
    behind no finding read as it; '–' for none."""
    rest = m.phrasings
    parts = [f"+{len(rest)}: {', '.join(rest)}"] if rest else []
    if m.tests:
        parts.append(f"{len(m.tests)} test{'s' * (len(m.tests) != 1)}")
    return "; ".join(parts) or "–"


def claim_text(m: ModeSummary) -> str:
    """The mode's claim in one phrase: ``21/30 vs 13/300, 15.8× [8.02, 33.6], adjusted p < 1e-06``."""
    return f"{counts_text(m)}, {effect_text(m)}, adjusted p {p_text(m)}"
