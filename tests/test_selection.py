"""The effect a finding reports, corrected for the winner's curse.

A confirmation is recorded only when it rejects, and it stops at the first look that rejects: among recorded
findings its naive rate ratio is biased upwards. `stats.conditional_effect` conditions on that selection. Simulated
here through the confirmation's own decision rule (Fisher at the plan's thresholds, futility stops included): at a
true 2x and 3x the median of the corrected estimate is within 5% of the truth and its 95% interval covers the truth
in at least 95% of recorded findings. Checked against the conditional distribution enumerated order by order
(`enumerated`), and at outcomes just past the threshold at the first, a middle and the last look.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as st

from sleuth.tools import investigation_tools, stats
from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.context import ToolContext
from sleuth.tools.investigation import Budget, Investigation
from sleuth.tools.stats.shared_baseline import critical_counts
from tests.fakeworld import fake_backends

RUNS = 10_000
Z95 = 1.959963984540054


def simulate(plan: stats.SequentialPlan, n0: int, p0: float, ratio: float, runs: int,
             rng: np.random.Generator, futility_rate: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(k0, stopping look, failures at that look) of the attempts that rejected, as measure_rate decides them (with
    ``futility_rate``, also its stop once the Wilson 95% upper end of the failure rate is below it)."""
    k0 = rng.binomial(n0, p0, runs)
    crit = critical_counts(plan, np.arange(n0 + 1), n0)
    x = np.zeros(runs, dtype=np.int64)
    look = np.full(runs, -1)
    running = np.ones(runs, dtype=bool)
    before = 0
    for j, n in enumerate(plan.looks):
        x[running] += rng.binomial(n - before, ratio * p0, int(running.sum()))
        rejects = running & (x >= crit[j, k0])
        look[rejects] = j
        # Futility as SequentialPlan.decide: the Katz 95% upper bound of the ratio below 1 (0.5 added when x = 0).
        zero = x == 0
        a, b = np.where(zero, 0.5, x), np.where(zero, n + 1.0, n)
        c, d = np.where(zero, k0 + 0.5, k0), np.where(zero, n0 + 1.0, n0)
        with np.errstate(divide="ignore", invalid="ignore"):
            high = (a / b) / (c / d) * np.exp(Z95 * np.sqrt(1 / a - 1 / b + 1 / c - 1 / d))
        futile = running & ~rejects & (k0 > 0) & (high < 1.0)
        if futility_rate is not None and j + 1 < len(plan.looks):
            rate = x / n
            upper = (rate + Z95**2 / (2 * n) + Z95 * np.sqrt(rate * (1 - rate) / n + Z95**2 / (4 * n * n))) / (
                1 + Z95**2 / n)
            futile |= running & ~rejects & (upper < futility_rate)
        running &= ~(rejects | futile)
        before = n
    ok = look >= 0
    return k0[ok], look[ok], x[ok]


def recorded_effects(first: int, max_n: int, n0: int, level: float, p0: float, ratio: float, seed: int):
    plan = stats.default_plan(max_n, first=first, alpha=level)
    k0, look, x = simulate(plan, n0, p0, ratio, RUNS, np.random.default_rng(seed))
    outcomes, index = np.unique(np.stack([k0, look, x]), axis=1, return_inverse=True)
    est = stats.conditional_effects(plan, n0, *outcomes)[index.ravel()]
    naive = (x / np.asarray(plan.looks)[look]) / (np.maximum(k0, 0.5) / n0)
    covered = int(np.sum((est[:, 1] <= ratio) & (ratio <= est[:, 2])))
    return naive, est, stats.binomial_rate(covered, len(k0), method="clopper-pearson")


