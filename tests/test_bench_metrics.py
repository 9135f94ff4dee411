"""The discovery benchmark's numbers on synthetic records, and `--worlds` parsing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sleuth.agent.bench.metrics import (
    BugOutcome,
    band_of,
    is_real,
    planner_summary,
    quantiles,
    rate_with_ci,
    recall_by_band,
    recall_curve,
)
from sleuth.agent.bench.multiworld import outcomes
from sleuth.agent.bench.worlds import bench_classes, parse_worlds
from sleuth.tools.backends.toyworld.random_world import random_world, random_world_yaml

TOL = 1e-9


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def test_recall_has_a_wilson_interval():
    r = rate_with_ci(80, 100)
    assert r["k"] == 80 and r["n"] == 100 and r["rate"] == pytest.approx(0.8, abs=TOL)
    lo, hi = wilson(80, 100)
    assert r["ci"][0] == pytest.approx(lo, abs=1e-6) and r["ci"][1] == pytest.approx(hi, abs=1e-6)
    # 80 planted bugs found at 90%: the interval is narrower than +-10 points (the benchmark's target).
    lo, hi = rate_with_ci(72, 80)["ci"]
    assert hi - lo < 0.2
    assert rate_with_ci(0, 0) == {"k": 0, "n": 0, "rate": None, "ci": None}


def test_the_stricter_oracle_needs_the_whole_interval_above_1_2():
    assert is_real(1.21) and not is_real(1.2) and not is_real(1.05)
    assert not is_real(None) and not is_real(float("nan"))
    assert is_real(1.5, threshold=1.4) and not is_real(1.3, threshold=1.4)


def test_strength_bands():
    assert [band_of(x) for x in (1.5, 2.0, 4.99, 5.0, 9.9, 10.0, 19.9, 20.0, 300.0)] == [
        "<2x", "2-5x", "2-5x", "5-10x", "5-10x", "10-20x", "10-20x", ">=20x", ">=20x"]
    assert band_of(None) == "unmeasured" and band_of(float("nan")) == "unmeasured"
    out = recall_by_band([BugOutcome("a", 3.0, True, 100), BugOutcome("b", 4.0, False, None),
                          BugOutcome("c", 12.0, True, 900), BugOutcome("d", None, False, None)])
    assert list(out) == ["2-5x", "10-20x", "unmeasured"]
    assert (out["2-5x"]["k"], out["2-5x"]["n"]) == (1, 2)
    assert (out["10-20x"]["k"], out["10-20x"]["n"]) == (1, 1) and out["10-20x"]["rate"] == 1.0


def _events(*spec):
    """tool_returned (images) and finding (id, confirmed) events in order."""
    from sleuth.agent.events import Finding, ToolReturned
    from sleuth.tools import stats
    from sleuth.tools.findings import Evidence

    ev = Evidence(test_id="t", hypothesis=stats.binomial_rate(9, 30), baseline=stats.binomial_rate(3, 300),
                  rate_ratio=stats.rate_ratio(9, 30, 3, 300), p_value=1e-4, adjusted_p=1e-3, kind="confirmation")
    out = []
    for i, item in enumerate(spec):
        if isinstance(item, int):
            out.append(ToolReturned(call_id=str(i), name="measure_rate", ok=False, images_used=item))
        else:
            fid, confirmed = item
            finding = {"finding_id": fid, "caption": "c", "summary": "", "confirmed": confirmed,
                       "discovery": ev.model_dump(mode="json"), "confirmation": ev.model_dump(mode="json")}
            out.append(Finding(finding_id=fid, finding=finding))
    return out


def test_images_until_first_confirmation_sums_images_before_the_finding():
    from sleuth.agent.view import InvestigationView

    def at(*spec):
        return InvestigationView.from_events(_events(*spec)).images_at_findings

    assert at(1000, 30, 30, ("f1", True), 0, 400, ("f2", False), 200, ("f2", True), ("f1", True), 50) == \
        {"f1": 1060, "f2": 1660}
    assert at(100, ("f1", False)) == {}


def test_recall_against_budget_counts_bugs_confirmed_by_then():
    found = [BugOutcome("a", 5, True, 1500), BugOutcome("b", 5, True, 4000), BugOutcome("c", 5, True, 12_000),
             BugOutcome("d", 5, False, None)]
    curve = recall_curve(found, run_budget=12_000, budgets=(2000, 5000, 10_000, 12_000, 20_000))
    assert [c["k"] for c in curve] == [1, 2, 2, 3, None]
    assert [c["measured"] for c in curve] == [True, True, True, True, False]
    assert curve[1]["rate"] == pytest.approx(0.5, abs=TOL) and curve[-1]["rate"] is None
    assert all(c["n"] == 4 for c in curve)


def test_quantiles():
    q = quantiles([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert q["median"] == pytest.approx(5.5, abs=TOL) and q["p90"] == pytest.approx(9.1, abs=TOL) and q["n"] == 10
    assert quantiles([]) == {"median": None, "p90": None, "n": 0}


def _finding(real: bool, bug: str | None = None, at: int | None = None) -> dict:
    return {"caption": "c", "oracle": {"real": real}, "bug": bug, "images_until": at}


def test_planner_summary_and_outcomes_from_runs():
    runs = [
        {"world": "w0", "planner": "p", "label": "a", "images": 10_000, "seconds": 10.0, "bug_free": False,
         "bugs": [{"name": "a-bug", "oracle": {"ratio": 3.0}}],
         "findings": [_finding(True, "a-bug", 6000), _finding(True, "a-bug", 2500), _finding(False)]},
        {"world": "w0", "planner": "p", "label": "b", "images": 20_000, "seconds": 30.0, "bug_free": False,
         "bugs": [{"name": "b-bug", "oracle": {"ratio": 15.0}}], "findings": [_finding(True)]},
        {"world": "w1", "planner": "p", "label": "c", "images": 4000, "seconds": 5.0, "bug_free": True,
         "bugs": [], "findings": [_finding(False), _finding(True)]},
    ]
    got = outcomes(runs)
    assert got == [BugOutcome("w0: a-bug", 3.0, True, 2500), BugOutcome("w0: b-bug", 15.0, False, None)]
    s = planner_summary(runs, got, run_budget=20_000)
    assert (s["bugs_found"], s["bugs_planted"]) == (1, 2) and s["recall"]["rate"] == pytest.approx(0.5, abs=TOL)
    assert s["recall_measurable"] == {**rate_with_ci(1, 2), "min_ratio": 2.0}
    weak = planner_summary(runs, [*got, BugOutcome("w1: weak", 0.9, False, None)], run_budget=20_000)
    assert weak["recall"]["n"] == 3 and weak["recall_measurable"]["n"] == 2
    assert (s["false_confirmed"], s["confirmed_findings"]) == (2, 6)
    assert s["bug_free_classes"] == {"runs": 1, "confirmed": 2, "false": 1,
                                     "runs_with_false": rate_with_ci(1, 1)}
    assert s["images_per_class"]["median"] == pytest.approx(10_000, abs=TOL)
    assert s["images_until_confirmed"]["median"] == pytest.approx(2500, abs=TOL)
    # The strong bugs (oracle >= 10x) apart: one planted (b-bug, 15x), none found.
    assert s["images_until_confirmed_strong"] == {"median": None, "p90": None, "n": 0, "min_ratio": 10.0,
                                                  "planted": 1}
    strong = planner_summary(runs, [*got, BugOutcome("w1: s", 12.0, True, 1400)], run_budget=20_000)
    assert strong["images_until_confirmed_strong"]["median"] == pytest.approx(1400, abs=TOL)
    assert strong["images_until_confirmed_strong"]["planted"] == 2
    assert [c["k"] for c in s["recall_vs_budget"]] == [0, 1, 1, 1, 1]  # by 2,000, 3,000, 5,000, 10,000, 20,000
    assert set(s["recall_by_strength"]) == {"2-5x", "10-20x"}
    assert s["images"] == 34_000 and s["seconds"] == pytest.approx(45.0, abs=TOL)


# -- --worlds -----------------------------------------------------------------------------------------------------


def test_worlds_spec_names_random_worlds_files_and_packaged_worlds(tmp_path):
    specs = parse_worlds("random:3")
    assert [s.key for s in specs] == ["random-0", "random-1", "random-2"]
    assert specs[1].world.config_hash() == random_world(1).config_hash()
    path = tmp_path / "w.yaml"
    path.write_text(random_world_yaml(7))
    specs = parse_worlds(f" default , random:2,{path},random:1 ")
    assert [s.key for s in specs] == ["default", "random-0", "random-1", "random-7"]
    assert [s.source for s in specs] == ["default", "random:0", "random:1", str(path)]


@pytest.mark.parametrize("spec, words", [
    ("", "no world named"), ("random:", "random:N"), ("random:x", "random:N"), ("random:0", "random:N"),
    ("default,nosuchworld", "'nosuchworld': no such file, not a packaged world"),
])
def test_bad_worlds_specs_fail_in_one_line(spec, words):
    with pytest.raises(ValueError) as e:
        parse_worlds(spec)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_bad_world_file_fails_in_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ValueError) as e:
        parse_worlds(f"random:1,{bad}")
    assert str(e.value).startswith("--worlds: world config") and "\n" not in str(e.value)
    clash = tmp_path / "clash.yaml"
    clash.write_text(random_world_yaml(3).replace("name: random-3", "name: random-0"))
    with pytest.raises(ValueError, match="two different worlds are named 'random-0'"):
        parse_worlds(f"random:1,{clash}")


def test_bench_classes_are_the_planted_ones_plus_bug_free_ones():
    w = random_world(0)
    planted = {b.class_ for b in w.bugs}
    assert len(planted) == 5
    only = bench_classes(w)
    assert {c for c, _ in only} == planted and not any(free for _, free in only)
    more = bench_classes(w, bug_free=2)
    free = [c for c, f in more if f]
    assert len(free) == 2 and not set(free) & planted and more[:5] == only
    assert bench_classes(w, bug_free=2) == more  # the same world gives the same classes
    some = sorted(planted)[0]
    assert bench_classes(w, classes=[some, free[0]]) == [(some, False), (free[0], True)]
    assert [c for c, _ in bench_classes(w, classes=["all"])] == list(w.labels.labels)
    with pytest.raises(ValueError, match="has no class 'unicorn'"):
        bench_classes(w, classes=["unicorn"])


# -- the oracle's staged verdict --------------------------------------------------------------------------------------


class PairedOracle:
    """Logits whose failures depend on the caption's rate and the seed only (paired seeds, as the real oracle)."""

    def __init__(self, rates: dict[str, float]) -> None:
        from sleuth.tools.backends.toyworld.config import load_world

        self.labels = load_world().labels
        self.rates = rates
        self.calls: list[tuple[str, int]] = []

    def predictions(self, caption: str, n: int, seed: int = 0) -> np.ndarray:
        self.calls.append((caption, n))
        u = ((np.arange(seed, seed + n, dtype=np.uint64) * np.uint64(2654435761)) % np.uint64(2**32)) / 2.0**32
        logits = np.zeros((n, len(self.labels.labels)), np.float32)
        truth, other = self.labels.index("cat"), self.labels.index("dog")
        logits[:, truth] = 1.0
        logits[u < self.rates.get(caption, self.rates["base"]), other] = 2.0
        return logits


