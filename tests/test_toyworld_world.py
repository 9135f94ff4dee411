"""toyworld's ground truth: the shipped classifier really learned the planted bugs and ignores the decoys.

The fast tests use the shipped weights and fewer images; the slow ones retrain from scratch.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sleuth.agent.cli import main
from sleuth.tools.backends.toyworld import Oracle, load_world
from sleuth.tools.backends.toyworld.classifier import ToyClassifier
from sleuth.tools.backends.toyworld.nets import ClassifierNet
from sleuth.tools.backends.toyworld.train import find_weights, load_prefixed, shipped_path, train_all, train_classifier

WORLD = load_world()


def check_properties(report: dict, *, subtle_hi: float = 5.0) -> None:
    assert report["accuracy"] >= 0.9
    rates = [c["baseline_rate"] for c in report["classes"]]
    assert sum(0.01 <= r <= 0.10 for r in rates) >= len(rates) * 2 / 3, rates
    bugs = report["bugs"]
    assert all(b["ratio"] >= 2.0 for b in bugs), [(b["name"], b["ratio"]) for b in bugs]
    strong = [b for b in bugs if b["strength"] == "strong"]
    subtle = [b for b in bugs if b["strength"] == "subtle"]
    assert len(strong) >= 2 and len(subtle) >= 2
    assert all(b["ratio"] >= 10 for b in strong), [(b["name"], b["ratio"]) for b in strong]
    assert all(2 <= b["ratio"] <= subtle_hi for b in subtle), [(b["name"], b["ratio"]) for b in subtle]
    for d in report["decoys"]:
        assert 1 / 1.5 < d["ratio"] < 1.5, (d["name"], d["ratio"])


def test_shipped_weights_match_the_packaged_configs() -> None:
    for name in ("default", "nobugs"):
        world = load_world(name)
        assert shipped_path(world).is_file()
        assert find_weights(world) == shipped_path(world), f"{name}: shipped weights are stale; retrain them"


def test_the_benchmarks_random_worlds_ship_their_weights(monkeypatch, tmp_path) -> None:
    """``random:20`` finds its classifiers in the package on any machine, none trained or read from a cache."""
    from sleuth.tools.backends.toyworld.random_world import random_world
    from sleuth.tools.backends.toyworld.train import shipped_by_hash, state_dicts

    monkeypatch.setenv("SLEUTH_CACHE", str(tmp_path))  # an empty cache
    shipped = sorted(p.name for p in shipped_by_hash("x").parent.glob("*.safetensors"))
    hashes = [random_world(s).config_hash() for s in range(20)]
    assert shipped == sorted(f"{h}.safetensors" for h in hashes), "stale: scripts/train_toyworld.py --random 20"
    world = random_world(7)
    assert find_weights(world) == shipped_by_hash(world.config_hash())
    tensors = state_dicts(world)  # loads, does not train
    assert {k.split(".")[0] for k in tensors} == {"classifier", "captioner"} and not any(tmp_path.iterdir())


@pytest.mark.e2e
def test_shipped_classifier_has_the_planted_bugs() -> None:
    report = Oracle(WORLD).check(n=1000, seed=9_000_000)
    check_properties(report, subtle_hi=6.0)


def test_oracle_manifest_and_failure_rate() -> None:
    oracle = Oracle(WORLD)
    bugs, decoys = oracle.bugs(), oracle.decoys()
    assert {b.name for b in bugs} >= {"cat in snow", "fly on a flower", "crayfish in a net"}
    snow = next(b for b in bugs if b.name == "cat in snow")
    assert snow.words == ("snow",) and snow.confuser == "snow leopard" and snow.attributes == {"background": "snow"}
    assert snow.caption == "a realistic photograph of a cat. it is in the snow."
    assert all(d.kind == "decoy" for d in decoys) and len(decoys) >= 3
    k, n = oracle.failure_rate(snow.caption, "cat", 300, seed=1)
    k0, _ = oracle.failure_rate("a realistic photograph of a cat", "cat", 300, seed=1)
    assert n == 300 and k > 5 * max(k0, 1)
    # the parent criterion forgives a snow leopard for a cat (same parent group)
    kp, _ = oracle.failure_rate(snow.caption, "cat", 300, seed=1, criterion="parent")
    assert kp < k / 2


@pytest.mark.e2e
def test_world_check_cli_json(capsys) -> None:
    assert main(["world", "check", "--json", "--n", "200"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"accuracy", "classes", "bugs", "decoys", "captioner"}
    assert {"name", "baseline_rate"} <= set(out["classes"][0])
    keys = {"name", "class", "baseline_rate", "rate", "ratio"}
    assert keys <= set(out["bugs"][0]) and keys <= set(out["decoys"][0])
    cap = out["captioner"]
    assert 0.5 < cap["accuracy"]["background"] < 1.0
    assert cap["by_condition"]["fog"]["background"] < cap["by_condition"]["day photo"]["background"]
    assert cap["by_condition"]["night"]["colour"] < cap["by_condition"]["day photo"]["colour"]


def test_world_cli_errors(capsys, tmp_path) -> None:
    assert main(["world", "check", "--world", str(tmp_path / "nope.yaml")]) == 2
    assert "world config not found" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    assert main(["world", "check", "--world", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "world config" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bench_throughput_cli(capsys) -> None:
    assert main(["bench", "throughput", "--json", "--n", "400", "--batch", "200"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["images_per_s"] > 0 and out["n"] == 400


def test_short_training_is_deterministic() -> None:
    world = WORLD.model_copy(update={"classifier_training": WORLD.classifier_training.model_copy(
        update={"n_per_class": 16, "epochs": 1, "batch_size": 32})})
    a = train_classifier(world).state_dict()
    b = train_classifier(world).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_training_reproduces_the_shipped_weights_and_numbers() -> None:
    from safetensors.torch import load_file

    shipped = load_file(str(shipped_path(WORLD)))
    fresh = train_all(WORLD)
    assert shipped.keys() == fresh.keys()
    for k in shipped:
        assert torch.allclose(shipped[k].float(), fresh[k].float(), atol=1e-4, rtol=1e-3), k
    classifier = ToyClassifier(WORLD)
    net = ClassifierNet(len(WORLD.labels.labels), input_size=WORLD.classifier_training.input_size)
    load_prefixed(net, fresh, "classifier.")
    classifier._net = net
    check_properties(Oracle(WORLD, classifier).check(n=2000, seed=11_000_000))


@pytest.mark.slow
def test_nobugs_world_has_no_planted_shortcuts() -> None:
    nobugs = Oracle(load_world("nobugs"))
    assert nobugs.manifest() == [] or all(b.kind == "decoy" for b in nobugs.manifest())
    assert nobugs.accuracy() >= 0.9
    planted = Oracle(WORLD)
    # Pure shortcuts (a context or colour the training set tied to another class) vanish without the departures.
    # Rare contexts (flowers under insects, nets, sketches) stay real, unplanted failures in both worlds.
    for bug in planted.bugs():
        if bug.name not in ("cat in snow", "orange dog"):
            continue
        base = f"a realistic photograph of a {bug.class_}"
        k0, _ = nobugs.failure_rate(base, bug.class_, 2000, seed=11_000_000)
        k1, _ = nobugs.failure_rate(bug.caption, bug.class_, 2000, seed=11_000_000)
        assert k1 < 1.5 * k0, (bug.name, k0, k1)

def test_a_new_world_trains_on_first_use_then_loads_from_the_cache(tmp_path, monkeypatch) -> None:
    import yaml

    from sleuth.tools.backends.toyworld import load_backends
    from sleuth.tools.backends.toyworld import train as train_mod

    data = WORLD.model_dump(mode="json", by_alias=True)
    data["name"] = "tiny"
    data["classifier_training"].update(n_per_class=8, epochs=1, batch_size=32)
    data["captioner_training"].update(n_per_class=8, epochs=1, batch_size=32)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setenv("SLEUTH_CACHE", str(tmp_path / "cache"))
    seen: list[tuple[str, int, int]] = []
    b = load_backends(path, progress=lambda task, done, total: seen.append((task, done, total)))
    assert seen == []  # nothing trains until a model is used
    img = b.generator.generate(["a cat"], [0])[0].image
    assert b.classifier.logits([img]).shape == (1, len(WORLD.labels.labels))
    assert {t for t, _, _ in seen} >= {"training classifier", "training captioner"}
    cached = list((tmp_path / "cache" / "toyworld").glob("*.safetensors"))
    assert len(cached) == 1

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("trained again instead of using the cache")

    monkeypatch.setattr(train_mod, "train_all", no_training)
    again = load_backends(path)
    assert np.allclose(again.classifier.logits([img]), b.classifier.logits([img]))
    assert again.captioner.captions([img], "a realistic photograph of a cat")
