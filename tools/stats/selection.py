"""The effect of a confirmed hypothesis, corrected for its selection: median-unbiased given that the test rejected.

A finding is recorded only when its confirmation rejects, and a sequential confirmation stops at the first look that
rejects; both pick out samples where the hypothesis happened to fail often and the baseline rarely. Among recorded
findings the naive rate ratio (k1/n1) / (k0/n0) is biased upwards (the winner's curse; at a true 2x its median is
well above 2x). The estimate here conditions on the selection instead, exactly and without a nuisance rate:

- An outcome is (baseline count k0 of n0, stopping look J, hypothesis failures x of n_J at that look). Its
  probability under rates (p0, p1) is C(n0, k0) A_J(x, k0) p0^k0 (1 - p0)^(n0 - k0) p1^x (1 - p1)^(n_J - x), where
  A_J(x, k0) counts the orders of the hypothesis images' failures, look by look (products of binomial
  coefficients), that reject at look J and at no look before against k0. Given J and the failures in all,
  S = k0 + x, this is proportional to C(n0, S - x) A_J(x, S - x) psi^x, with psi the odds ratio
  [p1 / (1 - p1)] / [p0 / (1 - p0)]: the baseline rate drops out (as in Fisher's exact test, which conditions on
  the same total). The weights come from an exact recursion over the looks (binomial increments, absorbed at the
  first rejecting look) for every baseline count k0 = S - x at once.
- Given (J, S, rejection) x is a one-parameter exponential family in log psi, so its tail probabilities are
  monotone in psi and each equation below has one root. The estimate is the mid-p median, P(X > x) +
  P(X = x) / 2 = 1/2 (as much probability above the observed count as below it). The odds ratio's 95% interval is
  exact: its ends solve P(X >= x) = 0.025 and P(X <= x) = 0.025, so it covers the odds ratio in at least 95% of
  rejections with this J and S, hence of all recorded findings, whatever the baseline rate. The estimate lies
  inside it.
- An outcome barely past its threshold is the least count of its total that rejects at its look (the split with
  one failure fewer in the hypothesis and one more in the baseline does not reject there): P(X >= x) = 1 at every
  psi, so its interval starts at 0 (given the selection the data exclude no smaller ratio), and the mid-p equation
  has no root (its left side exceeds 1/2, reaching it only as psi -> 0). The count is a median of its conditional
  distribution at every psi up to the one where P(X > x) = 1/2; the estimate is midway, in that probability,
  between there and psi = 0: P(X > x) = 1/4 (``EDGE``). Hirji, Tsiatis and Mehta's median-unbiased estimate
  (1989) takes the end itself, P(X > x) = 1/2; where most rejections are barely past the threshold (weak effects,
  rare failures) that puts most estimates above the truth (at a class rate of 2% and a true 2x, 28% of them
  below it and a median of 2.4x; tests/test_selection.py), while with 1/4 recorded findings are median-unbiased
  within a few percent over the designs and rates simulated there, but one: a class failing 2% against the 3x
  pass's 300 baseline images, where 41% of the estimates fall below a true 3x. Likewise at the greatest
  count of its total (k0 = 0, say), with P(X < x) = 1/4 and an odds ratio's interval open to infinity. The only
  count of its total that rejects at its look (both at once) leaves nothing to estimate from: nan, with an interval
  from 0.
- All three are reported as rate ratios, p1 / p0 = psi / (1 - p0 + psi p0). The estimate takes the baseline rate
  that with its odds ratio accounts for every failure seen (n0 p0 + n_J p1 = S, the maximum-likelihood p0 given
  psi). Each end of the interval is the least (lower end) or greatest (upper end) rate ratio at its odds ratio over
  that rate and the ends of the baseline's exact (Clopper-Pearson) 95% interval, so the estimate stays inside it.
  Where failures are rare the rate ratio is within a few percent of the odds ratio whatever p0, and this widens the
  interval little; where the hypothesis fails on nearly every image the rate ratio is nearly 1 / p0, and the
  baseline's interval decides the ends (one p0 alone would put the upper end near 1 / p0-hat, short of the truth
  whenever the baseline came out high). The baseline's interval is exact unconditionally, not given the selection,
  so the rate ratio's coverage is measured rather than guaranteed: 96% to 99% of recorded findings over the
  designs, rates and ratios of tests/test_selection.py, a hypothesis failing on 95% of its images among them.

A futility stop on the hypothesis's own rate (``futility_rate``: measure_rate stops once the Wilson 95% upper end of
its failure rate is below it, at every look but the last) is part of the recursion: it depends on the hypothesis's
failures alone, so it is a lower boundary on x at each look, and an attempt it would have stopped is not among the
recorded ones. The plan's own futility stop on the rate ratio, which depends on the baseline too, is left out of the
recursion, and so is an early end for want of images; the bias and coverage measured with them in
(tests/test_selection.py) are what docs/statistics.md reports.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as st

from sleuth.tools.stats.rates import RatioCI, _wilson, z_quantile
from sleuth.tools.stats.sequential import SequentialPlan
from sleuth.tools.stats.shared_baseline import critical_counts

LEVEL = 0.95
EDGE = 0.25
"""At the least count of its total, P(X > x) for the estimate (the mid-p equation has no root there); at the
greatest, P(X < x). See the module's docstring."""
SPAN = 50.0
"""The log odds ratios searched: within this of the outcome's naive log odds ratio (beyond it an end reads 0 or inf)."""
STEPS = 60
"""Bisection steps over the search span (to about 1e-16 of it)."""
METHOD = "conditional median-unbiased (mid-p; given rejection at its look and the failures in all)"


