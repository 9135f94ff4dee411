"""The tools keep the statistics' guarantee whatever the planner does: adversarial call sequences.

A planner may cite another caption's discovery test, pass a counterfactual test off as a confirmation, confirm one
caption many times, confirm many null captions until one passes, or look at the confirmation baseline before asking
for more of it. Each is refused or accounted for, and the family-wise error of confirmed findings stays at alpha.
"""

from __future__ import annotations

import numpy as np
import pytest

from sleuth.tools import investigation_tools, stats
from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.context import ToolContext
from sleuth.tools.investigation import Budget, Investigation
from sleuth.tools.registry import ToolError
from sleuth.tools.text import pv
from tests.fakeworld import fake_backends

SNOW = "a realistic photograph of a cat. it is in the snow."
NULL = "a realistic photograph of a cat. it is daytime."  # says nothing about the background: the class's own rate


@pytest.fixture()
def ctx(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")
    inv = Investigation(backends=fake_backends(), label="cat", artifacts=store, budget=Budget(images=60_000),
                        max_confirmations=3)
    return ToolContext(investigation=inv, artifacts=store)


def call(ctx, name, **args):
    return investigation_tools().call(name, args, ctx)


def test_a_finding_needs_the_discovery_and_confirmation_of_its_own_caption(ctx):
    snow = call(ctx, "measure_rate", caption=SNOW)
    null = call(ctx, "measure_rate", caption=NULL, max_n=200)
    null_conf = call(ctx, "measure_rate", caption=NULL, confirm=True, max_n=200)
    snow_conf = call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=200)
    # Another caption's discovery test does not make a finding of the null caption, nor of the supported one.
    with pytest.raises(ToolError, match="neither that caption nor a refinement"):
        call(ctx, "record_finding", caption=NULL, discovery_test=snow.test_id, confirmation_test=null_conf.test_id)
    with pytest.raises(ToolError, match="confirmation .* measured"):
        call(ctx, "record_finding", caption=SNOW, discovery_test=snow.test_id, confirmation_test=null_conf.test_id)
    # A counterfactual test on confirmation seeds is not a confirmation, and confirms nothing.
    cf = call(ctx, "measure_rate", caption=SNOW, mode="counterfactual", confirm=True, max_n=100)
    assert cf.verdict == "supported" and ctx.investigation.confirmations_used == 2
    with pytest.raises(ToolError, match="not a confirmation measurement"):
        call(ctx, "record_finding", caption=SNOW, discovery_test=snow.test_id, confirmation_test=cf.test_id)
    with pytest.raises(ToolError, match="not a counterfactual measurement"):
        call(ctx, "record_finding", caption=SNOW, discovery_test=snow.test_id, confirmation_test=snow_conf.test_id,
             counterfactual_test=null.test_id)
    f = call(ctx, "record_finding", caption=SNOW, discovery_test=snow.test_id, confirmation_test=snow_conf.test_id,
             counterfactual_test=cf.test_id)
    assert f.confirmed and f.confirmation.test_id == snow_conf.test_id


def test_a_refinement_may_cite_the_discovery_of_the_longer_caption(ctx):
    longer = call(ctx, "measure_rate", caption=SNOW + " it is daytime.")
    conf = call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=200)
    f = call(ctx, "record_finding", caption=SNOW, discovery_test=longer.test_id, confirmation_test=conf.test_id)
    assert f.discovery.test_id == longer.test_id
    # Adding words is not refining.
    conf2 = call(ctx, "measure_rate", caption=SNOW + " it is daytime. the cat is grey.", confirm=True, max_n=200)
    with pytest.raises(ToolError, match="refinement"):
        call(ctx, "record_finding", caption=SNOW + " it is daytime. the cat is grey.",
             discovery_test=longer.test_id, confirmation_test=conf2.test_id)


def test_confirmation_attempts_are_a_declared_family_with_final_adjusted_p(ctx):
    inv = ctx.investigation
    first = call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=200)
    # Bonferroni over the three declared attempts: the adjusted p is final when printed.
    assert (first.family_size, first.adjust_method) == (3, "bonferroni")
    assert first.adjusted_p == pytest.approx(min(1.0, 3 * first.p_value))
    again = call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=200)  # a repeat is another attempt
    call(ctx, "measure_rate", caption=NULL, confirm=True, max_n=200)
    assert inv.test(first.test_id).adjusted_p == first.adjusted_p and again.family_size == 3
    with pytest.raises(ToolError, match="3 confirmation attempts are spent"):
        call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=200)
    # The confirmation baseline was drawn once: asking for a larger one later does not top it up.
    n0 = inv.baselines["confirmation"].n
    assert n0 == first.baseline.n and again.baseline.n == n0


