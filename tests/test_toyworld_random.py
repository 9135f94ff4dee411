"""Random worlds: reproducible configs that validate, bugs spread over attributes and strengths, decoys apart."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from sleuth.agent.cli import main
from sleuth.tools.backends.toyworld import Oracle, load_world
from sleuth.tools.backends.toyworld.config import Bug, World
from sleuth.tools.backends.toyworld.random_world import (
    BIAS_RANGES,
    CONFUSER_P,
    bias_for_strength,
    random_world,
    random_world_data,
)

SEEDS = range(20)


def _bias(world: World, bug: Bug) -> float:
    """The bias back from the confuser's departure (p moves a share b from nature to CONFUSER_P)."""
    (attribute, value), = bug.attributes.items()
    nat = dict(zip(world.vocabulary.names(attribute), world.natural(bug.confuser, attribute)))[value]
    dep = next(d for d in bug.departures if d.class_ == bug.confuser)
    return (dep.train[value] - nat) / (CONFUSER_P - nat)


def test_the_same_seed_gives_the_same_config_and_another_seed_another() -> None:
    assert random_world_data(3) == random_world_data(3)
    assert random_world(3).config_hash() == random_world(3).config_hash()
    assert len({random_world(s).config_hash() for s in range(5)}) == 5
    default = load_world()
    w = random_world(3)
    # Same classes and vocabularies (the renderer draws it), other priors.
    assert w.labels == default.labels and w.vocabulary == default.vocabulary
    assert [c.priors for c in w.classes] != [c.priors for c in default.classes]


def test_bugs_are_valid_and_spread_over_attributes_and_strengths() -> None:
    biases, attributes, decoys = [], Counter(), []
    for s in SEEDS:
        w = random_world(s)
        assert len(w.bugs) == 5
        decoys.append(len(w.decoys))
        involved = [c for b in w.bugs for c in (b.class_, b.confuser)]
        assert len(involved) == len(set(involved))  # no class in two bugs: departures never collide
        for b in w.bugs:
            (attribute, value), = b.attributes.items()
            attributes[attribute] += 1
            assert dict(zip(w.vocabulary.names(attribute), w.natural(b.class_, attribute)))[value] <= 0.3
            biases.append((attribute, _bias(w, b)))
            # The class trains with the value less often than nature shows it, the confuser more often.
            assert w.training(b.class_, attribute)[w.vocabulary.names(attribute).index(value)] <= \
                w.natural(b.class_, attribute)[w.vocabulary.names(attribute).index(value)] + 1e-9
        planted = {(a, v) for b in w.bugs for a, v in b.attributes.items()}
        assert not planted & {(d.attribute, d.value) for d in w.decoys}
    assert set(attributes) == {"background", "co_object", "colour", "lighting", "domain"}
    # A decoy never rescales a bug's attribute against it, so some worlds have fewer than three.
    assert sum(decoys) >= 40 and sum(d > 0 for d in decoys) >= 16, decoys
    # Log-uniform strengths 2..20x: about a third of the bugs in each third of their attribute's bias range.
    where = np.asarray([(b - BIAS_RANGES[a][0]) / (BIAS_RANGES[a][1] - BIAS_RANGES[a][0]) for a, b in biases])
    assert where.min() >= -1e-6 and where.max() <= 1 + 1e-6
    thirds = np.histogram(where, bins=3, range=(0, 1))[0]
    assert all(15 <= t <= 55 for t in thirds), thirds


def test_bias_grows_with_the_strength_asked_for() -> None:
    asked = [2.0, 3.0, 5.0, 8.0, 13.0, 20.0]
    for attribute, (lo, hi) in BIAS_RANGES.items():
        got = [bias_for_strength(s, attribute) for s in asked]
        assert got == sorted(got) and got[0] == lo and got[-1] == hi
        assert bias_for_strength(1.0, attribute) == lo and bias_for_strength(100.0, attribute) == hi


def test_the_command_writes_a_config_that_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.yaml"
    assert main(["world", "random", "--seed", "11", "--out", str(out)]) == 0
    assert load_world(out).config_hash() == random_world(11).config_hash()
    assert main(["world", "random", "--seed", "11"]) == 0
    assert capsys.readouterr().out == out.read_text()
    assert main(["world", "random", "--seed", "-1"]) == 2


@pytest.mark.slow
def test_a_small_random_world_trains_and_its_strong_bugs_show(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    data = random_world_data(0)
    data["classifier_training"].update(n_per_class=400, epochs=4)
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setenv("SLEUTH_CACHE", str(tmp_path / "cache"))
    world = load_world(path)
    report = Oracle(world).check(n=600, seed=7_000_000)
    assert report["accuracy"] > 0.8
    strongest = max(report["bugs"], key=lambda b: b["ratio"])
    assert strongest["ratio"] > 3, [(b["name"], b["ratio"]) for b in report["bugs"]]


def test_random_worlds_borrow_the_default_captioner_and_train_only_their_classifier(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from sleuth.tools.backends.base import BackendError
    from sleuth.tools.backends.toyworld.train import borrowed_captioner, find_weights, state_dicts

    monkeypatch.setenv("SLEUTH_CACHE", str(tmp_path / "cache"))
    default = load_world()
    assert default.captioner_from is None and find_weights(default) is not None  # the shipped hash still matches
    world = World.model_validate(random_world_data(3))
    assert world.captioner_from == "default"
    shipped = state_dicts(default)
    borrowed = borrowed_captioner(world)
    assert set(borrowed) == {k.removeprefix("captioner.") for k in shipped if k.startswith("captioner.")}
    assert all(torch.equal(v, shipped[f"captioner.{k}"]) for k, v in borrowed.items())
    other = random_world_data(3)
    other["captioner_training"]["epochs"] += 1
    with pytest.raises(BackendError, match="has another captioner_training"):
        borrowed_captioner(World.model_validate(other))
    with pytest.raises(ValueError, match="not a packaged world"):
        World.model_validate({**random_world_data(3), "captioner_from": "elsewhere"})
