"""The partial-null classifier: exactly one attribute value changes its failure rate, so which captions are null is
known exactly (``hot_share``), and the adversarial planners cannot get a false finding past the tools."""

from __future__ import annotations

import numpy as np
import pytest

from sleuth.agent.bench.calibrate import CalibrationJob, calibration_run
from sleuth.tools.backends.base import BackendError
from sleuth.tools.backends.toyworld import load_backends, load_world
from sleuth.tools.backends.toyworld.null import LedgerGenerator, PartialNullClassifier, SceneLedger, hot_share

CAT = "a realistic photograph of a cat"


def test_hot_share_is_exact_from_the_priors() -> None:
    world = load_world()
    night = world.vocabulary.names("lighting").index("night")
    assert hot_share(world, CAT, "lighting", "night") == pytest.approx(world.natural("cat", "lighting")[night])
    assert hot_share(world, CAT + ". it is at night.", "lighting", "night") == 1.0
    assert hot_share(world, CAT + " in the fog.", "lighting", "night") == 0.0
    assert hot_share(world, CAT + " in the dark.", "lighting", "night") == 1.0  # the parser reads night
    # A caption about something else leaves the share where the class prompt has it: null.
    assert hot_share(world, CAT + " on the grass.", "lighting", "night") == hot_share(world, CAT, "lighting", "night")


def test_the_partial_null_classifier_fails_on_the_hot_value_only() -> None:
    toy = load_backends()
    ledger = SceneLedger()
    gen = LedgerGenerator(toy.generator, ledger)
    clf = PartialNullClassifier(toy.classifier.labels, "cat", ledger, "lighting", "night", 0.05, 0.4, salt=3)
    seeds = list(range(3000))
    night = gen.generate([CAT + ". it is at night."] * 3000, seeds)
    day = gen.generate([CAT + ". it is in daylight."] * 3000, seeds)
    target = clf.labels.index("cat")

    def rate(gens: list) -> float:
        return float(np.mean(np.argmax(clf.logits([g.image for g in gens]), axis=1) != target))

    assert abs(rate(night) - 0.4) < 0.035 and abs(rate(day) - 0.05) < 0.015
    with pytest.raises(BackendError, match="only classifies images toyworld made in this run"):
        clf.logits([np.zeros((64, 64, 3), np.uint8)])


@pytest.mark.parametrize("planner", ["adv-early", "adv-mismatch", "adv-repeat", "adv-peek"])
def test_adversaries_get_no_false_finding_through(planner: str, tmp_path) -> None:
    """One run of each trick against both classifiers. (The rate over many runs is the calibration benchmark's
    job and tests/test_guarantees.py's simulation; here, that the tricks run and the tools refuse them.)"""
    for kind in ("null", "partial-null"):
        r = calibration_run(CalibrationJob(planner, kind, 5, None, 6000, 200, 0.05, 0.3, 0.05, tmp_path))
        assert r["status"] in ("completed", "budget_spent") and not r["false_findings"], r
        assert not r["through"]["finding"] and not r["through"]["confirmation"], r
        assert r["confirmations"] >= 1
