"""The planted-bug benchmark: scoring against the oracle, the null classifier, calibration, the command."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sleuth.agent.bench.discovery import Calibration, names_bug
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


def test_calibration_runs_against_the_null_classifier_confirm_nothing(tmp_path):
    out = Calibration(runs=3, budget=6000, baseline_n=500, root=tmp_path).run()
    assert out["runs"] == 3 and out["runs_with_findings"] == 0 and out["share_with_findings"] == 0.0
    # Clopper-Pearson upper bound for 0/3.
    assert out["share_ci"][1] == pytest.approx(1 - 0.025 ** (1 / 3), rel=1e-6)
    assert out["images"] > 3 * 500


def test_bench_discovery_command_scores_a_subset(capsys, tmp_path):
    code = main(["bench", "discovery", "--classes", "cat,crayfish", "--planners", "protocol", "--oracle-n", "3000",
                 "--out", str(tmp_path), "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    p = out["planners"]["protocol"]
    assert {"recall", "false_findings", "images_per_bug", "seconds"} <= set(p)
    # The planted bug of cat is found (crayfish's is out-ranked by eight stronger real failure modes of the
    # classifier under the confirmation cap), recall is what the runs found, and every confirmed finding is real.
    assert p["bugs_planted"] == 2 and "cat in snow" in p["found"] and p["recall"] == len(p["found"]) / 2, p
    assert p["false_confirmed"] == 0 and p["false_findings"] == 0.0
    assert p["images_per_bug"] == pytest.approx(p["images"] / len(p["found"])) and p["images"] <= 2 * 20_000
    assert json.loads((tmp_path / "bench.json").read_text())["planners"] == out["planners"]
    for run in out["runs"]:
        for f in run["findings"]:
            assert f["oracle"]["n"] == 3000 and f["oracle"]["real"]
