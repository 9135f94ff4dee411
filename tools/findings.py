"""Findings: the typed record of a confirmed failure hypothesis, and the one compact shape every output uses.

``Finding`` is what ``record_finding`` returns and what the transcript's ``finding`` events hold. ``FindingSummary``
is its compact, strict-JSON form (``investigate --json``, an audit's ``summary.json``, the benchmark's records):
non-finite numbers (an infinite rate ratio: a baseline without failures) are ``null`` there.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from sleuth.tools import stats


class Evidence(BaseModel):
    """One test behind a finding: both rates with intervals, their ratio, raw and adjusted p."""

    test_id: str
    hypothesis: stats.Rate
    baseline: stats.Rate
    rate_ratio: stats.RatioCI
    p_value: float
    adjusted_p: float
    kind: str
    effect: stats.RatioCI | None = Field(None, description=(
        "A confirmation's rate ratio corrected for its selection and early stop (conditionally median-unbiased, "
        "95% interval given the selection); rate_ratio is the naive estimate."))
    bound: float | None = Field(None, description=(
        "A confirmation's headline: the caption fails at least this many times as often as the class (the least "
        "rate ratio its own exact test still rejects; >= 1). None in transcripts recorded before it existed."))


class Finding(BaseModel):
    finding_id: str
    caption: str
    summary: str
    confirmed: bool
    discovery: Evidence
    confirmation: Evidence
    counterfactual: Evidence | None = None


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


class Counts(BaseModel):
    k: int
    n: int
    low: float
    high: float

    @classmethod
    def of(cls, r: stats.Rate) -> Counts:
        return cls(k=r.k, n=r.n, low=r.low, high=r.high)


class EvidenceSummary(BaseModel):
    test_id: str
    hypothesis: Counts
    baseline: Counts
    rate_ratio: float | None = Field(description="null when infinite (the baseline had no failure) or undefined.")
    rate_ratio_ci: tuple[float | None, float | None]
    p_value: float
    adjusted_p: float
    at_least: float | None = Field(None, description=(
        "A confirmation's headline: the caption fails at least this many times as often as the class (>= 1); "
        "null for other tests."))

    @classmethod
    def of(cls, e: Evidence) -> EvidenceSummary:
        rr = e.rate_ratio
        return cls(test_id=e.test_id, hypothesis=Counts.of(e.hypothesis), baseline=Counts.of(e.baseline),
                   rate_ratio=_finite(rr.ratio), rate_ratio_ci=(_finite(rr.low), _finite(rr.high)),
                   p_value=e.p_value, adjusted_p=e.adjusted_p, at_least=e.bound)


class FindingSummary(BaseModel):
    """A finding in strict JSON, the same shape wherever sleuth prints or stores findings."""

    label: str = Field(description="The class under audit.")
    finding_id: str
    caption: str
    confirmed: bool
    summary: str = ""
    discovery: EvidenceSummary
    confirmation: EvidenceSummary
    counterfactual: EvidenceSummary | None = None

    @classmethod
    def of(cls, label: str, f: Finding) -> FindingSummary:
        return cls(label=label, finding_id=f.finding_id, caption=f.caption, confirmed=f.confirmed, summary=f.summary,
                   discovery=EvidenceSummary.of(f.discovery), confirmation=EvidenceSummary.of(f.confirmation),
                   counterfactual=EvidenceSummary.of(f.counterfactual) if f.counterfactual else None)


class HypothesisSummary(BaseModel):
    """A hypothesis of an investigation's discovery family, in strict JSON (null for infinite ratios)."""

    label: str
    test_id: str
    caption: str
    kind: str = Field(description="'rate' (fresh images of the caption) or 'counterfactual' (edited images).")
    hypothesis: Counts
    baseline: Counts
    rate_ratio: float | None
    rate_ratio_ci: tuple[float | None, float | None]
    p_value: float
    adjusted_p: float
    verdict: str

    @classmethod
    def of(cls, label: str, test_id: str, caption: str, kind: str, k1: int, n1: int, k0: int, n0: int,
           p_value: float, adjusted_p: float, verdict: str) -> HypothesisSummary:
        rr = stats.rate_ratio(k1, n1, k0, n0)
        return cls(label=label, test_id=test_id, caption=caption, kind=kind,
                   hypothesis=Counts.of(stats.binomial_rate(k1, n1)), baseline=Counts.of(stats.binomial_rate(k0, n0)),
                   rate_ratio=_finite(rr.ratio), rate_ratio_ci=(_finite(rr.low), _finite(rr.high)), p_value=p_value,
                   adjusted_p=adjusted_p, verdict=verdict)