def futility_floor(plan: SequentialPlan, futility_rate: float | None) -> np.ndarray:
    """Per look, the fewest hypothesis failures that keep an attempt going past it: the Wilson 95% upper end of x/n
    at least ``futility_rate`` (0 at the last look, or without a futility rate)."""
    floor = np.zeros(len(plan.looks), dtype=np.int64)
    if futility_rate is None:
        return floor
    z = z_quantile(0.95)
    for j, n in enumerate(plan.looks[:-1]):  # as measure_rate decides it: binomial_rate(k, n).high < futility_rate
        floor[j] = next((k for k in range(n + 1) if _wilson(k, n, z)[1] >= futility_rate), n + 1)
    return floor


def conditional_effects(plan: SequentialPlan, n0: int, k0: np.ndarray, look: np.ndarray, x: np.ndarray,
                        futility_rate: float | None = None) -> np.ndarray:
    """For outcomes (baseline k0/n0, stopping look index, hypothesis failures x at that look), all of them rejections
    of ``plan``: an array (outcomes, 3) of the median-unbiased ratio and its 95% interval's ends (nan for an
    outcome that is not a rejection of the plan). ``futility_rate``: the attempt's stop on its own failure rate (the
    module's docstring)."""
    k0, look, x = (np.asarray(a, dtype=np.int64) for a in (k0, look, x))
    looks = np.asarray(plan.looks)
    out = np.full((len(k0), 3), math.nan)  # nan: not a rejection of this plan, nothing to condition on
    if len(k0) == 0:
        return out
    n_obs = looks[np.clip(look, 0, len(looks) - 1)]
    valid = (look >= 0) & (look < len(looks)) & (k0 >= 0) & (k0 <= n0) & (x >= 0) & (x <= n_obs)
    if not valid.any():
        return out
    total = k0 + x
    crit = critical_counts(plan, np.arange(min(n0, int(total[valid].max())) + 1), n0)  # (looks, k0 rows)
    rejected = np.zeros(len(k0), dtype=bool)
    rejected[valid] = x[valid] >= crit[look[valid], k0[valid]]
    todo = np.flatnonzero(rejected)
    if len(todo) == 0:
        return out
    # Per outcome: the log weights of its conditional distribution at psi = 1 over x' = 0..S (-inf off its support).
    weights: list[np.ndarray] = []
    floor = futility_floor(plan, futility_rate)
    for s in np.unique(total[todo]):
        group = todo[total[todo] == s]
        first = group[0]
        lw = _stratum(plan, n0, int(s), crit, p0=(k0[first] + 0.5) / (n0 + 1.0),
                      p1=(x[first] + 0.5) / (n_obs[first] + 1.0), floor=floor)
        weights.extend(lw[look[o]] for o in group)
    order = np.concatenate([todo[total[todo] == s] for s in np.unique(total[todo])])
    width = max(len(w) for w in weights)
    lw = np.full((len(order), width), -np.inf)
    for i, w in enumerate(weights):
        lw[i, :len(w)] = w
    # The naive log odds ratio centres the search (0.5 added to each count so that zero counts have one).
    xo, ko, no = x[order], k0[order], n_obs[order]
    center = np.log((xo + 0.5) / (no - xo + 0.5)) - np.log((ko + 0.5) / (n0 - ko + 0.5))
    psi = _solve(lw, xo, center)
    # As rate ratios: the estimate at the baseline rate profiled at it; each end the least (lower) or greatest
    # (upper) over that profiled rate and the ends of the baseline's exact 95% interval.
    so = total[order]
    profiled = [_theta(psi[:, c], _profiled_p0(psi[:, c], so, n0, no)) for c in range(3)]
    tail = (1 - LEVEL) / 2
    with np.errstate(invalid="ignore"):
        p0_lo = np.where(ko > 0, st.beta.ppf(tail, ko, n0 - ko + 1), 0.0)
        p0_hi = np.where(ko < n0, st.beta.ppf(1 - tail, ko + 1, n0 - ko), 1.0)
    low = np.stack([profiled[1], _theta(psi[:, 1], p0_lo), _theta(psi[:, 1], p0_hi)])
    high = np.stack([profiled[2], _theta(psi[:, 2], p0_lo), _theta(psi[:, 2], p0_hi)])
    out[order, 0] = profiled[0]
    out[order, 1] = low.min(axis=0)
    out[order, 2] = high.max(axis=0)
    return out


