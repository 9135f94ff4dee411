"""A confirmed finding's headline: the least rate ratio its confirmation's own exact test still rejects.

`stats.headline_bound` inverts Fisher's one-sided test at the threshold of the look the attempt stopped at and takes
the class rate at its exact upper end. Checked here: the inversion against scipy's noncentral hypergeometric law; a
bound of at least 1 for every rejection the protocol planner's declared designs can make (so no confirmed finding
reads below 1x); its error through the designs' own decision rule (at most 2 alpha / M an attempt); what recorded
findings' bounds are at the designs and level the protocol planner declares (the figures of docs/statistics.md); and
the number every view shows, through the tools.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from sleuth.tools import investigation_tools, stats
from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.context import ToolContext
from sleuth.tools.investigation import Budget, Investigation
from sleuth.tools.stats.bound import class_rate_upper, odds_ratio_bound, upper_tail
from sleuth.tools.stats.shared_baseline import critical_counts
from tests.fakeworld import fake_backends
from tests.test_selection import simulate


def protocol_designs():
    from sleuth.agent.planners.protocol import pass_designs
    from sleuth.tools.ladder import PASSES

    designs = pass_designs(PASSES, 40, 20_000)
    assert [(d.key, d.spending, d.baseline_n) for d in designs[:2]] == [((30, 300), "pocock", 300),
                                                                        ((50, 800), "pocock", 800)]
    return designs, PASSES


def look_threshold(plan: stats.SequentialPlan, look: int) -> float:
    """The threshold the attempt is tested at when it stops at ``look`` (the planned last look: all the alpha left)."""
    return plan.final_threshold(look) if look == len(plan.looks) - 1 else plan.thresholds()[look]


def bounds_of(plan: stats.SequentialPlan, n0: int, k0: np.ndarray, look: np.ndarray, x: np.ndarray,
              share: float) -> np.ndarray:
    """The headline bound of each recorded attempt (computed once per distinct outcome)."""
    outcomes, index = np.unique(np.stack([k0, look, x]), axis=1, return_inverse=True)
    b = np.array([stats.headline_bound(int(xx), plan.looks[int(j)], int(k), n0, look_threshold(plan, int(j)), share)
                  for k, j, xx in outcomes.T])
    return b[index.ravel()]


def test_the_inversion_is_fishers_test_against_another_odds_ratio():
    k1, n1, k0, n0 = 11, 30, 13, 300
    # At odds ratio 1 the tail is the attempt's own p-value; elsewhere it is scipy's noncentral hypergeometric law.
    assert upper_tail(k1, n1, k0, n0, 0.0) == pytest.approx(float(stats.fisher_p_greater(k1, n1, k0, n0)), rel=1e-9)
    for psi in (0.5, 2.0, 7.5):
        law = st.nchypergeom_fisher(n1 + n0, n1, k1 + k0, psi)
        assert upper_tail(k1, n1, k0, n0, math.log(psi)) == pytest.approx(float(law.sf(k1 - 1)), rel=1e-7)
    psi = odds_ratio_bound(k1, n1, k0, n0, 2e-4)
    assert 1 < psi and upper_tail(k1, n1, k0, n0, math.log(psi)) == pytest.approx(2e-4, rel=1e-8)
    # Converted at the class rate's one-sided upper end (Clopper-Pearson at the share), never above the odds ratio.
    hi = class_rate_upper(k0, n0, 0.05 / 40)
    assert st.binom.cdf(k0, n0, hi) == pytest.approx(0.05 / 40, rel=1e-6)
    bound = stats.headline_bound(k1, n1, k0, n0, 2e-4, 0.05 / 40)
    assert bound == pytest.approx(psi / (1 + (psi - 1) * hi), rel=1e-12) and 1 < bound < psi
    # A test that does not reject proves nothing beyond 1.
    assert odds_ratio_bound(3, 30, 13, 300, 2e-4) == 1.0 == stats.headline_bound(3, 30, 13, 300, 2e-4, 0.01)


@pytest.mark.e2e  # a whole run or a simulation: over the fast tier's 5 seconds
def test_every_rejection_the_protocols_designs_can_make_has_a_bound_of_at_least_one():
    # Every baseline count, every look, at the fewest failures that reject there and at every count above (through
    # all the hypothesis's images failing): the bound never reads below 1, and one failure fewer proves nothing.
    designs, _ = protocol_designs()
    for d in designs:
        plan = d.plan(0.05 / 40)
        n0 = d.baseline_n
        assert n0 is not None
        k0s = np.arange(0, n0 + 1, 19)
        crit = critical_counts(plan, k0s, n0)
        for j, n in enumerate(plan.looks):
            for i, k0 in enumerate(k0s):
                c = int(crit[j, i])
                if c > n:
                    continue
                for x in sorted({c, (c + n) // 2, n}):
                    assert stats.headline_bound(x, n, int(k0), n0, look_threshold(plan, j), 0.05 / 40) >= 1.0
                if c > 0:
                    assert odds_ratio_bound(c - 1, n, int(k0), n0, look_threshold(plan, j)) == 1.0


@pytest.mark.parametrize(("p0", "ratio", "measured"), [(0.05, 1.0, 51), (0.05, 1.5, 40), (0.02, 2.0, 36)])
def test_an_attempts_bound_exceeds_the_truth_at_most_twice_its_level(p0, ratio, measured):
    # The 3x pass's design tested at alpha = 5% (a family of one attempt), so that errors are common enough to count:
    # the bound exceeds the true rate ratio only when the test of the true odds ratio rejects at some look (at most
    # 5%) or the class rate exceeds its upper end (at most 5%): at most 10%. Measured: well inside it, and at a
    # true 1x the error is the attempt's rejection rate itself.
    designs, passes = protocol_designs()
    d = designs[0]
    plan = d.plan(0.05)
    runs = 4000
    k0, look, x = simulate(plan, d.baseline_n, p0, ratio, runs, np.random.default_rng(int(100 * p0 + 10 * ratio)),
                           futility_rate=round(passes[0].worth(p0), 4))
    b = bounds_of(plan, d.baseline_n, k0, look, x, 0.05)
    assert np.all(b >= 1.0)
    wrong = stats.binomial_rate(int(np.sum(b > ratio)), runs, method="clopper-pearson")
    # docs/statistics.md's figures (the runs are seeded; a few counts either way on another machine's arithmetic)
    assert wrong.high < 0.10 and abs(wrong.k - measured) <= 3
    if ratio == 1.0:
        assert wrong.k == len(k0) and wrong.high < 0.05 + 0.01


# Recorded findings at the protocol planner's level (40 attempts at alpha/40, Pocock) and designs (docs/statistics.md):
# the median bound and the share of bounds below 1.5x, to Monte Carlo precision over 4,000 simulated attempts each.
@pytest.mark.parametrize(("design", "p0", "ratio", "median", "below"), [
    (0, 0.05, 3.0, 1.17, 0.92), (0, 0.05, 5.0, 1.37, 0.65), (1, 0.05, 2.0, 1.09, 0.99), (1, 0.02, 3.0, 1.15, 0.94),
])
def test_recorded_bounds_at_the_protocols_designs(design, p0, ratio, median, below):
    # An attempt stops at the first look that rejects, so most recorded findings are not far past their threshold:
    # the bound says how much more often the caption fails that the confirmation proves, not how much more it does.
    designs, passes = protocol_designs()
    d = designs[design]
    plan = d.plan(0.05 / 40)
    k0, look, x = simulate(plan, d.baseline_n, p0, ratio, 4000, np.random.default_rng(design + 1),
                           futility_rate=round(passes[design].worth(p0), 4))
    b = bounds_of(plan, d.baseline_n, k0, look, x, 0.05 / 40)
    assert len(b) > 1000 and np.all(b >= 1.0) and np.sum(b > ratio) <= 2
    assert np.median(b) == pytest.approx(median, abs=0.04)
    share = stats.binomial_rate(int(np.sum(b < 1.5)), len(b))
    assert share.low - 0.01 <= below <= share.high + 0.01


def test_a_supported_confirmation_states_its_bound_in_every_view(tmp_path):
    from sleuth.agent.terminal.tables import confirmed_table
    from sleuth.tools.findings import FindingSummary
    from sleuth.tools.finish import finding_line
    from sleuth.tools.measure_rate import render

    store = ArtifactStore(tmp_path / "artifacts")
    inv = Investigation(backends=fake_backends(), label="cat", artifacts=store, budget=Budget(images=20_000),
                        max_confirmations=2)
    ctx = ToolContext(investigation=inv, artifacts=store)
    tools = investigation_tools()
    caption = "a realistic photograph of a cat. it is in the snow."
    d = tools.call("measure_rate", {"caption": caption, "max_n": 200, "first_n": 50}, ctx)
    r = tools.call("measure_rate", {"caption": caption, "confirm": True, "max_n": 400, "first_n": 50}, ctx)
    assert r.verdict == "supported" and r.bound is not None and r.bound >= 1
    t = inv.test(r.test_id)
    plan = stats.default_plan(400, first=50, alpha=0.05 / 2)
    j = len(r.looks) - 1
    assert t.bound == r.bound == stats.headline_bound(t.k1, t.n1, t.k0, t.n0, look_threshold(plan, j), 0.05 / 2)
    text = " ".join(s for line in render(r) for s, _ in line)
    assert f"at least     {r.bound:.3g}× the class's failure rate" in text and "given selection" in text
    f = tools.call("record_finding", {"caption": caption, "discovery_test": d.test_id,
                                     "confirmation_test": r.test_id}, ctx)
    assert f.confirmation.bound == r.bound
    assert FindingSummary.of("cat", f).confirmation.at_least == r.bound
    assert f"at least {r.bound:.3g}x the class's rate" in finding_line(f)
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(confirmed_table(inv))
    out = console.export_text()
    assert f"≥ {r.bound:.3g}×" in out and "fails at least" in out and "90% probability" in out


def test_the_demos_figures_in_docs_statistics():
    # "… in the mountains.": 11 of 30 fresh images against 13 of 300, stopped at the 3x pass's first look (its
    # futility rate 10.47% at the class rate); "a child's drawing of a cat": 10 of 30 against the same 13/300.
    designs, _ = protocol_designs()
    plan = designs[0].plan(0.05 / 40)
    mountains = stats.headline_bound(11, 30, 13, 300, look_threshold(plan, 0), 0.05 / 40)
    effect = stats.conditional_effect(plan, 11, 0, 13, 300, 0.1047)
    assert mountains == pytest.approx(1.86, abs=0.005) and stats.rate_ratio(11, 30, 13, 300).ratio == \
        pytest.approx(8.46, abs=0.005)
    assert (effect.ratio, effect.low, effect.high) == pytest.approx((7.74, 1.58, 19.6), abs=0.05)
    shown = stats.given_selection(effect, mountains)
    assert (shown.ratio, shown.low, shown.high) == (effect.ratio, mountains, effect.high)
    drawing = stats.headline_bound(10, 30, 13, 300, look_threshold(plan, 0), 0.05 / 40)
    weak = stats.conditional_effect(plan, 10, 0, 13, 300, 0.1047)
    assert drawing == pytest.approx(1.57, abs=0.005) and weak.low == pytest.approx(0.25, abs=0.005)
