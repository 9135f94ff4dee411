"""The effect of a confirmed hypothesis, corrected for its selection: median-unbiased given that the test rejected.

A finding is recorded only when its confirmation rejects, and a sequential confirmation stops at the first look that
rejects; both pick out samples where the hypothesis happened to fail often and the baseline rarely. Among recorded
findings the naive rate ratio (k1/n1) / (k0/n0) is biased upwards (the winner's curse; at a true 2x its median is
well above 2x). The estimate here conditions on the selection instead:

- the sample space is every (baseline count k0, stopping look j, hypothesis failures x at look j) at which the plan
  rejects; its probabilities under rates (p0, p1 = theta p0) come from an exact recursion over the looks (binomial
  increments, absorbed at the first rejecting look), with k0 binomial;
- outcomes are ordered by their naive log rate ratio T (with 0.5 added to each count so that zero counts order);
- the estimate theta_hat solves P_theta(T >= t_obs | reject) = 1/2 (conditionally median-unbiased), and the
  interval's ends solve it at 0.025 and 0.975 (a 95% interval given the selection);
- the baseline rate p0, a nuisance, is profiled: at hypothesis rate p1 it is (k0 + x - p1 n_j) / n0, the rate that
  with p1 accounts for every failure seen (the constrained estimate for rare failures); the theta the quantiles are
  solved for is p1 over it. Plugging in k0 / n0 instead would keep the selection of a low baseline.

Futility stops (which reject nothing) are left out of the recursion, and so is an early end for want of images; the
coverage and bias measured with them in (tests/test_selection.py) are what docs/statistics.md reports.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import signal, special
from scipy import stats as st

from sleuth.tools.stats.rates import RatioCI
from sleuth.tools.stats.sequential import SequentialPlan
from sleuth.tools.stats.shared_baseline import critical_counts

GRID = 120
"""Hypothesis rates the conditional distribution is computed at (log-spaced); the estimate interpolates between."""
QUANTILES = (0.5, 0.025, 0.975)
FLOOR = 1e-9
"""Rejection probabilities below this are treated as none (the recursion's rounding is ~1e-13)."""
METHOD = "conditional median-unbiased (given rejection; stopping look and baseline rate accounted for)"


def _t(x: np.ndarray, n: np.ndarray, k0: np.ndarray, n0: int) -> np.ndarray:
    return np.log((x + 0.5) / (n + 0.5)) - np.log((k0 + 0.5) / (n0 + 0.5))


def conditional_effects(plan: SequentialPlan, n0: int, k0: np.ndarray, look: np.ndarray, x: np.ndarray
                        ) -> np.ndarray:
    """For outcomes (baseline k0/n0, stopping look index, hypothesis failures x at that look), all of them rejections
    of ``plan``: an array (outcomes, 3) of the median-unbiased ratio and its 95% interval's ends (nan for an
    outcome that is not a rejection of the plan)."""
    k0, look, x = (np.asarray(a, dtype=np.int64) for a in (k0, look, x))
    looks = np.asarray(plan.looks)
    n_obs = looks[look]
    # The ratios considered: from 1/40 of the naive estimate to 20 times it (at least 20), as hypothesis rates p1
    # through the profiled p0 (theta = p1 n0 / (k0 + x - p1 n)); beyond them an interval end reads 0 or inf.
    naive = ((x + 0.5) / (n_obs + 1.0)) / ((k0 + 0.5) / (n0 + 1.0))
    lo_theta, hi_theta = naive / 40, 20 * np.maximum(naive, 1.0)
    p1_lo = lo_theta * (k0 + x) / (n0 + lo_theta * n_obs)
    p1_hi = hi_theta * (k0 + x) / (n0 + hi_theta * n_obs)
    p0_lo, p0_hi = (k0 + x - p1_hi * n_obs) / n0, (k0 + x - p1_lo * n_obs) / n0
    rows = np.arange(int(st.binom.ppf(1e-12, n0, max(1e-9, float(p0_lo.min())))),
                     int(min(n0, st.binom.isf(1e-12, n0, min(1.0, float(p0_hi.max()))) + 1)) + 1)
    crit = critical_counts(plan, rows, n0)  # (looks, rows)
    rejected = x >= crit[look, np.searchsorted(rows, k0)]
    t_obs = _t(x, n_obs, k0, n0)
    # x*[o, r, j]: the fewest failures at look j against baseline row r whose T reaches outcome o's.
    need = (looks[None, None, :] + 0.5) * np.exp(t_obs[:, None, None]) * \
        ((rows[None, :, None] + 0.5) / (n0 + 0.5)) - 0.5
    xstar = np.clip(np.ceil(need - 1e-9), 0, looks[None, None, :] + 1).astype(np.int64)
    grid = np.exp(np.linspace(math.log(max(1e-6, float(p1_lo.min()))), math.log(min(0.9999, float(p1_hi.max()))),
                              GRID))
    p0_at = np.empty((len(grid), len(k0)))
    tail = np.empty((len(grid), len(k0)))
    total = np.empty((len(grid), len(k0)))
    r_idx = np.arange(len(rows))[None, :]
    for g, p1 in enumerate(grid):
        tails = _rejection_tails(plan, crit, p1)  # per look: P(stop at j with X >= x | row), from an offset
        # The baseline rate that, with this hypothesis rate, accounts for every failure seen (the constrained
        # estimate for rare failures); the naive k0/n0 would carry the selection of a low baseline into the answer.
        p0_at[g] = np.clip((k0 + x - p1 * n_obs) / n0, 1e-9, 1.0)
        weights = _binom_pmf(rows, n0, p0_at[g])
        hit = np.zeros((len(k0), len(rows)))
        for j, (off, tj) in enumerate(tails):
            hit += tj[r_idx, np.clip(xstar[:, :, j] - off, 0, tj.shape[1] - 1)]
        tail[g] = (weights * hit).sum(axis=1)
        total[g] = weights @ np.array([tj[:, 0] for _, tj in tails]).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        # P(T >= t_obs | reject) at each grid rate, per outcome. Where rejection is all but impossible the ratio is
        # rounding noise of the recursion: there a rejection is the boundary outcome, the least T, so 0.
        s = np.where(total > FLOOR, tail / total, 0.0)
    # It grows with the rate where rejections come from the hypothesis; at rates so low that only a baseline with
    # almost no failures can reject, it rises again (those baselines give a large T). The estimate is the crossing
    # on the growing branch: the least value at this rate or above.
    s = np.minimum.accumulate(np.clip(s, 0.0, 1.0)[::-1], axis=0)[::-1]
    out = np.full((len(k0), 3), math.nan)  # nan: not a rejection of this plan, nothing to condition on
    for o in np.flatnonzero(rejected):
        theta = np.log(grid / p0_at[:, o])
        for c, q in enumerate(QUANTILES):
            out[o, c] = _solve(s[:, o], theta, q)
    return out


def _binom_pmf(rows: np.ndarray, n: int, p: np.ndarray) -> np.ndarray:
    """Binomial(n, p) probabilities of ``rows`` for each p: (len(p), len(rows)); scipy's pmf, written out for speed."""
    log_choose = special.gammaln(n + 1) - special.gammaln(rows + 1) - special.gammaln(n - rows + 1)
    q = np.clip(p, 1e-300, 1.0 - 1e-16)[:, None]
    return np.exp(log_choose[None, :] + rows[None, :] * np.log(q) + (n - rows)[None, :] * np.log1p(-q))


def _solve(s: np.ndarray, log_theta: np.ndarray, q: float) -> float:
    """exp of the log ratio where s crosses q (0 or inf when it does not within the grid)."""
    if s[0] >= q:
        return 0.0
    if s[-1] < q:
        return math.inf
    i = int(np.argmax(s >= q))
    a, b = s[i - 1], s[i]
    w = 0.0 if b == a else (q - a) / (b - a)
    return float(np.exp(log_theta[i - 1] + w * (log_theta[i] - log_theta[i - 1])))


def _rejection_tails(plan: SequentialPlan, crit: np.ndarray, p1: float) -> list[tuple[int, np.ndarray]]:
    """Per look j: (offset, tails) with tails[r, i] = P(the plan first rejects at look j with at least offset + i
    hypothesis failures | baseline row r); the last column is 0. Counts are kept only where Binomial(n_j, p1) has
    mass above 1e-15 (the rest is below the recursion's rounding), so large looks cost what their spread costs."""
    rows = crit.shape[1]
    alive, off = np.ones((rows, 1)), 0
    before = 0
    out = []
    for j, n in enumerate(plan.looks):
        m = n - before
        a, b = _window(m, p1)
        step = st.binom.pmf(np.arange(a, b + 1), m, p1)
        alive = np.clip(signal.fftconvolve(alive, step[None, :], axes=1), 0.0, None)
        off += a
        lo, hi = _window(n, p1)  # trim to where the cumulative count has mass
        keep_lo, keep_hi = max(lo, off), min(hi, off + alive.shape[1] - 1)
        alive = alive[:, keep_lo - off:keep_hi - off + 1]
        off = keep_lo
        hit = (off + np.arange(alive.shape[1]))[None, :] >= crit[j][:, None]
        stopped = np.where(hit, alive, 0.0)
        tails = np.zeros((rows, alive.shape[1] + 1))
        tails[:, :-1] = np.cumsum(stopped[:, ::-1], axis=1)[:, ::-1]
        out.append((off, tails))
        alive = np.where(hit, 0.0, alive)
        before = n
    return out


def _window(n: int, p: float) -> tuple[int, int]:
    return int(st.binom.ppf(1e-15, n, p)), int(st.binom.isf(1e-15, n, p))


def conditional_effect(plan: SequentialPlan, k1: int, look: int, k0: int, n0: int) -> RatioCI:
    """The selection-corrected rate ratio of one confirmation that rejected at ``look`` with k1 failures."""
    est, low, high = conditional_effects(plan, n0, np.array([k0]), np.array([look]), np.array([k1]))[0]
    if math.isnan(est):
        raise ValueError(f"{k1} failures at look {look} against {k0}/{n0} is not a rejection of {plan.looks}")
    return RatioCI(ratio=float(est), low=float(low), high=float(high), method=METHOD)