def _stratum(plan: SequentialPlan, n0: int, s: int, crit: np.ndarray, p0: float, p1: float,
             floor: np.ndarray | None = None) -> np.ndarray:
    """lw[j, x']: log of C(n0, s - x') A_j(x', s - x') (see the module's docstring), up to a constant per look, for
    x' = 0..s; -inf where x' failures of n_j against s - x' do not first reject at look j.

    Computed as the probability of (k0 = s - x', first rejection at j with x') at reference rates (p0, p1) near the
    outcome's, less x' log of their odds ratio. The recursion keeps every count (no window, and sums of
    positive terms only: a split far from the reference gets a small weight, not rounding noise) and rescales each
    baseline row as it goes. ``floor``: per look, the fewest failures that go on past it without a futility stop."""
    looks = plan.looks
    k_lo = max(0, s - looks[-1])
    k_hi = min(n0, s)
    # Baseline counts whose split of s rejects at some look; the rest carry no weight.
    rows = np.arange(k_lo, k_hi + 1)
    reach = (s - rows)[None, :] >= crit[:, rows]
    rows = rows[reach.any(axis=0)]
    lw = np.full((len(looks), s + 1), -np.inf)
    if len(rows) == 0:
        return lw
    cols = s - int(rows[0]) + 1  # a row needs failures up to its split, s - k0
    alive = np.zeros((len(rows), cols))
    alive[:, 0] = 1.0
    scale = np.zeros(len(rows))  # log of each row's factor taken out
    split = s - rows
    at = np.arange(len(rows))
    base = st.binom.logpmf(rows, n0, p0)
    log_psi = math.log(p1 / (1 - p1)) - math.log(p0 / (1 - p0))
    before = 0
    for j, n in enumerate(looks):
        step = st.binom.pmf(np.arange(min(n - before, cols - 1) + 1), n - before, p1)
        alive = alive @ _toeplitz(step, cols)
        top = alive.max(axis=1)
        live = top > 0
        alive[live] /= top[live, None]
        scale[live] += np.log(top[live])
        hit = np.arange(cols)[None, :] >= crit[j, rows][:, None]
        stop = np.where((split <= n) & hit[at, split], alive[at, split], 0.0)
        ok = stop > 0
        lw[j, split[ok]] = np.log(stop[ok]) + scale[ok] + base[ok] - split[ok] * log_psi
        alive = np.where(hit, 0.0, alive)
        if floor is not None and floor[j] > 0:
            alive[:, :floor[j]] = 0.0  # stopped for futility after this look: not among the recorded
        before = n
    return lw


def _toeplitz(step: np.ndarray, cols: int) -> np.ndarray:
    """The matrix that adds a binomial increment to every row of counts: t[i, i + d] = step[d]."""
    t = np.zeros((cols, cols))
    i = np.arange(cols)
    for d, v in enumerate(step[:cols]):
        t[i[:cols - d], i[d:]] = v
    return t