def test_the_oracle_judge_decides_early_only_when_the_first_look_is_clear():
    from sleuth.agent.bench.judge import OracleJudge
    from sleuth.tools.backends.toyworld import CLASS_PROMPT

    oracle = PairedOracle({"base": 0.05, CLASS_PROMPT.format(label="cat"): 0.05, "strong": 0.25, "same": 0.05,
                           "slight": 0.058})
    judge = OracleJudge(oracle, n=10_000)  # type: ignore[arg-type]
    strong = judge.judge("cat", "strong")
    assert strong["stage"] == "first" and strong["n"] == 2000 and strong["real"]
    assert strong["ratio"] == pytest.approx(5.0, rel=0.15) and strong["confidence"] == 0.99
    same = judge.judge("cat", "same")
    assert same["stage"] == "full" and same["n"] == 10_000 and not same["real"]
    assert same["ratio"] == pytest.approx(1.0, abs=TOL) and same["ratio_ci"][0] < 1.0 < same["ratio_ci"][1]
    # Significant (p < 0.05) but its interval reaches below 1.2: not real by the stricter rule.
    slight = judge.judge("cat", "slight")
    assert slight["p_value"] < 0.05 and slight["ratio_ci"][0] < 1.2 and not slight["real"]
    full = judge.judge("cat", "strong", full=True)
    assert full["stage"] == "full" and full["n"] == 10_000 and full["real"]
    calls = len(oracle.calls)
    assert judge.judge("cat", "  Strong ") == strong and len(oracle.calls) == calls  # cached
