"""Failure modes as every output shows them: one claim per mode, in one shape, with the same numbers everywhere.

A mode's claim is its best-evidenced finding's confirmation (``agent/modes.py``): its failures against the
confirmation baseline, its effect corrected for selection with a 95% interval, and its adjusted p. ``ModeSummary``
holds it in strict JSON (non-finite numbers as ``null``, as ``FindingSummary`` does): ``investigate --json``, an
audit's ``summary.json`` and the report store it, and the terminal, the report, the answer key and the LLM's ledger
print it through the functions below, so a mode reads the same wherever it is shown.

A claim's one number is its headline bound, ``at_least``: the caption fails at least that many times as often as
the class (the least rate ratio the confirmation's own exact test still rejects, >= 1; ``tools/stats/bound.py``).
The selection-corrected effect stands beside it as detail, "given selection", clipped below at the bound.

A claim is *weak* when its corrected effect's interval reaches 1 or below (or there is no estimate): the
confirmation shows the rate is higher than the class's, but the correction for selection leaves open by how much
more than the bound. Weak claims say so (``WEAK``). Transcripts recorded before the bound existed show the corrected
effect instead, and a weak one in words.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from sleuth.agent.modes import ModeClaim, effect_of
from sleuth.tools.findings import Counts
from sleuth.tools.stats import RatioCI, given_selection
from sleuth.tools.text import pv

if TYPE_CHECKING:
    from sleuth.agent.view import InvestigationView

WEAK = "weak: the rate is higher, by how much is not known"
"""What a weak claim without a bound says instead of its ratio."""
WEAK_MARK = "weak"
"""What follows a weak claim's bound."""


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
    at_least: float | None = Field(None, description=(
        "The claim's one number: the best finding's caption fails at least this many times as often as the class "
        "(the headline bound of its confirmation, >= 1); null in transcripts recorded before it existed. With it, "
        "ratio and ratio_ci are the effect given selection, the interval clipped below at this bound, and ratio null "
        "where the correction gives no estimate to trust."))
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
        weak = is_weak(r)
        if c.bound is not None:
            r = given_selection(r, c.bound) if c.effect is not None else r
        ids = [f.finding_id for f in claim.findings]
        return cls(label=label, mode_id=m.mode_id, idea=m.idea, labels=list(m.labels), best=best.finding_id,
                   caption=best.caption, findings=ids, reasons={i: m.reasons[i] for i in ids if i in m.reasons},
                   confirmation=Counts.of(c.hypothesis), baseline=Counts.of(c.baseline), ratio=_finite(r.ratio),
                   ratio_ci=(_finite(r.low), _finite(r.high)), at_least=c.bound, adjusted_p=c.adjusted_p,
                   weak=weak,
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
    """``≥ 8.02×``, then (``interval``) the effect given selection: ``≥ 8.02× (given selection 15.8× [8.02, 33.6])``;
    a weak claim's bound is followed by "weak". Without a bound (older transcripts): ``15.8× [8.02, 33.6]``, and a
    weak claim in words."""
    low, high = m.ratio_ci
    ci = f"[{_x(low, 'n/a')}, {_x(high, '∞')}]"
    if m.at_least is not None:
        head = f"≥ {m.at_least:.3g}×" + (f" {WEAK_MARK}" if m.weak else "")
        if not interval:
            return head
        est = f"{m.ratio:.3g}× " if m.ratio is not None else ""
        return f"{head} (given selection {est}{ci})"
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
    """The mode's claim in one phrase: ``21/30 vs 13/300, ≥ 8.02× (given selection 15.8× [8.02, 33.6]), adjusted p
    < 1e-06``."""
    return f"{counts_text(m)}, {effect_text(m)}, adjusted p {p_text(m)}"
