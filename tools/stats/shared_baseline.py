"""Exact error rates of confirmation attempts that share one baseline.

Every confirmation attempt of an investigation compares its fresh images with the same confirmation baseline k0/n0.
Fisher's p-value is valid averaged over k0, not given k0: a planner that sees k0 and then picks an attempt's sizes
can pick, for each k0, the sizes most likely to reject. These functions compute, for a sequential plan and a baseline
size, the probability that an attempt rejects given each k0 (`rejection_given_baseline`), and from it the
family-wise error of M attempts whose sizes are fixed before k0 is drawn or chosen from k0 (`attempts_fwer`).
They are the exact counterpart of the simulations in tests/test_fixed_designs.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import signal
from scipy import stats as st

from sleuth.tools.stats.sequential import SequentialPlan

TAIL = 1e-13
"""Baseline counts less likely than this (summed over both tails) are left out; their mass bounds the error."""


def baseline_counts(n0: int, p0: float) -> tuple[np.ndarray, np.ndarray]:
    """The baseline counts k0 worth computing at rate p0, and their binomial probabilities."""
    lo, hi = st.binom.ppf(TAIL / 2, n0, p0), st.binom.isf(TAIL / 2, n0, p0)
    k0 = np.arange(int(lo), int(hi) + 1)
    return k0, st.binom.pmf(k0, n0, p0)


def critical_counts(plan: SequentialPlan, k0: np.ndarray, n0: int) -> np.ndarray:
    """c[j, i]: the fewest hypothesis failures at look j that reject against baseline k0[i] (n_j + 1: never).

    Fisher's p falls as k1 grows, so a bisection over k1 finds it for every k0 at once."""
    out = np.empty((len(plan.looks), len(k0)), dtype=np.int64)
    for j, (n, a) in enumerate(zip(plan.looks, plan.thresholds())):
        lo, hi = np.zeros(len(k0), dtype=np.int64), np.full(len(k0), n + 1, dtype=np.int64)
        while np.any(lo < hi):
            mid = (lo + hi) // 2
            p = st.hypergeom.sf(mid - 1, n + n0, mid + k0, n)  # Fisher's one-sided p, as fisher_p_greater
            rejects = (p <= a) & (mid <= n)
            hi = np.where(rejects, mid, hi)
            lo = np.where(rejects, lo, mid + 1)
        out[j] = lo
    return out


def rejection_given_baseline(plan: SequentialPlan, n0: int, p0: float, p1: float | None = None
                             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(k0, P(k0), P(the plan rejects at some look | k0)) when the hypothesis fails at p1 (default p0: a null).

    Futility stops are ignored: they only remove rejections, so this is the most a planner can get from the plan.
    """
    p1 = p0 if p1 is None else p1
    k0, w = baseline_counts(n0, p0)
    crit = critical_counts(plan, k0, n0)
    alive = np.zeros((len(k0), 1))
    alive[:, 0] = 1.0  # no hypothesis image yet: k1 = 0 with probability 1
    rejected = np.zeros(len(k0))
    before = 0
    for j, n in enumerate(plan.looks):
        step = st.binom.pmf(np.arange(n - before + 1), n - before, p1)
        alive = np.clip(signal.fftconvolve(alive, step[None, :], axes=1), 0.0, None)
        cols = np.arange(alive.shape[1])[None, :]
        hit = cols >= crit[j][:, None]
        rejected += (alive * hit).sum(axis=1)
        alive = np.where(hit, 0.0, alive)
        before = n
    return k0, w, np.clip(rejected, 0.0, 1.0)


def attempts_fwer(plans: Sequence[SequentialPlan], n0: int, p0: float, attempts: int, *, adaptive: bool
                  ) -> float:
    """Family-wise error of ``attempts`` null attempts against one baseline of n0 images at rate p0.

    ``adaptive=False``: every attempt uses one plan fixed before k0 is drawn; the worst of ``plans`` is returned.
    ``adaptive=True``: each attempt uses, given k0, whichever of ``plans`` rejects most often (the planner that
    chooses sizes after seeing the baseline). Attempts are independent given k0 (fresh seeds), so the error given k0
    is 1 - (1 - r(k0))^attempts.
    """
    rows = [rejection_given_baseline(plan, n0, p0) for plan in plans]
    w = rows[0][1]
    r = np.stack([row[2] for row in rows])
    if adaptive:
        return float(np.sum(w * (1.0 - (1.0 - r.max(axis=0)) ** attempts)))
    return float(np.max(np.sum(w[None, :] * (1.0 - (1.0 - r) ** attempts), axis=1)))