@pytest.mark.parametrize(("design", "p0", "ratio", "below", "low_below_one"), [
    (0, 0.05, 2.0, 0.485, 0.928), (0, 0.05, 3.0, 0.505, 0.743), (1, 0.02, 2.0, 0.508, 0.939),
    (1, 0.02, 3.0, 0.505, 0.798), (1, 0.05, 2.0, 0.502, 0.806),
    (0, 0.02, 3.0, 0.409, 0.934),  # a class failing 2% against the 300-image baseline: biased upwards
])
def test_recorded_effects_with_the_designs_the_protocol_planner_declares(design, p0, ratio, below, low_below_one):
    # Its 40 attempts at alpha/40 whatever the budget, Pocock spending, each pass's baseline size and futility rate:
    # the 3x pass's design (30 to 300 against 300) and the 2x pass's (50 to 800 against 800). The interval covers
    # the truth in 98.3% to 99.4% of recorded findings, and the estimate is median-unbiased (48.5% to 50.8% below
    # the truth), except for a class that fails rarely against the 3x pass's 300 baseline images (2%, 6 expected
    # failures): there 41% of the estimates fall below a true 3x. Most recorded findings' intervals reach below 1x
    # (74% to 94%): a lower end a reader cannot rank by (the headline bound of tests/test_bound.py can).
    from sleuth.agent.planners.protocol import pass_designs
    from sleuth.tools.ladder import PASSES

    designs = pass_designs(PASSES, 40, 20_000)
    assert [(d.key, d.spending, d.baseline_n) for d in designs[:2]] == [((30, 300), "pocock", 300),
                                                                        ((50, 800), "pocock", 800)]
    d, fut = designs[design], round(PASSES[design].worth(p0), 4)
    plan = d.plan(0.05 / 40)
    assert d.baseline_n is not None
    k0, look, x = simulate(plan, d.baseline_n, p0, ratio, RUNS, np.random.default_rng(5), futility_rate=fut)
    outcomes, index = np.unique(np.stack([k0, look, x]), axis=1, return_inverse=True)
    est = stats.conditional_effects(plan, d.baseline_n, *outcomes, futility_rate=fut)[index.ravel()]
    known = ~np.isnan(est[:, 0])  # nan: the only split of its failures that rejects, nothing to estimate from
    assert len(k0) >= 1000 and known.mean() >= 0.98
    # docs/statistics.md's figures (seeded runs; the tolerances allow another machine's arithmetic)
    assert np.mean(est[known, 0] < ratio) == pytest.approx(below, abs=0.01)
    covered = stats.binomial_rate(int(np.sum((est[:, 1] <= ratio) & (ratio <= est[:, 2]))), len(k0),
                                  method="clopper-pearson")
    assert 0.982 <= covered.rate <= 0.995  # 98.3% to 99.4%
    assert np.mean(est[:, 1] < 1) == pytest.approx(low_below_one, abs=0.01)


# Plain sequential designs of the sizes of the protocol planner's first two passes (30 to 300 against 300, 50 to 800
# against 500), O'Brien-Fleming spending at alpha/16, no futility stop, class rate 5%: the estimator on its own.
# The designs the protocol planner declares: test_recorded_effects_with_the_designs_the_protocol_planner_declares.
@pytest.mark.parametrize(("first", "max_n", "n0"), [(30, 300, 300), (50, 800, 500)])
@pytest.mark.parametrize("ratio", [2.0, 3.0])
def test_recorded_effects_are_median_unbiased_and_covered(first, max_n, n0, ratio):
    naive, est, coverage = recorded_effects(first, max_n, n0, 0.05 / 16, 0.05, ratio, seed=int(ratio * 10 + first))
    assert len(naive) >= 2500  # recorded findings among the 10,000 attempts
    # docs/statistics.md's figures: median corrected and naive ratios, the share below the truth, coverage, the share
    # below 1x (the runs are seeded; the tolerances allow another machine's arithmetic).
    med, med_naive, below, covered, below_one = {
        (30, 2.0): (1.93, 2.82, 0.531, 0.988, 0.350), (30, 3.0): (2.99, 3.14, 0.503, 0.985, 0.066),
        (50, 2.0): (1.99, 2.20, 0.506, 0.985, 0.181), (50, 3.0): (3.00, 3.02, 0.500, 0.984, 0.067)}[first, ratio]
    assert np.median(est[:, 0]) == pytest.approx(med, abs=0.01)
    assert np.median(naive) == pytest.approx(med_naive, abs=0.01)
    assert np.mean(est[:, 0] < ratio) == pytest.approx(below, abs=0.005)
    assert coverage.rate == pytest.approx(covered, abs=0.001)
    assert np.mean(est[:, 0] < 1) == pytest.approx(below_one, abs=0.005)
    assert abs(np.median(est[:, 0]) / ratio - 1) <= 0.05
    assert abs(np.mean(est[:, 0] < ratio) - 0.5) <= 0.05
    assert coverage.rate >= 0.95  # exact given the look and the failures in all: 97.9% to 98.8% here
    assert np.all((est[:, 1] <= est[:, 0]) & (est[:, 0] <= est[:, 2]))
    if (first, ratio) == (30, 2.0):
        assert np.median(naive) / ratio > 1.3  # the curse the correction removes: 2.8x at a true 2x
        # Median-unbiased but spread out: the findings barely past the threshold (the least count of their total
        # that rejects, an interval from 0) get an estimate below 1x: 35% of them.
        below = est[:, 0] < 1
        assert 0.3 < np.mean(below) < 0.4 and np.all(est[below, 1] == 0)


