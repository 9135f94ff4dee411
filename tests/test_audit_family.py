"""The audit's guarantee across classes, measured on null audits: no caption matters in any class.

Each simulated audit has 12 classes; in each, an adversary spends every one of the class's declared confirmation
attempts on a null caption (its failure rate is the class's), tested as ``measure_rate(confirm=true)`` tests it: the
default sequential plan (looks at 100, 200, 400, 800 images) at alpha / M against the class's confirmation baseline
(1,000 images, drawn once), stopping at its first success. Every attempt that succeeds within its class is recorded
as a finding, all false. The audit's summary then marks findings ``audit_significant``; the share of audits listing
a false audit-significant finding is its family-wise error, which must stay at alpha.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from sleuth.agent.audit.summary import audit_family
from sleuth.tools import stats

ALPHA = 0.05


def null_audits(audits: int, classes: int, m: int, seed: int, rate: float = 0.05, n0: int = 1000) -> np.ndarray:
    """Overall sequential p-values of every attempt, shape (audits, classes, m); attempts that stopped without
    success keep their overall p too (they are never recorded, since it is above alpha / m)."""
    rng = np.random.default_rng(seed)
    plan = stats.default_plan(800, first=100, alpha=ALPHA / m)
    thresholds = plan.thresholds()
    k0 = np.broadcast_to(rng.binomial(n0, rate, size=(audits, classes, 1)), (audits, classes, m))
    k = np.zeros((audits, classes, m), np.int64)
    n = 0
    overall = np.ones((audits, classes, m))
    running = np.ones((audits, classes, m), bool)
    base = np.arange(int(k0.min()), int(k0.max()) + 1)
    for look, threshold in zip(plan.looks, thresholds):
        k = k + rng.binomial(look - n, rate, size=k.shape)
        n = look
        # Fisher's p for every (baseline count, hypothesis count) pair once, then looked up per attempt.
        table = stats.fisher_p_greater(np.arange(n + 1)[None, :], n, base[:, None], n0)
        p = table[k0 - base[0], k]
        # overall_p_value: min over the looks made of p_j * alpha / alpha_j (only for attempts still sampling).
        overall = np.where(running, np.minimum(overall, p * plan.alpha / threshold), overall)
        running &= p > threshold
    return np.minimum(overall, 1.0)


def false_audit_findings(p: np.ndarray, rule: str) -> np.ndarray:
    """Per audit: does its summary list a false finding as audit-significant? ``rule``: 'family' (the audit's
    declared family, ``audit_family``) or 'bh' (Benjamini-Hochberg over the findings' within-class adjusted p)."""
    audits, classes, m = p.shape
    out = np.zeros(audits, bool)
    for a in range(audits):
        adjusted = np.minimum(1.0, m * p[a])
        findings = [{"confirmation": {"adjusted_p": float(x)}} for x in adjusted[adjusted <= ALPHA]]
        if not findings:
            continue
        if rule == "family":
            audit_family(findings, classes, ALPHA, [m] * classes)
            out[a] = any(f["audit_significant"] for f in findings)
        else:
            qs = stats.adjust_pvalues([f["confirmation"]["adjusted_p"] for f in findings], method="bh")
            out[a] = any(q <= ALPHA for q in qs)
    return out


def test_a_null_audit_of_12_classes_lists_a_false_audit_significant_finding_at_most_alpha():
    runs = 4000
    p = null_audits(runs, classes=12, m=10, seed=38)
    family = false_audit_findings(p, "family")
    rate = stats.binomial_rate(int(family.sum()), runs, method="clopper-pearson")
    assert rate.high <= ALPHA, rate
    assert int(family.sum()) == 101  # seeded: 2.5% [2.1%, 3.1%], the numbers docs/statistics.md states
    # The simulation can see the leak it closes: the findings each class confirmed, marked by Benjamini-Hochberg
    # over their adjusted p (each <= alpha, so all of them), give a false audit-significant finding far more often.
    bh = false_audit_findings(p[:1000], "bh")
    leaky = stats.binomial_rate(int(bh.sum()), 1000, method="clopper-pearson")
    assert leaky.low > 2 * ALPHA and int(bh.sum()) == 316, leaky
    # Every audit with a class-confirmed (false) finding is one the old rule marked: BH only restated them.
    assert bh.sum() == int((np.minimum(1.0, 10 * p[:1000]) <= ALPHA).any(axis=(1, 2)).sum())


def test_classes_declaring_different_families_share_the_audits_alpha():
    """Six classes declare 10 attempts and six declare 40 (the protocol planner declares 10 to 40 by budget); each
    spends them all on null captions."""
    runs = 1500
    small, large = null_audits(runs, 6, 10, seed=7), null_audits(runs, 6, 40, seed=8)
    false = 0
    for a in range(runs):
        adjusted = [*np.minimum(1.0, 10 * small[a]).ravel(), *np.minimum(1.0, 40 * large[a]).ravel()]
        findings = [{"confirmation": {"adjusted_p": float(x)}} for x in adjusted if x <= ALPHA]
        control = audit_family(findings, 12, ALPHA, [10] * 6 + [40] * 6)
        false += control["audit_significant"] > 0
    rate = stats.binomial_rate(false, runs, method="clopper-pearson")
    assert rate.high <= ALPHA and false == 35, rate  # 2.3% [1.6%, 3.2%]
    assert control["family"] == "300 declared confirmation attempts of the audit's 12 classes"


def test_the_family_gives_each_class_alpha_over_its_declared_attempts():
    findings = [{"confirmation": {"adjusted_p": 0.004}}, {"confirmation": {"adjusted_p": 0.0042}},
                {"confirmation": {"adjusted_p": 0.05}}]
    control = audit_family(findings, 12, ALPHA, [10, 20] + [10] * 10)
    assert [f["audit_p"] for f in findings] == pytest.approx([0.048, 0.0504, 0.6])
    assert [f["audit_significant"] for f in findings] == [True, False, False]
    assert control["error"] == "family-wise" and control["level"] == ALPHA
    assert control["family"] == "130 declared confirmation attempts of the audit's 12 classes"
    assert control["audit_significant"] == 1
    # A class summary from before the field existed: the family is still every declared attempt.
    assert audit_family([], 3, ALPHA, [10, None, 10])["family"] == (
        "every declared confirmation attempt of the audit's 3 classes")


def test_calibration_groups_null_runs_into_audits_of_12_classes():
    from sleuth.agent.bench.calibrate import null_audits as grouped

    runs = [{"false_finding_p": []} for _ in range(36)]
    runs[3]["false_finding_p"] = [0.003]  # 12 x 0.003 = 0.036: audit-significant
    runs[14]["false_finding_p"] = [0.02]  # confirmed in its class only
    runs[35]["false_finding_p"] = [0.03, 0.004]  # the audit's 12 x 0.004 = 0.048
    out = grouped(runs + [{"false_finding_p": [0.0001]}], ALPHA)  # a 37th run makes no whole audit
    assert out["classes"] == 12
    assert (out["audit_significant"]["k"], out["audit_significant"]["n"]) == (2, 3)
    assert (out["any_finding"]["k"], out["any_finding"]["n"]) == (3, 3)
    assert out["audit_significant"]["ci"][1] == pytest.approx(0.99159, abs=1e-4)  # Clopper-Pearson, 2 of 3


def test_the_calibration_summary_and_table_show_the_audit_rate_of_null_runs():
    from rich.console import Console

    from sleuth.agent.bench.calibrate import summarise_calibration
    from sleuth.agent.bench.table import calibration_table

    def run(i: int, p: list[float]) -> dict:
        return {"planner": "protocol", "kind": "null", "index": i, "status": "completed", "images": 100,
                "seconds": 1.0, "real_findings": [], "false_finding_p": p,
                "through": {"discovery": False, "confirmation": bool(p), "finding": bool(p)}}

    runs = [run(i, [0.001] if i == 5 else []) for i in range(24)]
    out = summarise_calibration(runs, ["protocol"], ALPHA)
    audits = out["planners"]["protocol"]["null"]["audits"]
    assert (audits["audit_significant"]["k"], audits["audit_significant"]["n"]) == (1, 2)
    table = calibration_table({"world": "default", "runs_per_planner_and_kind": 24, "budget": 1000, **out})
    console = Console(width=250, record=True, file=io.StringIO())
    console.print(table)
    assert "1/2 = 50% [1–99]" in console.export_text()