def _solve(lw: np.ndarray, x: np.ndarray, center: np.ndarray) -> np.ndarray:
    """(outcomes, 3): the odds ratio's estimate and its interval's ends, each outcome's x against its row of log
    weights over x' = 0..width-1 (see the module's docstring), searched within SPAN of ``center`` (log psi)."""
    xs = np.arange(lw.shape[1])[None, :]
    support = np.isfinite(lw)
    lowest = np.argmax(support, axis=1)
    highest = lw.shape[1] - 1 - np.argmax(support[:, ::-1], axis=1)
    above, at = xs > x[:, None], xs == x[:, None]

    def tails(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """P(X > x) and P(X = x) at log odds ratios b."""
        z = lw + xs * b[:, None]
        w = np.exp(z - z.max(axis=1, keepdims=True))
        tot = w.sum(axis=1)
        return (w * above).sum(axis=1) / tot, (w * at).sum(axis=1) / tot

    tail = (1 - LEVEL) / 2
    # Each target is a tail probability that grows with log psi, and the value it is solved for.
    targets = [
        (lambda gt, eq: gt + eq, tail),  # the lower end: P(X >= x) = 0.025
        (lambda gt, eq: gt + eq / 2, 0.5),  # the estimate (mid-p)
        (lambda gt, eq: gt, EDGE),  # the estimate at the least count of its total
        (lambda gt, eq: gt + eq, 1 - EDGE),  # the estimate at the greatest count
        (lambda gt, eq: gt, 1 - tail),  # the upper end: P(X <= x) = 0.025
    ]
    lo = np.tile(center - SPAN, (len(targets), 1))
    hi = np.tile(center + SPAN, (len(targets), 1))
    for _ in range(STEPS):
        mid = (lo + hi) / 2
        for t, (f, q) in enumerate(targets):
            grows = f(*tails(mid[t])) < q
            lo[t] = np.where(grows, mid[t], lo[t])
            hi[t] = np.where(grows, hi[t], mid[t])
    root = (lo + hi) / 2
    # A root at the edge of the search means none within it: the end is 0 or inf.
    with np.errstate(over="ignore"):
        psi = np.exp(root)
    psi[root <= center - SPAN + 1e-6] = 0.0
    psi[root >= center + SPAN - 1e-6] = math.inf
    least, greatest = x == lowest, x == highest
    estimate = np.where(least, psi[2], np.where(greatest, psi[3], psi[1]))
    estimate[least & greatest] = math.nan
    low = np.where(least, 0.0, psi[0])
    high = np.where(greatest, math.inf, psi[4])
    return np.stack([estimate, low, high], axis=1)


def _profiled_p0(psi: np.ndarray, s: np.ndarray, n0: int, n: np.ndarray) -> np.ndarray:
    """The baseline rate p0 that with odds ratio psi accounts for the s failures seen in n0 and n images:
    n0 p0 + n p1 = s with p1 / (1 - p1) = psi p0 / (1 - p0), a quadratic in p0 (the maximum-likelihood p0 given psi).
    At psi = inf, p1 = 1."""
    s = np.asarray(s, dtype=float)
    n = np.asarray(n, dtype=float)
    g = np.where(np.isfinite(psi), psi, 1.0)
    a = n0 * (g - 1.0)
    b = n0 + n * g + s * (1.0 - g)
    with np.errstate(invalid="ignore", divide="ignore"):
        p0 = 2.0 * s / (b + np.sqrt(np.maximum(b * b + 4.0 * a * s, 0.0)))
    return np.where(np.isinf(psi), np.maximum(s - n, 0.0) / n0, p0)


def _theta(psi: np.ndarray, p0: np.ndarray) -> np.ndarray:
    """The rate ratio p1 / p0 at odds ratio psi and baseline rate p0: psi / (1 - p0 + psi p0); 1 / p0 at psi = inf."""
    with np.errstate(invalid="ignore", divide="ignore"):
        finite = psi / (1.0 + (psi - 1.0) * p0)
        top = np.where(p0 > 0, 1.0 / np.where(p0 > 0, p0, 1.0), math.inf)
    return np.where(np.isnan(psi), math.nan, np.where(np.isinf(psi), top, finite))


def conditional_effect(plan: SequentialPlan, k1: int, look: int, k0: int, n0: int,
                       futility_rate: float | None = None) -> RatioCI:
    """The selection-corrected rate ratio of one confirmation that rejected at ``look`` with k1 failures (stopped for
    futility, before it, when the Wilson upper end of its rate fell below ``futility_rate``)."""
    if not 0 <= look < len(plan.looks) or not 0 <= k1 <= plan.looks[look] or not 0 <= k0 <= n0 or \
            k1 < int(critical_counts(plan, np.array([k0]), n0)[look, 0]):
        raise ValueError(f"{k1} failures at look {look} against {k0}/{n0} is not a rejection of {plan.looks}")
    est, low, high = conditional_effects(plan, n0, np.array([k0]), np.array([look]), np.array([k1]),
                                         futility_rate)[0]
    return RatioCI(ratio=float(est), low=float(low), high=float(high), method=METHOD, confidence=LEVEL)
