"""The effect a finding reports, corrected for the winner's curse.

A confirmation is recorded only when it rejects, and it stops at the first look that rejects: among recorded
findings its naive rate ratio is biased upwards. `stats.conditional_effect` conditions on that selection. Simulated
here through the confirmation's own decision rule (Fisher at the plan's thresholds, futility stops included): at a
true 2x and 3x the median of the corrected estimate is within 5% of the truth and its 95% interval covers the truth
in at least 94% of recorded findings.
"""

from __future__ import annotations

import numpy as np
import pytest

from sleuth.tools import investigation_tools, stats
from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.context import ToolContext
from sleuth.tools.investigation import Budget, Investigation
from sleuth.tools.stats.shared_baseline import critical_counts
from tests.fakeworld import fake_backends

RUNS = 10_000
Z95 = 1.959963984540054


def simulate(plan: stats.SequentialPlan, n0: int, p0: float, ratio: float, runs: int,
             rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(k0, stopping look, failures at that look) of the attempts that rejected, as measure_rate decides them."""
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


# The protocol planner's first two confirmation designs, at 16 declared attempts (alpha/16), class rate 5%.
@pytest.mark.parametrize(("first", "max_n", "n0"), [(30, 300, 300), (50, 800, 500)])
@pytest.mark.parametrize("ratio", [2.0, 3.0])
def test_recorded_effects_are_median_unbiased_and_covered(first, max_n, n0, ratio):
    naive, est, coverage = recorded_effects(first, max_n, n0, 0.05 / 16, 0.05, ratio, seed=int(ratio * 10 + first))
    assert len(naive) >= 2500  # recorded findings among the 10,000 attempts
    assert abs(np.median(est[:, 0]) / ratio - 1) <= 0.05
    assert coverage.rate >= 0.94
    if (first, ratio) == (30, 2.0):
        assert np.median(naive) / ratio > 1.3  # the curse the correction removes: 2.8x at a true 2x
        # Median-unbiased but spread out: findings barely past the threshold get an estimate below 1x (29%).
        assert 0.2 < np.mean(est[:, 0] < 1) < 0.4


@pytest.mark.slow
@pytest.mark.parametrize(("first", "max_n", "n0", "level", "p0"),
                         [(50, 800, 500, 0.05 / 16, 0.02), (30, 300, 300, 0.05 / 40, 0.2),
                          (100, 2000, 1500, 0.05 / 40, 0.05)])
@pytest.mark.parametrize("ratio", [2.0, 3.0])
def test_recorded_effects_at_other_rates_and_designs(first, max_n, n0, level, p0, ratio):
    naive, est, coverage = recorded_effects(first, max_n, n0, level, p0, ratio, seed=7)
    # Median-unbiased: as often below the truth as above. (At 2% and 2x, where an attempt rejects 18% of the time,
    # the estimates spread from 0.4x to 3.1x between their quartiles and their median is 1.8x-1.9x: 53% below.)
    assert abs(np.mean(est[:, 0] < ratio) - 0.5) <= 0.05
    if (p0, ratio) != (0.02, 2.0):
        assert abs(np.median(est[:, 0]) / ratio - 1) <= 0.05
    assert coverage.rate >= 0.94


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
    # (an exact conditional estimate does this: 29% of recorded findings at a true 2x with this design), and the
    # interval stays wide enough to cover it.
    assert barely.ratio < 1 < 2.3 < barely.high and barely.low <= barely.ratio
    assert stats.conditional_effect(plan, crit + 10, 3, 15, 300).ratio > 2
    with pytest.raises(ValueError, match="not a rejection"):
        stats.conditional_effect(plan, crit - 1, 3, 15, 300)


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
