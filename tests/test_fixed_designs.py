"""Confirmation sizes are fixed before the shared confirmation baseline is drawn.

The adversary: a planner that sees the confirmation baseline's count k0 (every result prints it) and then picks each
attempt's sample size to be the one most likely to reject given that k0. Against a baseline in its lower tail a large
attempt rejects a null caption far more often than its level; chosen per k0, the family-wise error passes alpha.
The tools now fix an attempt's sizes before the baseline is drawn, so the planner keeps only the choice of which
declared slot to use and when to stop, neither of which can raise the error above alpha (tools/stats/__init__.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as st

from sleuth.tools import investigation_tools, stats
from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.context import ToolContext
from sleuth.tools.investigation import Budget, ConfirmationDesign, Investigation
from sleuth.tools.registry import ToolError
from sleuth.tools.stats.shared_baseline import attempts_fwer, critical_counts, rejection_given_baseline
from tests.fakeworld import fake_backends

SNOW = "a realistic photograph of a cat. it is in the snow."
NULL = "a realistic photograph of a cat. it is daytime."

ALPHA, M = 0.05, 10
SIZES = (50, 100, 200, 400, 800, 1600, 3200)


def single_looks(level: float) -> list[stats.SequentialPlan]:
    return [stats.SequentialPlan(looks=[n], alpha=level) for n in SIZES]


def test_a_null_attempt_against_a_low_baseline_rejects_far_above_its_level():
    # 80/2,000 at a true 5% (the lower tail): an attempt of 1,600 images rejects ~5% of the time, at a level of 0.5%.
    k0, w, r = rejection_given_baseline(stats.SequentialPlan(looks=[1600], alpha=ALPHA / M), 2000, 0.05)
    assert r[k0 == 80][0] == pytest.approx(0.051, abs=0.002)
    # ...while averaged over the baseline it keeps its level.
    assert float(np.sum(w * r)) <= ALPHA / M


@pytest.mark.parametrize(("n0", "p0"), [(2000, 0.05), (500, 0.05), (300, 0.2), (1000, 0.02)])
def test_sizes_fixed_before_the_baseline_keep_the_family_at_alpha_and_sizes_chosen_from_it_do_not(n0, p0):
    level = ALPHA / M
    plans = single_looks(level) + [stats.default_plan(n, first=min(100, n), alpha=level) for n in (300, 800, 2000)]
    fixed = attempts_fwer(plans, n0, p0, M, adaptive=False)  # the worst of the fixed designs, all M attempts used
    adaptive = attempts_fwer(plans, n0, p0, M, adaptive=True)
    assert fixed <= ALPHA and adaptive > fixed + 0.01
    # Exact (docs/statistics.md: 2.6-3.5% over the four baselines with the sizes fixed; the leak the fixed sizes close,
    # choosing each attempt's size from k0, reaches 5.7% against 2,000 at 5%).
    assert (fixed, adaptive) == pytest.approx({(2000, 0.05): (0.0347, 0.0569), (500, 0.05): (0.0274, 0.0405),
                                               (300, 0.2): (0.0309, 0.0447), (1000, 0.02): (0.0260, 0.0422)}[n0, p0],
                                              abs=0.0001)


def test_the_adaptive_size_adversary_simulated_against_both_rules():
    """200,000 simulated investigations of M = 10 null attempts against a 2,000-image baseline at 5%."""
    rng = np.random.default_rng(38)
    runs, n0, p0, level = 200_000, 2000, 0.05, ALPHA / M
    plans = single_looks(level)
    k0_grid, _, _ = rejection_given_baseline(plans[0], n0, p0)
    r = np.stack([rejection_given_baseline(p, n0, p0)[2] for p in plans])
    crit = np.concatenate([critical_counts(p, k0_grid, n0) for p in plans])  # (sizes, k0)
    k0 = np.clip(rng.binomial(n0, p0, runs), k0_grid[0], k0_grid[-1]) - k0_grid[0]
    sizes = np.array(SIZES)

    def fwer(choice: np.ndarray) -> stats.Rate:
        k1 = rng.binomial(sizes[choice][:, None], p0, (runs, M))
        false = (k1 >= crit[choice, k0][:, None]).any(axis=1)
        return stats.binomial_rate(int(false.sum()), runs, method="clopper-pearson")

    adaptive = fwer(r[:, k0].argmax(axis=0))  # each run's size: the one most likely to reject given its k0
    fixed = fwer(np.full(runs, SIZES.index(1600)))  # the adversary's favourite size, fixed before k0 is drawn
    assert adaptive.low > ALPHA and adaptive.rate == pytest.approx(0.0563, abs=0.0005)  # 5.63%; 5.69% exact
    assert fixed.high <= ALPHA and fixed.rate == pytest.approx(0.0306, abs=0.0005)


def rejection_by_count(plan: stats.SequentialPlan, n0: int, p0: float) -> np.ndarray:
    """P(a null attempt of ``plan`` rejects | k0) for every k0 = 0..n0 (0 where k0 is too unlikely to compute)."""
    k0, _, r = rejection_given_baseline(plan, n0, p0)
    out = np.zeros(n0 + 1)
    out[k0] = r
    return out


@pytest.mark.parametrize("p0", [0.003, 0.02, 0.08, 0.25])
def test_nested_baselines_keep_the_family_at_alpha_for_a_planner_that_reads_the_first_one(p0):
    """The protocol planner's designs at 20,000 images compare with the first 300 and the first 800 images of one
    confirmation baseline, each size declared before any of it is drawn. The adversary reads k0 of the first 300
    and spends the larger designs' slots only when it is low (their baselines then tend to be low too, so their
    attempts reject more often). Exact: the family still stays under alpha, as the union bound over slots says."""
    from sleuth.agent.planners.protocol import PASSES, pass_designs

    designs = pass_designs(PASSES, 80, 20_000, 300)
    assert [(d.baseline_n, d.attempts) for d in designs] == [(300, 48), (800, 16), (800, 16)]
    level = ALPHA / 80
    r = [rejection_by_count(d.plan(level), d.baseline_n, p0) for d in designs]
    k300 = np.arange(301)
    w300 = st.binom.pmf(k300, 300, p0)
    x500 = st.binom.pmf(np.arange(501), 500, p0)  # images 301-800
    # P(no false finding | k0 of the first 300): the first design's 48 slots always; the others' only when low.
    none_first = (1 - r[0]) ** 48
    none_later = np.array([np.dot(x500, ((1 - r[1][k:k + 501]) * (1 - r[2][k:k + 501])) ** 16) for k in k300])
    low = k300 <= 300 * p0
    fwer = 1 - float(np.sum(w300 * none_first * np.where(low, none_later, 1.0)))
    assert fwer <= ALPHA
    # Each slot's term of the union bound is its design's level averaged over its own baseline.
    for d, rd in zip(designs, r):
        assert float(np.dot(st.binom.pmf(np.arange(d.baseline_n + 1), d.baseline_n, p0), rd)) <= level


# -- through the tools ------------------------------------------------------------------------------------------


def context(tmp_path, **kw) -> ToolContext:
    store = ArtifactStore(tmp_path / "artifacts")
    inv = Investigation(backends=fake_backends(), label="cat", artifacts=store, budget=Budget(images=60_000), **kw)
    return ToolContext(investigation=inv, artifacts=store)


def call(ctx, name, **args):
    return investigation_tools().call(name, args, ctx)


def test_the_first_attempt_fixes_the_sizes_of_every_attempt_before_it_draws_the_baseline(tmp_path):
    ctx = context(tmp_path, max_confirmations=4)
    first = call(ctx, "measure_rate", caption=NULL, confirm=True, max_n=200, first_n=50)
    assert any("sizes fixed before the confirmation baseline was drawn" in n for n in first.notes)
    # The adversary's move: seen k0, ask for a larger attempt. Refused, and nothing is spent or counted.
    used = ctx.investigation.budget.used
    with pytest.raises(ToolError, match="fixed before the confirmation baseline is drawn"):
        call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=1600, first_n=50)
    assert ctx.investigation.budget.used == used and ctx.investigation.confirmations_used == 1
    again = call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=200, first_n=50)
    assert again.verdict == "supported" and again.looks[0] == 50


def test_declared_designs_each_have_their_share_of_the_attempts(tmp_path):
    designs = [ConfirmationDesign(first_n=30, max_n=300, attempts=2), ConfirmationDesign(first_n=50, max_n=800,
                                                                                         attempts=1)]
    ctx = context(tmp_path, confirmation_designs=designs, max_confirmations=99)
    assert ctx.investigation.max_confirmations == 3  # the family is the declared attempts
    a = call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=300, first_n=30)
    assert a.family_size == 3 and a.adjusted_p == pytest.approx(min(1.0, 3 * a.p_value))
    call(ctx, "measure_rate", caption=NULL, confirm=True, max_n=800, first_n=50)
    with pytest.raises(ToolError, match="declared with first_n=50, max_n=800 are spent"):
        call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=800, first_n=50)
    with pytest.raises(ToolError, match="not a declared design"):
        call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=400, first_n=30)
    call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=300, first_n=30)
    with pytest.raises(ToolError, match="3 confirmation attempts are spent"):
        call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=300, first_n=30)


def test_a_budget_stop_keeps_the_planned_threshold(tmp_path):
    # The planner steers the budget left, so a confirmation the budget cuts short may not spend the alpha left.
    store = ArtifactStore(tmp_path / "artifacts")
    inv = Investigation(backends=fake_backends(), label="cat", artifacts=store, budget=Budget(images=1000),
                        max_confirmations=2)
    ctx = ToolContext(investigation=inv, artifacts=store)
    r = call(ctx, "measure_rate", caption=NULL, confirm=True, max_n=800, first_n=100, baseline_n=500)
    plan = stats.default_plan(800, first=100, alpha=ALPHA / 2)
    assert r.stopped == "budget" and r.looks == [100, 200, 400]
    assert any("kept their planned thresholds" in n for n in r.notes)
    # The p-value is the sequence's over the planned thresholds of the looks made, not over a final look's.
    t = inv.test(r.test_id)
    assert t.p_value == pytest.approx(plan.overall_p_value(
        [float(stats.fisher_p_greater(k, n, t.k0, t.n0)) for k, n in looks_of(inv, r)]), rel=1e-9)


def looks_of(inv, r):
    s = inv.measurement(r.measurement_id).sample
    failed = s.failed & s.valid
    return [(int(failed[:n].sum()), int(s.valid[:n].sum())) for n in r.looks]


def test_the_first_attempt_may_declare_every_attempts_sizes(tmp_path):
    ctx = context(tmp_path, max_confirmations=3)
    designs = [{"first_n": 30, "max_n": 300, "attempts": 2}, {"first_n": 50, "max_n": 800, "attempts": 1}]
    with pytest.raises(ToolError, match="share out the 3 declared confirmation attempts"):
        call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=300, first_n=30, designs=designs[:1])
    call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=300, first_n=30, designs=designs)
    assert [d.key for d in ctx.investigation.confirmation_designs] == [(30, 300), (50, 800)]
    # Declared once: a later attempt cannot change them (it has seen the baseline).
    with pytest.raises(ToolError, match="declared already"):
        call(ctx, "measure_rate", caption=NULL, confirm=True, max_n=300, first_n=30,
             designs=[{"first_n": 30, "max_n": 300, "attempts": 1}, {"first_n": 100, "max_n": 1600, "attempts": 2}])
    assert call(ctx, "measure_rate", caption=NULL, confirm=True, max_n=800, first_n=50).family_size == 3


def test_a_declared_spending_is_every_attempts_and_a_discovery_test_uses_its_own(tmp_path):
    """Pocock spending, declared with the sizes before the baseline, is what each attempt is tested at, whatever a
    later call asks; its thresholds come earlier than O'Brien-Fleming's and still sum to the attempt's level."""
    designs = [ConfirmationDesign(first_n=30, max_n=300, attempts=2, spending="pocock")]
    ctx = context(tmp_path, confirmation_designs=designs)
    inv = ctx.investigation
    r = call(ctx, "measure_rate", caption=NULL, confirm=True, max_n=300, first_n=30, spending="obrien-fleming")
    assert any("Pocock spending" in n for n in r.notes)
    pocock = stats.default_plan(300, first=30, alpha=ALPHA / 2, spending="pocock")
    obf = stats.default_plan(300, first=30, alpha=ALPHA / 2)
    assert pocock.looks == obf.looks == [30, 60, 120, 300]
    assert sum(pocock.thresholds()) == pytest.approx(ALPHA / 2) and pocock.thresholds()[0] > 50 * obf.thresholds()[0]
    t = inv.test(r.test_id)
    ps = [float(stats.fisher_p_greater(k, n, t.k0, t.n0)) for k, n in looks_of(inv, r)]
    assert t.p_value == pytest.approx(pocock.overall_p_value(ps), rel=1e-9)
    assert pocock.overall_p_value(ps) != pytest.approx(obf.overall_p_value(ps), rel=1e-3)
    # A discovery test is tested at the spending its call names.
    d = call(ctx, "measure_rate", caption=NULL, max_n=400, first_n=50, spending="pocock")
    t = inv.test(d.test_id)
    plan = stats.default_plan(400, first=50, alpha=ALPHA / 1, spending="pocock")
    ps = [float(stats.fisher_p_greater(k, n, t.k0, t.n0)) for k, n in looks_of(inv, d)]
    assert t.p_value == pytest.approx(plan.overall_p_value(ps), rel=1e-9)