def test_a_final_look_forced_by_the_budget_reports_the_threshold_it_used():
    plan = stats.default_plan(400, first=50, alpha=0.05)
    p = 5.7e-6
    # Tested at all the alpha (its first look is its last): the sequence's p-value is the look's own.
    assert plan.overall_p_value([p], final=True) == pytest.approx(p)
    assert plan.overall_p_value([p]) == pytest.approx(min(1.0, p * 0.05 / plan.thresholds()[0]))
    assert plan.overall_p_value([p]) > 100 * p


def _confirm_null(rng: np.random.Generator, level: float, base: tuple[int, int], rate: float) -> bool:
    """One sequential confirmation of a null caption (true rate = the baseline's) at ``level``: rejected?"""
    plan = stats.default_plan(800, first=100, alpha=level)
    k = n = 0
    for j, look in enumerate(plan.looks):
        k, n = k + int(rng.binomial(look - n, rate)), look
        action = plan.decide(j, k, n, *base).action
        if action != "continue":
            return action == "success"
    return False


def _adversary_fwer(runs: int, m: int, alpha: float, at_the_time: bool, seed: int) -> int:
    """Runs in which an adversary that confirms null captions one after another, stopping at its first success,
    got a false finding. ``at_the_time``: attempt i tested at Holm over the i attempts so far (first at alpha)."""
    rng = np.random.default_rng(seed)
    rate, n0 = 0.09, 1000
    false = 0
    for _ in range(runs):
        base = (int(rng.binomial(n0, rate)), n0)  # the shared confirmation baseline, drawn once
        for i in range(m):
            level = alpha / (i + 1) if at_the_time else alpha / m
            if _confirm_null(rng, level, base, rate):
                false += 1
                break
    return false


@pytest.mark.e2e  # a whole run or a simulation: over the fast tier's 5 seconds
def test_an_adversary_confirming_null_captions_until_one_passes_keeps_the_error_at_alpha():
    runs = 1500
    false = _adversary_fwer(runs, m=10, alpha=0.05, at_the_time=False, seed=1)
    rate = stats.binomial_rate(false, runs, method="clopper-pearson")
    assert rate.high < 0.05 and abs(false - 52) <= 3, rate  # 52/1,500 = 3.5% [2.6%, 4.5%] (docs/statistics.md)
    # The simulation can see a leak: testing each attempt at Holm over the attempts so far (an adaptive family)
    # lets the same adversary through far more often.
    leaky = _adversary_fwer(400, m=10, alpha=0.05, at_the_time=True, seed=2)
    assert stats.binomial_rate(leaky, 400, method="clopper-pearson").low > 0.05 and abs(leaky - 40) <= 3, leaky


def test_printed_p_values_are_floored():
    assert pv(3e-9) == "< 1e-06" and pv(0.0123) == "0.012" and pv(None) == "n/a"


def test_finish_lists_the_recorded_findings_and_refuses_a_summary_that_denies_them(ctx):
    snow = call(ctx, "measure_rate", caption=SNOW)
    conf = call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=200)
    call(ctx, "record_finding", caption=SNOW, discovery_test=snow.test_id, confirmation_test=conf.test_id)
    with pytest.raises(ToolError, match="says nothing was found, but 1 finding is recorded: f1"):
        call(ctx, "finish", summary="No finding was confirmed; snow was ruled out.")
    assert not ctx.finished
    done = call(ctx, "finish", summary="Snow fails. No other hypothesis replicated.")
    assert done.n_findings == 1 and done.findings[0].startswith("f1 ") and SNOW in done.findings[0]
    assert ctx.finished and ctx.final_answer.endswith(f"Recorded findings: {done.findings[0]}.")


def test_a_finding_cites_its_captions_first_supported_confirmation(ctx):
    # Confirming a caption again and citing the best of the supported attempts would overstate its effect (the best
    # of three confirmations inflates the corrected median by a fifth to two fifths): the first one stands.
    snow = call(ctx, "measure_rate", caption=SNOW)
    first = call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=200)
    second = call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=200, first_n=100)
    assert first.verdict == second.verdict == "supported"
    with pytest.raises(ToolError, match=f"first confirmed by {first.test_id}"):
        call(ctx, "record_finding", caption=SNOW, discovery_test=snow.test_id, confirmation_test=second.test_id)
    f = call(ctx, "record_finding", caption=SNOW, discovery_test=snow.test_id, confirmation_test=first.test_id)
    assert f.confirmation.test_id == first.test_id