def test_recorded_effects_of_a_caption_failing_on_nearly_every_image():
    # 95% failures against a class at 5% (19x): the rate ratio is nearly 1 / p0, so the baseline's uncertainty sets
    # the interval. Most attempts reject at their first look, 28 to 30 of 30.
    naive, est, coverage = recorded_effects(30, 300, 300, 0.05 / 10, 0.05, 19.0, seed=3)
    assert len(naive) == RUNS
    assert coverage.rate == pytest.approx(0.982, abs=0.001)
    assert abs(np.mean(est[:, 0] < 19.0) - 0.5) <= 0.05  # 53.2%
    assert np.all((est[:, 1] <= est[:, 0]) & (est[:, 0] <= est[:, 2]))


# The demo's design: 80 declared attempts at a 20,000-image budget (alpha/80), a baseline of 500 at 3.6%. At 2x an
# attempt rejects 14% of the time and nearly half the recorded findings are barely past the threshold.
@pytest.mark.parametrize("ratio", [2.0, 3.0])
def test_recorded_effects_with_the_demos_design(ratio):
    naive, est, coverage = recorded_effects(30, 300, 500, 0.05 / 80, 0.036, ratio, seed=11)
    assert len(naive) >= 1000
    assert np.mean(est[:, 0] < ratio) == pytest.approx({2.0: 0.478, 3.0: 0.503}[ratio], abs=0.005)
    assert coverage.rate >= 0.95
    assert np.median(naive) / ratio > 1.1  # 3.2x at a true 2x


@pytest.mark.slow
@pytest.mark.parametrize(("first", "max_n", "n0", "level", "p0"),
                         [(50, 800, 500, 0.05 / 16, 0.02), (30, 300, 300, 0.05 / 40, 0.2),
                          (100, 2000, 1500, 0.05 / 40, 0.05)])
@pytest.mark.parametrize("ratio", [2.0, 3.0])
def test_recorded_effects_at_other_rates_and_designs(first, max_n, n0, level, p0, ratio):
    naive, est, coverage = recorded_effects(first, max_n, n0, level, p0, ratio, seed=7)
    # Median-unbiased: as often below the truth as above (48.9% to 51.7%). At 2% and 2x, where an attempt rejects 18%
    # of the time and half the recorded findings are barely past the threshold, the estimates spread from 0.9x to
    # 3.5x between their quartiles around a median of 2.07x.
    assert abs(np.mean(est[:, 0] < ratio) - 0.5) <= 0.05
    assert abs(np.median(est[:, 0]) / ratio - 1) <= 0.05
    assert coverage.rate >= 0.95
    # Pinned to the seeded runs (docs/statistics.md gives the first): share below the truth, median estimate.
    below, med = {(50, 2.0): (0.489, 2.07), (50, 3.0): (0.503, 2.99), (30, 2.0): (0.512, 1.99),
                  (30, 3.0): (0.517, 2.99), (100, 2.0): (0.504, 2.00), (100, 3.0): (0.506, 2.99)}[first, ratio]
    assert np.mean(est[:, 0] < ratio) == pytest.approx(below, abs=0.005)
    assert np.median(est[:, 0]) == pytest.approx(med, abs=0.01)
    if (first, ratio) == (50, 2.0):  # an attempt rejects 18% of the time at 2% and 2x
        assert len(naive) / RUNS == pytest.approx(0.183, abs=0.005)


@pytest.mark.slow
def test_the_estimate_at_the_least_count_is_midway_and_the_end_itself_overstates(monkeypatch):
    # At 2% and 2x half the recorded findings are the least count of their total that rejects. Estimating those at
    # the largest ratio at which the count is still the conditional median (P(X > x) = 1/2, the usual convention)
    # puts 72% of all estimates above the truth, the median at 2.4x.
    from sleuth.tools.stats import selection

    monkeypatch.setattr(selection, "EDGE", 0.5)
    naive, est, coverage = recorded_effects(50, 800, 500, 0.05 / 16, 0.02, 2.0, seed=7)
    assert np.mean(est[:, 0] < 2.0) < 0.35 and np.median(est[:, 0]) > 2.3


