"""Numbers from tools.stats checked against textbook values and independent computations."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import stats as st

from sleuth.tools import stats

# ------------------------------------------------------------------------------------------------------------- rates


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [  # Newcombe (1998), Statistics in Medicine 17:857, Table I (score method without continuity correction).
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_matches_newcombe_table(k, n, low, high):
    r = stats.binomial_rate(k, n)
    assert r.method == "wilson" and r.rate == pytest.approx(k / n)
    assert r.low == pytest.approx(low, abs=6e-5) and r.high == pytest.approx(high, abs=6e-5)


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [  # Newcombe (1998), Table I, "exact" (Clopper–Pearson) column.
        (81, 263, 0.2527, 0.3676),
        (15, 148, 0.0578, 0.1617),
        (0, 20, 0.0, 0.1684),
        (1, 29, 0.0009, 0.1776),
    ],
)
def test_clopper_pearson_matches_newcombe_table(k, n, low, high):
    r = stats.binomial_rate(k, n, method="clopper-pearson")
    assert r.low == pytest.approx(low, abs=6e-5) and r.high == pytest.approx(high, abs=6e-5)


def test_clopper_pearson_closed_forms_at_the_edges():
    # With k = 0 the upper bound solves (1 - p)^n = alpha / 2; with k = n the lower bound solves p^n = alpha / 2.
    assert stats.binomial_rate(0, 10, method="clopper-pearson").high == pytest.approx(1 - 0.025 ** 0.1, rel=1e-12)
    assert stats.binomial_rate(0, 10, method="clopper-pearson").high == pytest.approx(0.3085, abs=5e-5)
    full = stats.binomial_rate(10, 10, method="clopper-pearson")
    assert full.low == pytest.approx(0.025 ** 0.1, rel=1e-12) and full.high == 1.0
    r90 = stats.binomial_rate(0, 30, confidence=0.90, method="clopper-pearson")
    assert r90.high == pytest.approx(1 - 0.05 ** (1 / 30), rel=1e-12)


@pytest.mark.parametrize("n", [1, 7, 40, 263, 1000])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_intervals_agree_with_scipy_binomtest(n, confidence):
    for k in sorted({0, 1, n // 7, n // 2, n - 1, n}):
        ref = st.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
        r = stats.binomial_rate(k, n, confidence=confidence)
        assert (r.low, r.high) == pytest.approx((ref.low, ref.high), abs=1e-10)
        ref = st.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
        r = stats.binomial_rate(k, n, confidence=confidence, method="clopper-pearson")
        assert (r.low, r.high) == pytest.approx((ref.low, ref.high), abs=1e-8)
        assert 0.0 <= r.low <= k / n <= r.high <= 1.0


def test_rate_text_and_empty_sample():
    assert str(stats.binomial_rate(12, 200)) == "12/200 = 6.0% [3.5%, 10.2%]"
    assert str(stats.binomial_rate(1, 2000)) == "1/2000 = 0.05% [0.0088%, 0.3%]"
    empty = stats.binomial_rate(0, 0)
    assert math.isnan(empty.rate) and (empty.low, empty.high) == (0.0, 1.0)
    assert str(empty) == "0/0 = n/a [0.0%, 100.0%]"


@pytest.mark.parametrize(("k", "n"), [(-1, 5), (6, 5), (1, -2), (1.5, 5)])
def test_binomial_rate_refuses_impossible_counts(k, n):
    with pytest.raises(ValueError):
        stats.binomial_rate(k, n)


def test_binomial_rate_refuses_unknown_method_and_confidence():
    with pytest.raises(ValueError, match="method"):
        stats.binomial_rate(1, 5, method="wald")
    with pytest.raises(ValueError, match="confidence"):
        stats.binomial_rate(1, 5, confidence=95)


def test_results_are_frozen_and_round_trip_through_json_with_nan_and_inf():
    r = stats.binomial_rate(0, 0)
    with pytest.raises(ValidationError, match="frozen"):
        r.k = 3  # type: ignore[misc]
    back = stats.Rate.model_validate(json.loads(r.model_dump_json()))
    assert math.isnan(back.rate) and back.high == 1.0
    rr = stats.rate_ratio(3, 100, 0, 1000)
    back_rr = stats.RatioCI.model_validate_json(rr.model_dump_json())
    assert back_rr.ratio == math.inf and back_rr.low == rr.low
    json.loads(rr.model_dump_json())  # strict JSON: no bare NaN / Infinity tokens are required to read it


# ---------------------------------------------------------------------------------------------------------- rate ratio


def test_rate_ratio_katz_worked_example():
    k1, n1, k0, n0 = 30, 100, 50, 1000
    se = math.sqrt(1 / k1 - 1 / n1 + 1 / k0 - 1 / n0)  # Katz et al. (1978): SE of log(p1 / p0)
    z = st.norm.ppf(0.975)
    r = stats.rate_ratio(k1, n1, k0, n0)
    assert r.ratio == pytest.approx(6.0)
    assert r.low == pytest.approx(6.0 * math.exp(-z * se), rel=1e-12)
    assert r.high == pytest.approx(6.0 * math.exp(z * se), rel=1e-12)
    assert (round(r.low, 3), round(r.high, 3)) == (4.009, 8.980)
    assert stats.rate_ratio(k1, n1, k0, n0, confidence=0.99).low < r.low
    # Swapping the groups inverts the ratio and its interval.
    inv = stats.rate_ratio(k0, n0, k1, n1)
    assert (inv.ratio, inv.low, inv.high) == pytest.approx((1 / r.ratio, 1 / r.high, 1 / r.low))


def test_rate_ratio_zero_baseline_is_infinite_with_a_finite_lower_bound():
    r = stats.rate_ratio(3, 100, 0, 1000)
    # Lower bound from the table with 0.5 added to each cell: 3.5/101 over 0.5/1001.
    cc = (3.5 / 101) / (0.5 / 1001)
    se = math.sqrt(1 / 3.5 - 1 / 101 + 1 / 0.5 - 1 / 1001)
    assert r.ratio == math.inf and r.high == math.inf
    assert r.low == pytest.approx(cc * math.exp(-st.norm.ppf(0.975) * se), rel=1e-12)
    assert 1.0 < r.low < 100.0 and "continuity" in r.method


def test_rate_ratio_zero_hypothesis_is_zero_with_a_finite_upper_bound():
    r = stats.rate_ratio(0, 100, 5, 1000)
    cc = (0.5 / 101) / (5.5 / 1001)
    se = math.sqrt(1 / 0.5 - 1 / 101 + 1 / 5.5 - 1 / 1001)
    assert (r.ratio, r.low) == (0.0, 0.0)
    assert r.high == pytest.approx(cc * math.exp(st.norm.ppf(0.975) * se), rel=1e-12)
    assert "continuity" in r.method


@pytest.mark.parametrize(("k1", "n1", "k0", "n0"), [(0, 10, 0, 10), (0, 0, 3, 10), (2, 10, 0, 0)])
def test_rate_ratio_undefined_cases(k1, n1, k0, n0):
    r = stats.rate_ratio(k1, n1, k0, n0)
    assert math.isnan(r.ratio) and (r.low, r.high) == (0.0, math.inf) and "undefined" in r.method


# ------------------------------------------------------------------------------------------------------- exact tests


@pytest.mark.parametrize(("k1", "n1", "k0", "n0"), [(3, 4, 1, 4), (12, 50, 50, 1000), (5, 400, 50, 1000),
                                                     (0, 30, 2, 30), (30, 30, 0, 30), (7, 20, 7, 20)])
def test_fisher_one_sided_is_the_hypergeometric_tail(k1, n1, k0, n0):
    # Given k1 + k0 events among n1 + n0 images, the hypothesis sample's events are hypergeometric.
    tail = st.hypergeom.sf(k1 - 1, n1 + n0, k1 + k0, n1)
    c = stats.compare_rates(k1, n1, k0, n0)
    assert c.p_value == pytest.approx(tail, rel=1e-9, abs=1e-300)
    assert float(stats.fisher_p_greater(k1, n1, k0, n0)) == pytest.approx(tail, rel=1e-9, abs=1e-300)
    less = stats.compare_rates(k1, n1, k0, n0, alternative="less")
    assert less.p_value == pytest.approx(st.hypergeom.cdf(k1, n1 + n0, k1 + k0, n1), rel=1e-9, abs=1e-300)


def test_fisher_tea_tasting_and_result_contents():
    c = stats.compare_rates(3, 4, 1, 4)
    assert c.p_value == pytest.approx(17 / 70)  # (C(4,3) C(4,1) + C(4,4)) / C(8,4)
    assert c.alternative == "greater" and c.method.startswith("fisher")
    assert (c.hypothesis.k, c.hypothesis.n, c.baseline.k, c.baseline.n) == (3, 4, 1, 4)
    assert c.ratio.ratio == pytest.approx(3.0)
    # Direction: a hypothesis rate below the baseline is no evidence for "greater".
    assert stats.compare_rates(1, 4, 3, 4).p_value == pytest.approx(1 - 1 / 70)


def test_boschloo_known_value_and_never_weaker_than_fisher():
    # scipy.stats.boschloo_exact documentation example: 74/117 vs 31/63.
    b = stats.compare_rates(74, 117, 31, 63, method="boschloo")
    f = stats.compare_rates(74, 117, 31, 63)
    assert b.p_value == pytest.approx(0.0356, abs=1e-4) and f.p_value == pytest.approx(0.0483, abs=1e-4)
    assert b.method.startswith("boschloo")
    for k1, n1, k0, n0 in [(7, 20, 2, 20), (5, 12, 1, 15), (3, 4, 1, 4), (10, 40, 4, 60), (0, 10, 3, 10),
                           (5, 20, 1, 20)]:
        pb = stats.compare_rates(k1, n1, k0, n0, method="boschloo").p_value
        pf = stats.compare_rates(k1, n1, k0, n0).p_value
        assert pb <= pf + 1e-12, (k1, n1, k0, n0)
    # Fisher's conditioning costs power: here only Boschloo reaches 0.05.
    boschloo, fisher = (stats.compare_rates(7, 20, 2, 20, method=m).p_value for m in ("boschloo", "fisher"))
    assert boschloo < 0.05 < fisher  # 0.040 and 0.064


def test_compare_rates_empty_sample_and_bad_arguments():
    assert stats.compare_rates(0, 0, 3, 10).p_value == 1.0
    with pytest.raises(ValueError, match="method"):
        stats.compare_rates(1, 5, 1, 5, method="chi2")
    with pytest.raises(ValueError, match="alternative"):
        stats.compare_rates(1, 5, 1, 5, alternative="bigger")
    with pytest.raises(ValueError):
        stats.compare_rates(6, 5, 1, 5)


# ----------------------------------------------------------------------------------------------------- multiplicity


def test_holm_textbook_example():
    # Holm–Bonferroni worked example (Wikipedia): p = 0.01, 0.04, 0.03, 0.005 at alpha 0.05 rejects H1 and H4 only.
    adj = stats.adjust_pvalues([0.01, 0.04, 0.03, 0.005])
    assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [a <= 0.05 for a in adj] == [True, False, False, True]


def test_holm_is_monotone_clipped_and_never_below_raw():
    raw = [0.2, 0.001, 0.5, 0.04, 0.04, 0.9]
    adj = stats.adjust_pvalues(raw, method="holm")
    # Sorted: 0.001 x 6, 0.04 x 5, 0.04 x 4 -> raised to 0.2 by the running max, 0.2 x 3, 0.5 x 2 -> 1, 0.9 x 1.
    assert adj == pytest.approx([0.6, 0.006, 1.0, 0.2, 0.2, 1.0])
    order = np.argsort(raw, kind="stable")
    assert np.all(np.diff(np.asarray(adj)[order]) >= 0)


def test_bh_equals_scipy_false_discovery_control():
    rng = np.random.default_rng(7)
    for m in (1, 2, 5, 30, 200):
        raw = np.concatenate([rng.uniform(size=m), rng.uniform(0, 0.01, size=m // 3)])
        raw[: m // 4] = raw[0]  # ties
        ours = stats.adjust_pvalues(raw.tolist(), method="bh")
        assert ours == pytest.approx(st.false_discovery_control(raw, method="bh").tolist(), abs=1e-12)
    assert stats.adjust_pvalues([0.01, 0.04, 0.03, 0.005], method="bh") == pytest.approx([0.02, 0.04, 0.04, 0.02])


def test_adjust_pvalues_edges():
    assert stats.adjust_pvalues([]) == []
    assert stats.adjust_pvalues([0.3]) == [0.3]
    for bad in ([0.1, float("nan")], [1.2], [-0.1]):
        with pytest.raises(ValueError):
            stats.adjust_pvalues(bad)
    with pytest.raises(ValueError, match="method"):
        stats.adjust_pvalues([0.1], method="sidak")


# ---------------------------------------------------------------------------------------------------------- McNemar


def test_mcnemar_hand_example():
    m = stats.mcnemar_exact(10, 2)
    assert m.p_value == pytest.approx(79 / 4096)  # P(X >= 10), X ~ Binom(12, 1/2): (66 + 12 + 1) / 2^12
    assert (m.b, m.c, m.alternative, m.method) == (10, 2, "greater", "exact")
    assert stats.mcnemar_exact(2, 10).p_value == pytest.approx(1 - 13 / 4096)  # P(X >= 2) = 1 - P(X <= 1)
    assert stats.mcnemar_exact(0, 0).p_value == 1.0


@pytest.mark.parametrize("alternative", ["greater", "less", "two-sided"])
def test_mcnemar_equals_binomtest_on_discordant_pairs(alternative):
    for b, c in [(0, 1), (1, 0), (5, 5), (9, 1), (3, 17), (60, 0), (40, 25)]:
        ref = st.binomtest(b, b + c, 0.5, alternative=alternative).pvalue
        assert stats.mcnemar_exact(b, c, alternative=alternative).p_value == pytest.approx(ref, rel=1e-12)


def test_paired_rate_ratio_is_exact_on_its_formula_and_handles_empty_cells():
    from sleuth.tools.stats import paired_rate_ratio

    r = paired_rate_ratio(10, 30, 5, 200)  # (10 + 30) / (10 + 5)
    assert r.ratio == pytest.approx(40 / 15)
    se = math.sqrt((30 + 5 + 1) / (40.5 * 15.5))
    assert r.low == pytest.approx(40.5 / 15.5 * math.exp(-1.959964 * se), rel=1e-5)
    assert r.high == pytest.approx(40.5 / 15.5 * math.exp(1.959964 * se), rel=1e-5)
    zero_base = paired_rate_ratio(0, 12, 0, 100)
    assert zero_base.ratio == math.inf and zero_base.high == math.inf and zero_base.low > 1
    none = paired_rate_ratio(0, 0, 0, 100)
    assert math.isnan(none.ratio) and (none.low, none.high) == (0.0, math.inf)
    with pytest.raises(ValueError):
        paired_rate_ratio(50, 40, 20, 100)


@pytest.mark.parametrize("n,p0,rr,agree", [(100, 0.05, 3.0, 0.9), (200, 0.1, 1.5, 0.5), (50, 0.2, 2.0, 0.8),
                                           (200, 0.02, 10.0, 0.9)])
def test_paired_rate_ratio_covers_and_is_narrower_than_katz_on_paired_data(n, p0, rr, agree):
    """Simulated coverage of the matched-pairs interval within 2.5 points of 95% (3,000 draws: SE 0.4 points),
    and a median width below the two-sample Katz interval's on the same counts."""
    from sleuth.tools.stats import paired_rate_ratio, rate_ratio

    rng = np.random.default_rng(11)
    p1 = p0 * rr
    both = min(p0, p1) * agree
    cells = [both, p1 - both, p0 - both, 1 - p1 - p0 + both]
    covered, widths, katz = 0, [], []
    for c in rng.multinomial(n, cells, size=3000):
        r = paired_rate_ratio(int(c[0]), int(c[1]), int(c[2]), n)
        covered += r.low <= rr <= r.high
        k = rate_ratio(int(c[0] + c[1]), n, int(c[0] + c[2]), n)
        if 0 < r.low and r.high < math.inf and 0 < k.low and k.high < math.inf:
            widths.append(math.log(r.high / r.low))
            katz.append(math.log(k.high / k.low))
    assert abs(covered / 3000 - 0.95) < 0.025
    assert np.median(widths) < np.median(katz)