def test_a_futility_rate_stops_a_weak_caption_early_and_never_a_strong_one(tmp_path):
    """The least rate worth pursuing ends a caption that surely fails less often, not supported, at an early look; a
    caption far above it runs as without it, to the same p-value."""
    ctx = context(tmp_path, max_confirmations=4)
    weak = call(ctx, "measure_rate", caption=NULL, max_n=800, first_n=50, futility_rate=0.3)
    assert weak.stopped == "futility" and weak.verdict == "not supported" and weak.looks == [50]
    assert weak.hypothesis is not None and stats.binomial_rate(weak.hypothesis.failures.k, 50).high < 0.3
    assert any("stopped for futility at n=50" in n for n in weak.notes)
    # At 3% the same caption is not surely under the rate asked for at 50 images, so it goes on.
    on = call(ctx, "measure_rate", caption=NULL, max_n=100, first_n=50, futility_rate=0.03)
    assert on.stopped != "futility" and on.looks == [50, 100]
    strong = call(ctx, "measure_rate", caption=SNOW, max_n=400, first_n=50, futility_rate=0.3)
    assert strong.stopped == "success" and strong.verdict == "supported"


def test_designs_with_their_own_baseline_sizes_compare_with_its_first_images(tmp_path):
    designs = [ConfirmationDesign(first_n=30, max_n=300, attempts=2, baseline_n=300),
               ConfirmationDesign(first_n=50, max_n=800, attempts=1, baseline_n=800)]
    ctx = context(tmp_path, confirmation_designs=designs)
    inv = ctx.investigation
    used = inv.budget.used
    a = call(ctx, "measure_rate", caption=NULL, confirm=True, max_n=300, first_n=30, baseline_n=1000)
    assert (a.baseline.n, inv.budget.used - used - a.looks[-1]) == (300, 300)  # its declared size, not the call's
    first = inv.baselines["confirmation"]
    b = call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=800, first_n=50)
    # Topped up to 800 when first needed: the first 300 are the same images, the 500 after them fresh.
    drawn = inv.baselines["confirmation"]
    assert b.baseline.n == 800 and drawn.seeds[:300] == first.seeds and not set(drawn.seeds[300:]) & set(first.seeds)
    assert b.baseline.k == int((drawn.failed & drawn.valid).sum()) and b.verdict == "supported"
    # A later attempt of the first design still compares with the first 300 only.
    c = call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=300, first_n=30)
    assert c.baseline == a.baseline and c.baseline.n == 300 and c.verdict == "supported"
    assert "against the first 800 baseline images" in inv.confirmation_designs[1].text()


