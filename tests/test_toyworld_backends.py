"""toyworld backends: renderer determinism and styles, the protocols, captioner, embedder, editor, criteria."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sleuth.tools.backends.base import (
    BackendError,
    Captioner,
    Classifier,
    Editor,
    Embedder,
    Generation,
    Generator,
    LabelSpace,
)
from sleuth.tools.backends.criteria import failed
from sleuth.tools.backends.toyworld import load_backends, load_world
from sleuth.tools.backends.toyworld.parser import parse, sample_scene
from sleuth.tools.backends.toyworld.render import Renderer

WORLD = load_world()


@pytest.fixture(scope="module")
def backends():
    return load_backends()


def test_same_prompt_and_seed_give_the_same_image(backends) -> None:
    gen = backends.generator
    prompt = "a realistic photograph of a cat in the snow"
    a = gen.generate([prompt, prompt, "a crab"], [3, 4, 3])
    b = gen.generate([prompt], [3])
    assert a[0].image.dtype == np.uint8 and a[0].image.shape == (64, 64, 3)
    assert np.array_equal(a[0].image, b[0].image)
    assert not np.array_equal(a[0].image, a[1].image)
    assert a[0].meta["scene"]["background"] == "snow" and a[2].meta["scene"]["label"] == "crab"
    assert gen.generate(["a purple cat wearing a hat"], [0])[0].unrendered == ("wearing", "hat")


@pytest.mark.parametrize("size", [32, 128])
def test_other_sizes(size) -> None:
    img = load_backends(size=size).generator.generate(["a dog"], [1])[0].image
    assert img.shape == (size, size, 3)


def test_lighting_and_domain_live_in_the_pixels() -> None:
    r = Renderer(WORLD)
    base = sample_scene(parse("a realistic photograph of a dog on the grass", WORLD), 9, WORLD)
    styles = {k: r.render([dataclasses.replace(base, **v)])[0].astype(float) for k, v in {
        "day": {}, "night": {"lighting": "night"}, "fog": {"lighting": "fog"},
        "sketch": {"domain": "sketch"}, "painting": {"domain": "painting"}}.items()}
    assert styles["night"].mean() < 0.6 * styles["day"].mean()
    assert styles["night"][..., 2].mean() > styles["night"][..., 0].mean()  # blue cast
    assert styles["fog"].std() < 0.7 * styles["day"].std()
    def chroma(x: np.ndarray) -> float:
        return float(np.abs(x - x.mean(axis=-1, keepdims=True)).mean())

    sk = styles["sketch"]
    assert chroma(sk) < 0.4 * chroma(styles["day"]) and sk.mean() > styles["day"].mean()  # grey lines on paper
    colours = {k: len(np.unique(v.reshape(-1, 3), axis=0)) for k, v in styles.items()}
    assert colours["painting"] < colours["day"]


def test_backends_implement_the_protocols(backends) -> None:
    assert isinstance(backends.generator, Generator) and isinstance(backends.classifier, Classifier)
    assert isinstance(backends.captioner, Captioner) and isinstance(backends.embedder, Embedder)
    assert isinstance(backends.editor, Editor)
    assert backends.prompt_for("cat") == "a realistic photograph of a cat"
    assert "in the snow" in backends.vocabulary.background and "a net" in backends.vocabulary.object
    assert "pencil sketch" in backends.vocabulary.domain and "at night" in backends.vocabulary.lighting
    assert len(set(backends.ids.values())) == 5


def test_classifier_recognises_plain_photographs(backends) -> None:
    labels = backends.classifier.labels.labels
    prompts = [backends.prompt_for(c) for c in labels for _ in range(40)]
    seeds = list(range(len(prompts)))
    logits = backends.classifier.logits([g.image for g in backends.generator.generate(prompts, seeds)])
    assert logits.shape == (len(prompts), len(labels))
    acc = (np.argmax(logits, axis=1) == np.repeat(np.arange(len(labels)), 40)).mean()
    assert acc > 0.85


def test_captioner_reads_scenes_from_pixels(backends) -> None:
    gens = backends.generator.generate(["a realistic photograph of a crab in the snow"] * 30, list(range(30)))
    images = [g.image for g in gens]
    prompt = backends.prompt_for("crab")
    caps = backends.captioner.captions(images, prompt)
    assert sum("it is in the snow" in c for c in caps) >= 24
    assert any(s == "the background is white" for c in caps for s in c)
    cap = backends.captioner
    true = cap.sentence_loglik(images, "it is in the snow", prompt)
    false = cap.sentence_loglik(images, "it is on the grass", prompt)
    unseen = cap.sentence_loglik(images, "it is in the snow wearing a hat", prompt)
    assert true.shape == (30,) and (true > false).mean() > 0.9
    assert np.all(unseen < true)


def test_embedder_is_normalised_and_groups_scenes(backends) -> None:
    snow = [g.image for g in backends.generator.generate(["a cat in the snow"] * 20, list(range(20)))]
    water = [g.image for g in backends.generator.generate(["a cat in the water"] * 20, list(range(20)))]
    f = backends.embedder.embed(snow + water)
    assert np.allclose(np.linalg.norm(f, axis=1), 1.0, atol=1e-5)
    within = (f[:20] @ f[:20].T).mean()
    across = (f[:20] @ f[20:].T).mean()
    assert within > across


def test_editor_changes_only_what_the_captions_disagree_on(backends) -> None:
    src = "a realistic photograph of a cat. it is on the grass."
    g = backends.generator.generate([src], [21])[0]
    out = backends.editor.edit(g, src, "a realistic photograph of a cat. it is in the snow.")
    before, after = g.meta["scene"], out.meta["scene"]
    assert after["background"] == "snow" and before["background"] == "grass"
    assert {k for k in before if before[k] != after[k]} == {"background"}
    assert out.passed["edit_applied"] and not np.array_equal(out.image, g.image)
    # the edited image is itself editable (its meta re-renders it), and editing back restores the original
    edited = Generation(image=out.image, prompt=out.target_caption, seed=g.seed, meta=out.meta)
    back = backends.editor.edit(edited, out.target_caption, src)
    assert np.array_equal(back.image, g.image)
    night = backends.editor.edit(g, src, src + " it is at night.")
    assert night.meta["scene"]["lighting"] == "night" and night.meta["scene"]["background"] == "grass"


def test_editor_refuses_images_it_did_not_make(backends) -> None:
    g = backends.generator.generate(["a dog"], [2])[0]
    with pytest.raises(BackendError, match="only edit images toyworld generated"):
        backends.editor.edit(Generation(image=g.image, prompt="a dog", seed=2), "a dog", "a dog in the snow")
    tampered = g.image.copy()
    tampered[0, 0] ^= 1
    with pytest.raises(BackendError, match="does not re-render"):
        backends.editor.edit(Generation(image=tampered, prompt="a dog", seed=2, meta=g.meta), "a dog", "a dog at night")


def test_criteria() -> None:
    labels = LabelSpace(("cat", "snow leopard", "dog", "fly"), {"cat": "felines", "snow leopard": "felines",
                                                                 "dog": "canines"})
    logits = np.array([[3, 2, 1, 0], [2, 3, 1, 0], [0, 1, 2, 3], [0, 0, 1, 3]], dtype=float)
    assert failed(logits, "cat", labels, "top1").tolist() == [False, True, True, True]
    assert failed(logits, "cat", labels, "topk", k=2).tolist() == [False, False, True, True]
    assert failed(logits, "cat", labels, "parent", k=1).tolist() == [False, False, True, True]
    assert failed(logits, "cat", labels, "parent", k=2).tolist() == [False, False, True, True]
    assert failed(logits, "cat", labels, "parent", k=3).tolist() == [False, False, False, False]
    assert failed(logits, "dog", labels, "parent", k=1).tolist() == [True, True, True, True]
    with pytest.raises(BackendError, match="unknown failure criterion"):
        failed(logits, "cat", labels, "top5")
    with pytest.raises(BackendError, match="unknown class"):
        failed(logits, "cta", labels, "top1")