def test_a_supported_confirmation_reports_its_corrected_effect(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")
    inv = Investigation(backends=fake_backends(), label="cat", artifacts=store, budget=Budget(images=20_000),
                        max_confirmations=2)
    ctx = ToolContext(investigation=inv, artifacts=store)
    r = investigation_tools().call("measure_rate", {"caption": "a realistic photograph of a cat. it is in the snow.",
                                                    "confirm": True, "max_n": 400, "first_n": 50}, ctx)
    assert r.verdict == "supported" and r.effect is not None
    plan = stats.default_plan(400, first=50, alpha=0.05 / 2)
    t = inv.test(r.test_id)
    again = stats.conditional_effect(plan, t.k1, len(r.looks) - 1, t.k0, t.n0)
    assert (r.effect.ratio, r.effect.low, r.effect.high) == (again.ratio, again.low, again.high)
    assert r.effect.low < r.effect.ratio < r.effect.high and t.effect == r.effect
    # Stopped at its first rejecting look, the sample overstates the effect: the correction lowers it.
    assert r.effect.ratio <= r.rate_ratio.ratio


def test_an_outcome_the_plan_does_not_reject_has_no_conditional_estimate():
    plan = stats.default_plan(300, first=30, alpha=0.05 / 16)
    crit = int(critical_counts(plan, np.array([15]), 300)[-1, 0])  # 35 failures of 300 against 15/300
    barely = stats.conditional_effect(plan, crit, 3, 15, 300)
    # Barely past the boundary, selection explains much of the excess: the estimate falls far below the naive 2.3x
    # (35% of recorded findings at a true 2x with this design get one below 1x), and the interval, from 0, stays
    # wide enough to cover it.
    assert barely.low == 0 < barely.ratio < 1 < 2.3 < barely.high
    assert stats.conditional_effect(plan, crit + 10, 3, 15, 300).ratio > 2
    with pytest.raises(ValueError, match="not a rejection"):
        stats.conditional_effect(plan, crit - 1, 3, 15, 300)


def enumerated(plan: stats.SequentialPlan, n0: int, k0: int, look: int, x: int) -> tuple[np.ndarray, np.ndarray]:
    """The hypothesis failures x' that, with k0 + x - x' baseline failures, first reject at ``look``, and the log of
    C(n0, k0 + x - x') times the number of ways the hypothesis images can fail x' times doing so: every order of
    failures over the looks enumerated, each look's decision made by ``plan.decide``. At odds ratio psi the
    probability of x' given the look and the failures in all is proportional to that weight times psi^x'."""
    s, looks = k0 + x, plan.looks
    decided: dict[tuple[int, int, int], bool] = {}

    def rejects(j: int, c: int, b: int) -> bool:
        if (j, c, b) not in decided:
            decided[j, c, b] = plan.decide(j, c, looks[j], b, n0).action == "success"
        return decided[j, c, b]

    def ways(j: int, c: int, end: int, b: int) -> int:
        """The orders of failures from c at look j - 1 to ``end`` at ``look`` that reject there first."""
        m = looks[j] - (looks[j - 1] if j else 0)
        if j == look:
            return math.comb(m, end - c) if 0 <= end - c <= m else 0
        return sum(math.comb(m, cj - c) * ways(j + 1, cj, end, b)
                   for cj in range(c, min(c + m, end) + 1) if not rejects(j, cj, b))

    counts, weights = [], []
    for end in range(min(s, looks[look]) + 1):
        b = s - end
        if b <= n0 and rejects(look, end, b) and (w := ways(0, 0, end, b)):
            counts.append(end)
            weights.append(math.log(math.comb(n0, b)) + math.log(w))
    return np.array(counts), np.array(weights)


def crossing(counts: np.ndarray, weights: np.ndarray, x: int, tail: str, q: float) -> float:
    """The least odds ratio, on a grid 1/1000 to 1000 (steps of 0.007%), where a tail probability of x reaches q."""
    grid = np.linspace(math.log(1e-3), math.log(1e3), 200_001)
    z = weights[None, :] + grid[:, None] * counts[None, :]
    w = np.exp(z - z.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    above, at = w[:, counts > x].sum(axis=1), w[:, counts == x].sum(axis=1)
    f = {">": above, ">=": above + at, "mid": above + at / 2}[tail]
    assert f[0] < q <= f[-1]
    return math.exp(grid[int(np.argmax(f >= q))])


def at_rate(psi: float, p0: float) -> float:
    """p1 / p0 at odds ratio psi and baseline rate p0."""
    odds = psi * p0 / (1 - p0)
    return odds / (1 + odds) / p0


def as_rate_ratio(psi: float, s: int, n0: int, n: int) -> float:
    """p1 / p0 at odds ratio psi, with n0 p0 + n p1 = s."""
    def excess(p0: float) -> float:
        odds = psi * p0 / (1 - p0)
        return n0 * p0 + n * odds / (1 + odds) - s

    return at_rate(psi, optimize.brentq(excess, 1e-12, min(1 - 1e-12, s / n0), xtol=1e-15))


def widest(psi: float, s: int, n0: int, n: int, k0: int, end: str) -> float:
    """An interval's end as a rate ratio: the least or greatest at odds ratio psi over the baseline rate that
    accounts for the s failures and the ends of the baseline's exact 95% interval."""
    ci = st.binomtest(k0, n0).proportion_ci(confidence_level=0.95, method="exact")
    values = [as_rate_ratio(psi, s, n0, n), at_rate(psi, ci.low), at_rate(psi, ci.high)]
    return min(values) if end == "low" else max(values)


def test_a_confirmation_passed_at_its_last_look_by_one_failure():
    # The demo's "in a parking lot": 29/300 against 18/500, the protocol's first design at alpha/80, passed only at
    # its last look, where 29 is the fewest failures that reject against 18. Its effect had read 0.443x [0.433, 3.71].
    plan = stats.default_plan(300, first=30, alpha=0.05 / 80)
    assert plan.looks == [30, 60, 120, 300]
    assert [plan.decide(j, c, plan.looks[j], 18, 500).action for j, c in [(2, 22), (3, 28), (3, 29)]] == \
        ["continue", "continue", "success"]
    e = stats.conditional_effect(plan, 29, 3, 18, 500)
    naive = stats.rate_ratio(29, 300, 18, 500).ratio  # 2.69x
    assert e.low == 0 < e.ratio < 1 < naive < e.high
    assert e.ratio == pytest.approx(0.776, abs=5e-4) and e.high == pytest.approx(4.707, abs=5e-4)
    # Given the look and the 47 failures in all, 29 is the least hypothesis count that rejects: P(X >= 29) = 1 at
    # every ratio. The estimate is the odds ratio where P(X > 29) = 1/4, the upper end where P(X <= 29) = 0.025.
    counts, weights = enumerated(plan, 500, 18, 3, 29)
    assert counts.min() == 29 and counts.max() == 47
    assert e.ratio == pytest.approx(as_rate_ratio(crossing(counts, weights, 29, ">", 0.25), 47, 500, 300), rel=1e-4)
    high = crossing(counts, weights, 29, ">", 0.975)
    assert e.high == pytest.approx(widest(high, 47, 500, 300, 18, "high"), rel=1e-4)


def test_an_outcome_inside_its_conditional_distribution_at_a_middle_look():
    plan = stats.default_plan(300, first=30, alpha=0.05 / 80)
    e = stats.conditional_effect(plan, 26, 2, 18, 500)  # 26/120 against 18/500 (23 is the threshold there)
    counts, weights = enumerated(plan, 500, 18, 2, 26)
    assert counts.min() < 26 < counts.max()
    est, low, high = (crossing(counts, weights, 26, t, q) for t, q in [("mid", 0.5), (">=", 0.025), (">", 0.975)])
    assert (e.ratio, e.low, e.high) == pytest.approx([as_rate_ratio(est, 44, 500, 120),
                                                      widest(low, 44, 500, 120, 18, "low"),
                                                      widest(high, 44, 500, 120, 18, "high")], rel=1e-4)
    assert 1 < e.low < e.ratio < stats.rate_ratio(26, 120, 18, 500).ratio < e.high


@pytest.mark.parametrize(("first", "max_n", "level", "n0"),
                         [(30, 300, 0.05 / 80, 500), (50, 800, 0.05 / 16, 500), (30, 300, 0.05 / 16, 300)])
def test_outcomes_just_past_the_threshold_at_the_first_a_middle_and_the_last_look(first, max_n, level, n0):
    plan = stats.default_plan(max_n, first=first, alpha=level)
    last = len(plan.looks) - 1
    checked = 0
    for k0 in (1, 5, 18, 40):
        crit = critical_counts(plan, np.array([k0]), n0)[:, 0]
        for j in (0, last // 2, last):
            x, n = int(crit[j]), plan.looks[j]
            if x > n:  # no count of this look rejects against k0
                continue
            with pytest.raises(ValueError, match="not a rejection"):
                stats.conditional_effect(plan, x - 1, j, k0, n0)
            e = stats.conditional_effect(plan, x, j, k0, n0)
            naive = stats.rate_ratio(x, n, k0, n0).ratio
            # The least count of its total that rejects: an interval from 0, the estimate inside it, below the naive
            # ratio (the selection explains part of the excess), the naive ratio inside the interval.
            assert e.low == 0 < e.ratio < naive < e.high, (k0, j, x, e)
            # More failures at the same look and baseline: estimates that do not fall, each inside its interval.
            more = [stats.conditional_effect(plan, c, j, k0, n0) for c in range(x, min(n, x + 6) + 1)]
            assert all(a.ratio <= b.ratio for a, b in zip(more, more[1:]))
            assert all(m.low <= m.ratio <= m.high for m in more)
            assert more[-1].low > 0 or len(more) < 4
            checked += 1
    assert checked >= 10


def test_a_rejection_no_other_split_of_its_failures_makes_has_nothing_to_estimate_from():
    # No baseline failure: 10 of 120 reject at the middle look, and 9 against 1 baseline failure would not, so
    # given the look and the 10 failures in all the count is fixed.
    plan = stats.default_plan(300, first=30, alpha=0.05 / 80)
    assert [plan.decide(2, c, 120, b, 500).action for c, b in [(10, 0), (9, 1)]] == ["success", "continue"]
    e = stats.conditional_effect(plan, 10, 2, 0, 500)
    assert math.isnan(e.ratio) and (e.low, e.high) == (0, math.inf)
    assert enumerated(plan, 500, 0, 2, 10)[0].tolist() == [10]


def test_the_final_answer_lists_a_findings_corrected_effect_and_the_naive_one_after_it():
    from types import SimpleNamespace

    from sleuth.tools.finish import finding_line
    from sleuth.tools.stats import RatioCI

    naive = RatioCI(ratio=2.69, low=1.5, high=4.8, method="katz-log", confidence=0.95)
    corrected = RatioCI(ratio=1.94, low=0.9, high=3.9, method="conditional-median", confidence=0.95)
    f = SimpleNamespace(finding_id="f1", caption="a cat in the snow",
                        confirmation=SimpleNamespace(rate_ratio=naive, effect=corrected, adjusted_p=0.01))
    line = finding_line(f)
    assert "1.94x [0.9, 3.9] corrected for selection (naive 2.69x)" in line and line.startswith("f1 ")
    f.confirmation.effect = None  # an old transcript's finding: its confirmation's ratio
    assert "2.69x [1.5, 4.8], adjusted p" in finding_line(f)


def test_the_estimate_conditions_on_the_attempts_own_futility_stop():
    # measure_rate stops an attempt once the Wilson upper end of its failure rate is below futility_rate (every look
    # but the last): a lower boundary on its failures, look by look, which the recursion leaves out of the recorded.
    plan = stats.default_plan(300, first=30, alpha=0.05 / 40, spending="pocock")
    floor = stats.selection.futility_floor(plan, 0.15)
    assert floor[-1] == 0 and list(floor[:-1]) == [1, 4, 11]
    for j, n in enumerate(plan.looks[:-1]):
        assert stats.binomial_rate(int(floor[j]), n).high >= 0.15 > stats.binomial_rate(int(floor[j]) - 1, n).high
    assert not stats.selection.futility_floor(plan, None).any()
    # An attempt that rejected at the last look with few failures: with the stop, the paths that would have stopped
    # early are gone, and the ones left are those that failed more early on; the estimate moves.
    crit = int(critical_counts(plan, np.array([15]), 300)[-1, 0])
    without = stats.conditional_effect(plan, crit + 2, 3, 15, 300)
    with_stop = stats.conditional_effect(plan, crit + 2, 3, 15, 300, futility_rate=0.15)
    assert with_stop.ratio != pytest.approx(without.ratio, rel=1e-6)
    assert with_stop.low <= with_stop.ratio <= with_stop.high