def test_declared_designs_either_all_give_a_baseline_size_or_none_does(tmp_path):
    ctx = context(tmp_path, max_confirmations=3)
    mixed = [{"first_n": 30, "max_n": 300, "attempts": 2, "baseline_n": 300}, {"first_n": 50, "max_n": 800,
                                                                              "attempts": 1}]
    used = ctx.investigation.budget.used
    with pytest.raises(ToolError, match="either all give their baseline_n or none does"):
        call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=300, first_n=30, designs=mixed)
    assert ctx.investigation.budget.used == used and ctx.investigation.confirmations_used == 0


def test_the_declared_family_sizes_docs_statistics_states():
    # The protocol planner: 40 attempts whatever the budget, a fifth of them for each later pass the budget can pay
    # for twice over (4,800 images for the second, 11,000 for the third), the first pass the rest; the LLM planner:
    # one attempt per 125 images, 10 to 80.
    from sleuth.agent.planners import PROTOCOL_CONFIRMATIONS, llm_confirmations
    from sleuth.agent.planners.protocol import pass_designs
    from sleuth.tools.ladder import PASSES

    shares = {b: [d.attempts for d in pass_designs(PASSES, PROTOCOL_CONFIRMATIONS, b)]
              for b in (4_799, 4_800, 10_999, 11_000)}
    assert PROTOCOL_CONFIRMATIONS == 40
    assert shares == {4_799: [40], 4_800: [32, 8], 10_999: [32, 8], 11_000: [24, 8, 8]}
    assert [llm_confirmations(b) for b in (500, 1_000, 2_000, 10_000, 20_000)] == [10, 10, 16, 80, 80]
