"""The planted-bug benchmark: scoring against the oracle, the null classifier, calibration, the command."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sleuth.agent.bench.calibrate import Calibration, CalibrationJob, calibration_run
from sleuth.agent.bench.discovery import names_bug
from sleuth.agent.cli import main
from sleuth.tools import stats
from sleuth.tools.backends.toyworld import Oracle, load_backends
from sleuth.tools.backends.toyworld.null import NullClassifier


@pytest.fixture(scope="module")
def toy():
    return load_backends()


@pytest.fixture(scope="module")
def oracle():
    return Oracle()


def test_null_classifier_errors_do_not_depend_on_the_caption(toy):
    null = NullClassifier(toy.classifier.labels, "cat", failure_rate=0.05, salt=3)
    rates = {}
    for caption in ("a realistic photograph of a cat", "a realistic photograph of a cat. it is in the snow.",
                    "a pencil sketch of a cat."):
        images = [g.image for g in toy.generator.generate([caption] * 2000, list(range(2000)))]
        top = np.argmax(null.logits(images), axis=1)
        k = int((top != toy.classifier.labels.index("cat")).sum())
        rates[caption] = k
        r = stats.binomial_rate(k, 2000, confidence=0.999)
        assert r.low < 0.05 < r.high
    base = rates["a realistic photograph of a cat"]
    for k in rates.values():
        assert stats.compare_rates(k, 2000, base, 2000).p_value > 0.01


def test_a_caption_names_a_bug_as_the_world_reads_it(oracle):
    snow = next(b for b in oracle.bugs() if b.name == "cat in snow")
    sketch = next(b for b in oracle.bugs() if b.class_ == "goldfish")
    assert names_bug("a realistic photograph of a cat. it is in the snow.", snow, oracle.world)
    assert names_bug("a realistic photograph of a cat. the background is white.", snow, oracle.world)
    assert not names_bug("a realistic photograph of a cat. it is in the grass.", snow, oracle.world)
    assert names_bug("a pencil sketch of a goldfish.", sketch, oracle.world)
    assert not names_bug("a painting of a goldfish.", sketch, oracle.world)


@pytest.mark.e2e
def test_calibration_counts_null_hypotheses_through_each_stage(tmp_path):
    out = Calibration(runs=3, planners=["protocol", "adv-many"], budget=4000, baseline_n=500, root=tmp_path).run()
    assert len(out["runs"]) == 2 * 2 * 3 and out["held"]
    for planner in ("protocol", "adv-many"):
        for kind in ("null", "partial-null"):
            v = out["planners"][planner][kind]
            assert v["finding"]["k"] == 0 and v["finding"]["n"] == 3
            # Clopper-Pearson upper bound for 0/3.
            assert v["finding"]["ci"][1] == pytest.approx(1 - 0.025 ** (1 / 3), rel=1e-6)
    # Against a partial-null classifier the real failures (the hot value) are there to be found, and are.
    partial = [r for r in out["runs"] if r["kind"] == "partial-null" and r["planner"] == "protocol"]
    assert sum(bool(r["real_findings"]) for r in partial) >= 2, partial
    many = [r for r in out["runs"] if r["planner"] == "adv-many"]
    assert all(r["confirmations"] == 10 for r in many)  # the whole declared family, and not one attempt more


@pytest.mark.e2e
def test_bench_discovery_command_scores_a_subset(capsys, tmp_path):
    code = main(["bench", "discovery", "--classes", "fly", "--planners", "protocol", "--oracle-n", "3000",
                 "--budget", "4000", "--jobs", "1", "--out", str(tmp_path), "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    p = out["planners"]["protocol"]
    # The planted bug found (confirmed, named, and real by the oracle's interval above 1.2).
    assert p["bugs_planted"] == 1 and p["recall"]["rate"] == 1.0, p
    assert 0 < p["images_until_confirmed"]["median"] <= 4_000
    assert p["runs"] == 1 and p["images_per_class"]["p90"] <= 4_000
    assert p["misses"]["learned"] == 1 and p["misses"]["stages"]["found"] == 1
    assert json.loads((tmp_path / "bench.json").read_text())["planners"] == out["planners"]
    judged = [f for run in out["runs"] for f in run["findings"]]
    assert p["false_confirmed"] == sum(1 for f in judged if not f["oracle"]["real"])
    for f in judged:
        assert f["oracle"]["n"] in (1000, 3000)
        assert f["oracle"]["real"] == (f["oracle"]["ratio_ci"][0] > 1.2)
        if f["bug"] is not None:
            assert f["oracle"]["real"] and f["images_until"] is not None
    for run in out["runs"]:
        (bug,) = run["bugs"]
        assert bug["oracle"]["n"] == 3000 and bug["oracle"]["ratio"] > 5


def test_a_calibration_run_is_filed_reused_and_run_again_after_an_interruption(tmp_path):
    job = CalibrationJob("protocol", "null", 0, None, 600, None, 0.05, 0.3, 0.05, tmp_path)
    first = calibration_run(job)
    run_dir = next((tmp_path / "protocol" / "null").glob("*-0"))
    filed = run_dir.parent / f"{run_dir.name}.json"
    assert json.loads(filed.read_text()) == first and first["images"] > 0
    transcript = next(run_dir.rglob("transcript.jsonl"))
    stamp = transcript.stat().st_mtime_ns
    assert calibration_run(job) == first and transcript.stat().st_mtime_ns == stamp  # reused, not run again
    # Interrupted before its result was filed: the folder is run again from the start, to the same result.
    filed.unlink()
    (run_dir / "left-over").write_text("x")
    again = calibration_run(job)
    assert not (run_dir / "left-over").exists() and filed.exists()
    assert {k: v for k, v in again.items() if k != "seconds"} == {k: v for k, v in first.items() if k != "seconds"}
