"""Exact tests: hypothesis rate against baseline rate (Fisher, Boschloo), paired edits (McNemar), and the
multiplicity adjustment over a family of hypotheses (Holm, Benjamini–Hochberg)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel, Field
from scipy import stats as st

from sleuth.tools.stats.rates import FROZEN, Rate, RatioCI, binomial_rate, check_count, check_counts, rate_ratio

Alternative = Literal["greater", "less", "two-sided"]
_ALTERNATIVES = ("greater", "less", "two-sided")


def _check_alternative(alternative: str) -> None:
    if alternative not in _ALTERNATIVES:
        raise ValueError(f"alternative must be one of {', '.join(_ALTERNATIVES)}; got {alternative!r}")


class Comparison(BaseModel):
    """Exact test of a hypothesis rate against a baseline rate, with both rates and their ratio."""

    model_config = FROZEN

    p_value: float
    method: str
    alternative: str
    hypothesis: Rate
    baseline: Rate
    ratio: RatioCI


def fisher_p_greater(k1: ArrayLike, n1: ArrayLike, k0: ArrayLike, n0: ArrayLike) -> np.ndarray:
    """One-sided Fisher p-value for rate k1/n1 > k0/n0, vectorised (for simulations and sequential looks).

    Conditional on the k1 + k0 events, k1 is hypergeometric; the p-value is P(X >= k1). Inputs are not validated.
    """
    k1, n1, k0, n0 = (np.asarray(a, dtype=np.int64) for a in (k1, n1, k0, n0))
    return np.clip(st.hypergeom.sf(k1 - 1, n1 + n0, k1 + k0, n1), 0.0, 1.0)


def compare_rates(k1: int, n1: int, k0: int, n0: int, alternative: str = "greater",
                  method: str = "fisher", confidence: float = 0.95) -> Comparison:
    """Exact test that the hypothesis rate k1/n1 exceeds (by default) the baseline rate k0/n0.

    `method` is "fisher" (scipy.stats.fisher_exact) or "boschloo" (scipy.stats.boschloo_exact, more powerful,
    slower for large n). An empty sample carries no evidence: p = 1.
    """
    k1, n1 = check_counts(k1, n1, "k1", "n1")
    k0, n0 = check_counts(k0, n0, "k0", "n0")
    _check_alternative(alternative)
    # scipy's unconditional tests take one binomial sample per column; Fisher's test is the same either way round.
    table = [[k1, k0], [n1 - k1, n0 - k0]]
    if method not in ("fisher", "boschloo"):
        raise ValueError(f"method must be 'fisher' or 'boschloo', got {method!r}")
    if n1 == 0 or n0 == 0:
        p = 1.0
    elif method == "fisher":
        p = float(st.fisher_exact(table, alternative=alternative).pvalue)
    else:
        p = float(st.boschloo_exact(table, alternative=alternative).pvalue)
    return Comparison(
        p_value=min(1.0, max(0.0, p)), method=f"{method} exact", alternative=alternative,
        hypothesis=binomial_rate(k1, n1, confidence), baseline=binomial_rate(k0, n0, confidence),
        ratio=rate_ratio(k1, n1, k0, n0, confidence),
    )


def adjust_pvalues(pvalues: Sequence[float], method: str = "holm") -> list[float]:
    """Multiplicity-adjusted p-values in the original order: "holm" (step-down, family-wise error) or "bh"
    (Benjamini–Hochberg step-up, false discovery rate). Adjusted values are monotone in the raw ones and <= 1."""
    p = np.asarray(pvalues, dtype=float)
    if p.ndim != 1:
        raise ValueError("pvalues must be a flat sequence")
    if not np.all((p >= 0.0) & (p <= 1.0)):  # also refuses nan
        raise ValueError(f"p-values must lie in [0, 1], got {p.tolist()}")
    m = p.size
    if m == 0:
        return []
    order = np.argsort(p, kind="stable")
    ps = p[order]
    if method == "holm":
        # The i-th smallest (0-based) is compared with alpha / (m - i); the running max keeps the order of the raw p.
        adj = np.maximum.accumulate((m - np.arange(m)) * ps)
    elif method == "bh":
        # The i-th smallest (1-based rank r) is scaled by m / r; the running min from the top makes it step-up.
        adj = np.minimum.accumulate((m / np.arange(m, 0, -1)) * ps[::-1])[::-1]
    else:
        raise ValueError(f"method must be 'holm' or 'bh', got {method!r}")
    out = np.empty(m)
    out[order] = np.minimum(adj, 1.0)
    return [float(x) for x in out]


class McNemar(BaseModel):
    """Exact McNemar test on paired outcomes (the same image before and after an edit)."""

    model_config = FROZEN

    b: int = Field(ge=0, description="Pairs that flipped from correct to failure.")
    c: int = Field(ge=0, description="Pairs that flipped from failure to correct.")
    p_value: float
    alternative: str
    method: str = "exact"


def mcnemar_exact(b: int, c: int, alternative: str = "greater") -> McNemar:
    """Exact McNemar test: under no effect each discordant pair flips either way with probability 1/2, so
    b ~ Binom(b + c, 1/2). "greater" is the alternative that edits cause failures (b > c)."""
    b, c = check_count("b", b), check_count("c", c)
    _check_alternative(alternative)
    n = b + c
    if n == 0:
        p = 1.0
    else:
        greater = float(st.binom.sf(b - 1, n, 0.5))
        less = float(st.binom.cdf(b, n, 0.5))
        p = {"greater": greater, "less": less, "two-sided": 2.0 * min(greater, less)}[alternative]
    return McNemar(b=b, c=c, p_value=min(1.0, p), alternative=alternative)


class PairedDifference(BaseModel):
    """Difference of two proportions measured on the same units (accuracy of one model before and after a change)."""

    model_config = FROZEN

    n: int
    before: Rate
    after: Rate
    difference: float = Field(description="after - before.")
    low: float
    high: float
    confidence: float
    method: str = "Newcombe hybrid score (paired, method 10)"


def paired_difference(both: int, only_before: int, only_after: int, n: int,
                      confidence: float = 0.95) -> PairedDifference:
    """Interval for p_after - p_before on matched units: ``both`` units are successes in both, ``only_before`` in
    the first alone, ``only_after`` in the second alone, of ``n``.

    Newcombe's (1998) hybrid score interval for paired proportions (his method 10): each proportion's Wilson
    interval, combined with the correlation of the pairs (phi). Unlike the Wald interval it stays inside [-1, 1]
    and keeps near-nominal coverage when the proportions are close to 1 (accuracies are).
    """
    both, only_before, only_after, n = (check_count(name, v) for name, v in
                                        (("both", both), ("only_before", only_before), ("only_after", only_after),
                                         ("n", n)))
    neither = n - both - only_before - only_after
    if neither < 0:
        raise ValueError(f"need both + only_before + only_after <= n, got {both + only_before + only_after} > {n}")
    before, after = binomial_rate(both + only_before, n, confidence), binomial_rate(both + only_after, n, confidence)
    if n == 0:
        return PairedDifference(n=0, before=before, after=after, difference=math.nan, low=-1.0, high=1.0,
                                confidence=confidence)
    d = after.rate - before.rate
    # phi of the 2x2 table (rows: after success/failure, columns: before success/failure)
    a, b, c, e = both, only_after, only_before, neither
    denom = (a + b) * (c + e) * (a + c) * (b + e)
    phi = (a * e - b * c) / math.sqrt(denom) if denom > 0 else 0.0
    l1, u1 = after.low, after.high
    l0, u0 = before.low, before.high
    p1, p0 = after.rate, before.rate
    lower = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u0 - p0) + (u0 - p0) ** 2))
    upper = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p0 - l0) + (p0 - l0) ** 2))
    return PairedDifference(n=n, before=before, after=after, difference=d, low=max(-1.0, d - lower),
                            high=min(1.0, d + upper), confidence=confidence)


class NonInferiority(BaseModel):
    """Is the second condition no worse than the first by more than ``margin``? (one-sided, paired)"""

    model_config = FROZEN

    margin: float
    alpha: float
    interval: PairedDifference = Field(description="The two-sided 1 - 2 alpha interval: its lower end is the "
                                                   "one-sided 1 - alpha bound.")
    shown: bool = Field(description="The lower bound of after - before lies above -margin.")


def non_inferiority(both: int, only_before: int, only_after: int, n: int, margin: float,
                    alpha: float = 0.05) -> NonInferiority:
    """Non-inferiority of a paired proportion (e.g. accuracy after a fix against before): shown when the one-sided
    1 - alpha lower confidence bound of after - before is above -margin (equivalently, the null "after is worse by
    margin or more" is rejected at alpha)."""
    if not 0 < margin < 1:
        raise ValueError(f"margin must be in (0, 1), got {margin}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    ci = paired_difference(both, only_before, only_after, n, confidence=1 - 2 * alpha)
    return NonInferiority(margin=margin, alpha=alpha, interval=ci, shown=bool(n > 0 and ci.low > -margin))
