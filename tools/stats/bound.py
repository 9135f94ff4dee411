"""The headline of a confirmed finding: a lower bound on its rate ratio that the confirmation itself proves.

A confirmation attempt rejects "the caption fails no more often than the class" when Fisher's one-sided p at its
stopping look J is at most that look's threshold a_J (a share of the attempt's alpha / M). The bound inverts the same
test at the same threshold: conditional on the failures in all, S = k1 + k0, the hypothesis's failures X follow
Fisher's noncentral hypergeometric law with the odds ratio psi, and P_psi(X >= k1) rises with psi, so

    psi_L = the psi where P_psi(X >= k1) = a_J

is the least odds ratio the test at a_J still rejects. At psi = 1 this is the attempt's own p-value, at most a_J, so
psi_L >= 1 for every confirmation that rejects: a headline bound never contradicts the verdict it stands beside.

It is converted to a rate ratio at the class rate's exact upper end: p1 / p0 = psi / (1 + (psi - 1) p0) falls as p0
rises (psi >= 1), so taking p0 at the Clopper-Pearson one-sided upper end of the baseline k0/n0 at level ``share``
(the attempt's alpha / M) gives a bound that is still >= 1 and below the true rate ratio whenever both the odds ratio
and the class rate are bounded correctly.

Its error, union-bounded like the family-wise error: the odds-ratio bound exceeds the truth only if the test of
"odds ratio <= the truth" rejects at some look j at a_j (probability at most sum_j a_j = alpha / M, by the same union
bound as the attempt's level); the class rate exceeds its upper end with probability at most alpha / M. So an
attempt's bound is wrong with probability at most 2 alpha / M, and the bounds of all M declared attempts hold
together with probability at least 1 - 2 alpha (90% at alpha = 5%). Unlike the selection-corrected effect
(``selection``), it is not an estimate: it says how large the effect is at least, and the confirmation is the
evidence for it.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special
from scipy import stats as st

from sleuth.tools.stats.rates import RatioCI

SPAN = 60.0
"""The log odds ratios searched for the bound: 0 to this (beyond it the bound is reported at this end)."""


def _log_weights(k0: int, n0: int, k1: int, n1: int) -> tuple[np.ndarray, np.ndarray]:
    """The support of X given S = k0 + k1 failures in all, and the log weights log C(n1, x) + log C(n0, S - x)."""
    s = k0 + k1
    x = np.arange(max(0, s - n0), min(s, n1) + 1)
    lw = (special.gammaln(n1 + 1) - special.gammaln(x + 1) - special.gammaln(n1 - x + 1)
          + special.gammaln(n0 + 1) - special.gammaln(s - x + 1) - special.gammaln(n0 - s + x + 1))
    return x, lw


def upper_tail(k1: int, n1: int, k0: int, n0: int, log_psi: float) -> float:
    """P_psi(X >= k1) given the failures in all: Fisher's one-sided p against the odds ratio exp(log_psi)."""
    x, lw = _log_weights(k0, n0, k1, n1)
    return float(np.exp(_log_tail(x, lw, k1, log_psi)))


def _log_tail(x: np.ndarray, lw: np.ndarray, k1: int, log_psi: float) -> float:
    w = lw + x * log_psi
    return float(special.logsumexp(w[x >= k1]) - special.logsumexp(w))


def odds_ratio_bound(k1: int, n1: int, k0: int, n0: int, threshold: float) -> float:
    """The least odds ratio that Fisher's one-sided test at ``threshold`` still rejects for k1/n1 against k0/n0;
    1.0 at least (and exactly 1 where the test at odds ratio 1 does not reject)."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    if not (0 <= k1 <= n1 and 0 <= k0 <= n0 and n1 > 0 and n0 > 0):
        raise ValueError(f"need 0 <= k <= n and n > 0 for both samples, got {k1}/{n1} and {k0}/{n0}")
    x, lw = _log_weights(k0, n0, k1, n1)
    target = math.log(threshold)
    if k1 == 0 or _log_tail(x, lw, k1, 0.0) > target:
        return 1.0
    if _log_tail(x, lw, k1, SPAN) <= target:
        return math.exp(SPAN)
    # The tail rises with log psi (an exponential family in it), so the root is unique.
    root = optimize.brentq(lambda b: _log_tail(x, lw, k1, b) - target, 0.0, SPAN, xtol=1e-12, rtol=1e-12)
    return math.exp(root)


def class_rate_upper(k0: int, n0: int, share: float) -> float:
    """The Clopper-Pearson one-sided upper end of the class rate k0/n0 at level ``share``."""
    return 1.0 if k0 >= n0 else float(st.beta.ppf(1.0 - share, k0 + 1, n0 - k0))


def headline_bound(k1: int, n1: int, k0: int, n0: int, threshold: float, share: float) -> float:
    """A confirmed finding's headline: the least rate ratio compatible with its confirmation (module docstring).

    ``threshold``: the attempt's threshold at the look it stopped at; ``share``: the attempt's alpha / M, the level
    of the class rate's upper end. Always >= 1."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"share must be in (0, 1), got {share}")
    psi = odds_ratio_bound(k1, n1, k0, n0, threshold)
    p0 = class_rate_upper(k0, n0, share)
    return max(1.0, psi / (1.0 + (psi - 1.0) * p0))


def given_selection(effect: RatioCI, bound: float) -> RatioCI:
    """The selection-corrected effect as a finding shows it beside its bound: the interval clipped below at the bound
    (the confirmation excludes smaller ratios at the family's level), and no point estimate where the correction
    gives none to trust: an outcome barely past its threshold (its interval starts at 0 by construction, so its
    estimate rests on the convention of ``selection.EDGE``), no estimate at all, or one below the bound."""
    low = max(effect.low, bound) if effect.low == effect.low else bound
    high = max(effect.high, low) if effect.high == effect.high else math.inf
    est = effect.ratio
    if not (effect.low > 0 and est == est and est >= bound):
        est = math.nan
    return RatioCI(ratio=est, low=low, high=high, method=f"{effect.method}, clipped below at the headline bound",
                   confidence=effect.confidence)
