"""The group-sequential plan: its alpha spending, its decisions, and simulations of its error rate and power."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import stats as st

from sleuth.tools import stats

LOOKS = [50, 100, 200, 400]
N0 = 1000
ALPHA = 0.05


# --------------------------------------------------------------------------------------------------------- spending


def test_obrien_fleming_thresholds_are_spending_increments():
    plan = stats.SequentialPlan(looks=LOOKS, alpha=ALPHA)
    z = st.norm.ppf(1 - ALPHA / 2)
    cumulative = [2 * st.norm.sf(z / math.sqrt(n / 400)) for n in LOOKS]  # 2 - 2 Phi(z_{1-a/2} / sqrt(t))
    expected = np.diff([0.0, *cumulative])
    th = plan.thresholds()
    assert th == pytest.approx(expected.tolist(), rel=1e-9)
    assert th[0] == pytest.approx(2.963e-8, rel=1e-3) and th[-1] == pytest.approx(0.04443, rel=1e-3)
    assert sum(th) == pytest.approx(ALPHA, abs=1e-15) and sum(th) <= ALPHA + 1e-16
    assert all(a < b for a, b in zip(th, th[1:]))  # O'Brien–Fleming keeps most of alpha for the end


def test_pocock_and_bonferroni_thresholds():
    pocock = stats.SequentialPlan(looks=LOOKS, spending="pocock").thresholds()
    cumulative = [ALPHA * math.log(1 + (math.e - 1) * n / 400) for n in LOOKS]
    assert pocock == pytest.approx(np.diff([0.0, *cumulative]).tolist(), rel=1e-12)
    assert sum(pocock) == pytest.approx(ALPHA, abs=1e-15)
    assert pocock[0] > 100 * stats.SequentialPlan(looks=LOOKS).thresholds()[0]  # Pocock spends early
    assert stats.SequentialPlan(looks=LOOKS, spending="bonferroni").thresholds() == [ALPHA / 4] * 4
    # One look is a fixed-size test at the full alpha.
    assert stats.SequentialPlan(looks=[300], spending="pocock").thresholds() == [ALPHA]
    assert stats.alpha_spent(0.0, ALPHA, "obrien-fleming") == 0.0
    assert stats.alpha_spent(1.0, ALPHA, "obrien-fleming") == pytest.approx(ALPHA, rel=1e-12)


def test_final_threshold_spends_what_is_left():
    plan = stats.SequentialPlan(looks=LOOKS)
    th = plan.thresholds()
    assert plan.final_threshold(3) == pytest.approx(th[3], rel=1e-12)
    assert plan.final_threshold(1) == pytest.approx(ALPHA - th[0], rel=1e-12)
    assert plan.final_threshold(0) == ALPHA
    # Budget ran out after look 2: 5/100 vs 15/1000 gives p ~ 0.029, too weak for look 2's own threshold but not for
    # the alpha left over.
    p = float(stats.fisher_p_greater(5, 100, 15, 1000))
    assert th[1] < p < ALPHA - th[0]
    assert plan.decide(1, 5, 100, 15, 1000).action == "continue"
    final = plan.decide(1, 5, 100, 15, 1000, final=True)
    assert final.action == "success" and final.threshold == pytest.approx(ALPHA - th[0])


def test_decide_success_futility_continue():
    plan = stats.SequentialPlan(looks=LOOKS)
    d = plan.decide(0, 30, 50, 50, N0)
    assert d.action == "success" and d.look == 0
    assert d.p_value == pytest.approx(st.hypergeom.sf(29, 50 + N0, 30 + 50, 50), rel=1e-9)
    assert d.threshold == plan.thresholds()[0] and "p =" in d.reason
    # 1/200 against 10%: the rate ratio's upper bound is far below 1.
    f = plan.decide(2, 1, 200, 100, N0)
    assert f.action == "futility" and stats.rate_ratio(1, 200, 100, N0).high < 1.0
    c = plan.decide(1, 8, 100, 50, N0)
    assert c.action == "continue" and c.p_value > c.threshold
    last = plan.decide(3, 21, 400, 50, N0)
    assert last.action == "continue" and "inconclusive" in last.reason
    # A stricter futility rule (effects under 2x are not worth pursuing) stops here: the upper bound is ~1.72.
    assert stats.SequentialPlan(looks=LOOKS, futility_ratio=2.0).decide(3, 21, 400, 50, N0).action == "futility"


def test_decide_threshold_is_inclusive():
    # p <= alpha_j rejects: a Bonferroni plan at exactly the p of a fixed table.
    p = float(stats.fisher_p_greater(6, 20, 1, 20))
    plan = stats.SequentialPlan(looks=[20, 40], alpha=2 * p, spending="bonferroni")
    assert plan.decide(0, 6, 20, 1, 20).action == "success"
    assert stats.SequentialPlan(looks=[20, 40], alpha=1.99 * p, spending="bonferroni").decide(
        0, 6, 20, 1, 20).action != "success"


def test_plan_validation():
    for looks in ([], [100, 50], [0, 10], [50, 50]):
        with pytest.raises(ValidationError):
            stats.SequentialPlan(looks=looks)
    with pytest.raises(ValidationError):
        stats.SequentialPlan(looks=LOOKS, alpha=1.5)
    with pytest.raises(ValidationError):
        stats.SequentialPlan(looks=LOOKS, spending="haybittle")
    plan = stats.SequentialPlan(looks=LOOKS)
    with pytest.raises(ValueError, match="look"):
        plan.decide(4, 1, 10, 1, 10)
    with pytest.raises(ValueError):
        plan.decide(0, 11, 10, 1, 10)


def test_default_plan_doubles_up_to_max_n():
    assert stats.default_plan(400).looks == [50, 100, 200, 400]
    assert stats.default_plan(800, first=100).looks == [100, 200, 400, 800]
    assert stats.default_plan(500).looks == [50, 100, 200, 500]  # not ..., 400, 500: too small a last step
    assert stats.default_plan(600).looks == [50, 100, 200, 400, 600]
    assert stats.default_plan(100, first=100).looks == [100]
    assert stats.default_plan(60, first=100).looks == [60]
    p = stats.default_plan(400, alpha=0.01)
    assert p.alpha == 0.01 and p.spending == "obrien-fleming" and sum(p.thresholds()) == pytest.approx(0.01)


def test_overall_p_value():
    plan = stats.SequentialPlan(looks=LOOKS)
    th = plan.thresholds()
    assert plan.overall_p_value([0.5, 0.02]) == pytest.approx(min(1.0, 0.02 * ALPHA / th[1]))
    assert plan.overall_p_value([1e-12]) == pytest.approx(1e-12 * ALPHA / th[0])
    assert plan.overall_p_value([0.9, 0.9, 0.9, 0.9]) == 1.0  # 0.9 * alpha / alpha_4 > 1, clipped
    with pytest.raises(ValueError):
        plan.overall_p_value([])


# ------------------------------------------------------------------------------------------------------- simulation


def simulate(plan: stats.SequentialPlan, p1: float, p0: float, trials: int, seed: int,
             stop_after: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run `trials` sequential tests; returns each trial's final action, the look it stopped at, its overall p.

    Counts are drawn with numpy all at once (baseline of N0 per trial, hypothesis in batches up to each look);
    the decisions are the plan's own `decide`, so the simulation checks the code that runs in an audit.
    """
    rng = np.random.default_rng(seed)
    looks = np.asarray(plan.looks)
    k0 = rng.binomial(N0, p0, size=trials)
    k1 = rng.binomial(np.diff(looks, prepend=0), p1, size=(trials, len(looks))).cumsum(axis=1)
    last = len(looks) - 1 if stop_after is None else stop_after
    actions, stopped, overall = [], np.empty(trials, int), np.empty(trials)
    for i in range(trials):
        ps = []
        for j in range(last + 1):
            d = plan.decide(j, int(k1[i, j]), int(looks[j]), int(k0[i]), N0, final=j == last)
            ps.append(d.p_value)
            if d.action != "continue" or j == last:
                break
        actions.append(d.action)
        stopped[i] = j
        overall[i] = plan.overall_p_value(ps)
    return np.asarray(actions), stopped, overall