def _paired_coverage(n: int, p11: float, p10: float, p01: float, confidence: float = 0.95) -> float:
    """Exact coverage of the paired-difference interval: every 2x2 table of n pairs, weighted by its probability."""
    from scipy.stats import multinomial

    p00 = 1 - p11 - p10 - p01
    true = (p11 + p01) - (p11 + p10)  # after - before
    cover = 0.0
    for a in range(n + 1):
        for b in range(n + 1 - a):
            for c in range(n + 1 - a - b):
                pr = float(multinomial.pmf([a, b, c, n - a - b - c], n, [p11, p10, p01, p00]))
                if pr > 1e-12:
                    ci = stats.paired_difference(a, b, c, n, confidence)
                    cover += pr * (ci.low <= true <= ci.high)
    return cover


@pytest.mark.parametrize("n,p11,p10,p01", [(30, 0.8, 0.1, 0.05), (40, 0.5, 0.2, 0.1), (30, 0.9, 0.04, 0.04),
                                            (25, 0.85, 0.05, 0.02)])
def test_paired_difference_interval_keeps_its_coverage(n: int, p11: float, p10: float, p01: float) -> None:
    """Newcombe's method 10 is near nominal, and conservative when accuracies are close to 1 (measured exactly:
    0.959, 0.947, 0.989, 0.992 for these four)."""
    assert 0.935 <= _paired_coverage(n, p11, p10, p01) <= 0.995


