"""toyworld world configs: loading, validation errors, training departures; the prompt parser."""

from __future__ import annotations

import json

import pytest
import yaml

from sleuth.tools.backends.base import BackendError
from sleuth.tools.backends.toyworld import load_world
from sleuth.tools.backends.toyworld.parser import parse, sample_scene, sample_scenes

WORLD = load_world()


def test_default_world_shape() -> None:
    assert len(WORLD.classes) >= 12
    labels = WORLD.labels
    assert labels.parent("cat") == labels.parent("snow leopard") == "felines"
    assert labels.same_parent("fly", "bee") and not labels.same_parent("fly", "crab")
    assert len(WORLD.bugs) >= 5 and len(WORLD.decoys) >= 3
    assert {b.strength for b in WORLD.bugs} == {"strong", "subtle"}
    nobugs = load_world("nobugs")
    assert nobugs.bugs == [] and nobugs.labels == labels and nobugs.decoys == WORLD.decoys
    assert nobugs.config_hash() != WORLD.config_hash()
    # the calibration world looks the same, but no context attribute predicts the class in its training set
    for attr in ("background", "co_object", "lighting", "domain"):
        assert nobugs.natural("cat", attr) == WORLD.natural("cat", attr)
        assert nobugs.training("cat", attr) == pytest.approx(nobugs.training("crab", attr))
    assert nobugs.training("fox", "colour") == nobugs.natural("fox", "colour")


def test_training_departs_from_nature_only_where_planted() -> None:
    snow = WORLD.vocabulary.names("background").index("snow")
    assert WORLD.natural("cat", "background")[snow] > 0.0
    assert WORLD.training("cat", "background")[snow] == 0.0
    assert WORLD.training("snow leopard", "background")[snow] == pytest.approx(0.9)
    # decoys: the same training probability for every class, whatever nature says
    person = WORLD.vocabulary.names("co_object").index("person")
    dec = next(d for d in WORLD.decoys if d.value == "person")
    assert WORLD.natural("dog", "co_object")[person] != WORLD.natural("crab", "co_object")[person]
    assert WORLD.training("dog", "co_object")[person] == pytest.approx(dec.train_prob)
    assert WORLD.training("crab", "co_object")[person] == pytest.approx(dec.train_prob)
    for label in WORLD.labels.labels:
        assert sum(WORLD.training(label, "background")) == pytest.approx(1.0)


def _raw() -> dict:
    from importlib import resources
    return yaml.safe_load(resources.files("sleuth.tools.backends.toyworld").joinpath("worlds/default.yaml").read_text())


@pytest.mark.parametrize("mutate, fragment", [
    (lambda d: d["classes"][3].update(parent=None), "field classes[3].parent"),
    (lambda d: d["classes"][0]["priors"].update(background={"moon": 1.0}), "unknown background 'moon'"),
    (lambda d: d["bugs"][0].update(confuser="unicorn"), "bugs[0]: unknown class 'unicorn'"),
    (lambda d: d["classes"][1].update(shape="dragon"), "field classes[1].shape"),
    (lambda d: d.pop("vocabulary"), "field vocabulary"),
])
def test_malformed_configs_are_one_line_errors(tmp_path, mutate, fragment) -> None:
    data = _raw()
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(BackendError) as e:
        load_world(path)
    msg = str(e.value)
    assert msg.startswith(f"world config {path}: ") and fragment in msg and "\n" not in msg


def test_json_world_loads_and_not_yaml_is_clear(tmp_path) -> None:
    path = tmp_path / "w.json"
    path.write_text(json.dumps(_raw()))
    assert load_world(path).config_hash() == WORLD.config_hash()
    bad = tmp_path / "bad.yaml"
    bad.write_text("classes: [unclosed")
    with pytest.raises(BackendError, match="not valid YAML"):
        load_world(bad)
    with pytest.raises(BackendError, match="no such file"):
        load_world(tmp_path / "missing.yaml")


@pytest.mark.parametrize("caption, expected", [
    ("a realistic photograph of a fly (insect). it is on a yellow flower. the background is green.",
     {"domain": ["photo"], "co_object": ["flower"], "co_colour": ["yellow"], "background": ["grass"]}),
    ("a photo of a cat in the snow", {"background": ["snow"], "domain": ["photo"]}),
    ("a cat on snow", {"background": ["snow"]}),
    ("a snowy picture of a kitten", {"background": ["snow"], "domain": ["photo"]}),
    ("the background is snow. a cat", {"background": ["snow"]}),
    ("a crayfish next to a net", {"co_object": ["net"]}),
    ("a crayfish with a net at night", {"co_object": ["net"], "lighting": ["night"]}),
    ("a dog in fog", {"lighting": ["fog"]}),
    ("a pencil sketch of a goldfish", {"domain": ["sketch"]}),
    ("a painting of a shark", {"domain": ["painting"]}),
    ("a red crab", {"colour": ["red"]}),
    ("a realistic photograph of a dog. the dog is orange.", {"colour": ["orange"], "domain": ["photo"]}),
    ("a realistic photograph of a goldfish. it is a pencil sketch.", {"domain": ["sketch"]}),
])
def test_parser_tolerates_caption_phrasings(caption, expected) -> None:
    p = parse(caption, WORLD)
    assert p.scene_constraints == expected
    assert p.unrendered == []


def test_parser_label_synonyms_and_unrendered_words() -> None:
    p = parse("a photo of a sleeping kitten wearing a tiny hat", WORLD)
    assert p.label == "cat"
    assert p.unrendered == ["sleeping", "wearing", "tiny", "hat"]
    assert parse("a chain-link fence", WORLD).label == "chainlink fence"
    assert parse("a lobster on the beach", WORLD).label == "crayfish"
    assert parse("nothing to see", WORLD).label is None


def test_sample_scene_is_seeded_and_respects_constraints() -> None:
    p = parse("a realistic photograph of a cat in the snow", WORLD)
    a, b = sample_scene(p, 11, WORLD), sample_scene(p, 11, WORLD)
    assert a == b and a.background == "snow" and a.label == "cat" and a.domain == "photo"
    scenes = sample_scenes(parse("a cat", WORLD), list(range(4000)), WORLD)
    share = sum(s.background == "indoor" for s in scenes) / len(scenes)
    indoor = WORLD.vocabulary.names("background").index("indoor")
    assert abs(share - WORLD.natural("cat", "background")[indoor]) < 0.03
    # the same seed keeps its latents whatever the caption constrains
    plain = sample_scene(parse("a cat", WORLD), 5, WORLD)
    snowy = sample_scene(parse("a cat in the snow", WORLD), 5, WORLD)
    assert (plain.x, plain.pose, plain.scale, plain.texture) == (snowy.x, snowy.pose, snowy.scale, snowy.texture)