def tolerance(trials: int, rate: float = ALPHA) -> float:
    # The simulated false-positive rate estimates the true one with binomial standard error sqrt(a (1 - a) / N).
    # If the true rate were exactly alpha, the estimate would exceed alpha + 3 SE only with probability ~0.13%; so a
    # rate above that bound means the plan's error really exceeds alpha. (The seeds are fixed, so the test is
    # deterministic; the bound is what makes it meaningful.)
    return 3.0 * math.sqrt(rate * (1.0 - rate) / trials)


@pytest.mark.e2e  # 8,000 simulated runs; the other spendings' simulations stay in the fast tier
def test_null_false_positive_rate_obrien_fleming():
    trials = 8000
    plan = stats.SequentialPlan(looks=LOOKS)
    actions, _, overall = simulate(plan, 0.05, 0.05, trials, seed=20240)
    fpr = float(np.mean(actions == "success"))
    assert fpr <= ALPHA + tolerance(trials)  # measured 0.036 (Fisher's test is conservative at these counts)
    # The overall p-value agrees with the decisions: it is <= alpha exactly when some look rejected.
    assert np.array_equal(overall <= ALPHA, actions == "success")


def test_null_simulation_would_catch_naive_repeated_testing():
    # Same kind of data, but rejecting whenever the nominal p <= 0.05 at any look: the error inflates well past the
    # bound the plan is held to, so the simulation is able to see an invalid procedure.
    trials = 8000
    rng = np.random.default_rng(20240)
    looks = np.asarray(LOOKS)
    k0 = rng.binomial(N0, 0.05, size=trials)
    k1 = rng.binomial(np.diff(looks, prepend=0), 0.05, size=(trials, 4)).cumsum(axis=1)
    p = stats.fisher_p_greater(k1, looks[None, :], k0[:, None], N0)
    naive = float(np.mean((p <= ALPHA).any(axis=1)))
    assert naive > ALPHA + tolerance(trials)  # measured 0.086