def test_paired_difference_agrees_with_wald_on_large_samples_and_stays_in_range() -> None:
    ci = stats.paired_difference(9000, 300, 120, 10_000)
    assert ci.before.rate == 0.93 and ci.after.rate == pytest.approx(0.912) and ci.difference == pytest.approx(-0.018)
    wald = 1.959964 * math.sqrt((300 + 120) / 10_000 ** 2 - 0.018 ** 2 / 10_000)
    assert ci.low == pytest.approx(-0.018 - wald, abs=2e-4) and ci.high == pytest.approx(-0.018 + wald, abs=2e-4)
    edge = stats.paired_difference(0, 0, 10, 10)  # everything flipped to success
    assert edge.difference == 1.0 and -1.0 <= edge.low <= edge.high == 1.0
    with pytest.raises(ValueError):
        stats.paired_difference(5, 5, 5, 10)


def test_non_inferiority_needs_the_lower_bound_above_the_margin() -> None:
    # 18 fewer correct in 10,000: a 0.18-point drop, lower bound about -0.28 points
    small = stats.non_inferiority(9500, 30, 12, 10_000, margin=0.01)
    assert small.shown and -0.01 < small.interval.low < -0.0018 and small.interval.confidence == pytest.approx(0.9)
    big = stats.non_inferiority(9000, 300, 120, 10_000, margin=0.01)  # a 1.8-point drop
    assert not big.shown
    assert not stats.non_inferiority(10, 0, 0, 10, margin=0.01).shown  # 10 pairs cannot show a one-point margin
    with pytest.raises(ValueError):
        stats.non_inferiority(1, 0, 0, 1, margin=0)