@pytest.mark.parametrize("spending", ["pocock", "bonferroni"])
def test_null_false_positive_rate_other_spending(spending):
    trials = 4000
    plan = stats.SequentialPlan(looks=LOOKS, spending=spending)
    actions, stopped, _ = simulate(plan, 0.2, 0.2, trials, seed=7)
    assert np.mean(actions == "success") <= ALPHA + tolerance(trials)  # measured 0.031 (pocock), 0.029 (bonferroni)
    assert np.mean((actions == "success") & (stopped < 3)) > 0  # these spend alpha early, and it is used


def test_null_false_positive_rate_when_truncated_at_the_final_threshold():
    # The budget ends the plan after its second look, which then spends all the alpha left.
    trials = 4000
    actions, stopped, _ = simulate(stats.SequentialPlan(looks=LOOKS), 0.05, 0.05, trials, seed=11, stop_after=1)
    assert stopped.max() == 1
    assert np.mean(actions == "success") <= ALPHA + tolerance(trials)  # measured 0.034


def test_power_with_a_fivefold_rate_stops_early_for_success():
    trials = 2000
    plan = stats.SequentialPlan(looks=LOOKS)
    actions, stopped, _ = simulate(plan, 0.25, 0.05, trials, seed=3)
    success = actions == "success"
    assert success.mean() >= 0.95  # measured 1.000
    assert np.mean(success & (stopped < 3)) >= 0.8  # measured 1.000: most stop at 100 images of 400
    images = np.asarray(LOOKS)[stopped]
    assert images.mean() < 150  # measured 93.5


def test_futility_stops_a_hypothesis_that_fails_less_than_baseline():
    trials = 1000
    actions, stopped, _ = simulate(stats.SequentialPlan(looks=LOOKS), 0.01, 0.10, trials, seed=5)
    assert np.mean(actions == "futility") >= 0.95 and np.mean(stopped <= 1) >= 0.9  # measured 1.000 and 0.954
