"""LANCE's CLIP checks as LANCE computes them: edits compared with the reconstruction, consistency for additions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sleuth.tools.backends.base import Generation
from sleuth.tools.backends.sd_edit import EditSettings, InversionSettings, QualityThresholds, SDEditor, reconstruct
from sleuth.tools.backends.sd_edit.controls import score_edits
from sleuth.tools.backends.sd_edit.ddim import decode_latents
from tests.sd_tiny import tiny_image, tiny_sd

torch.set_num_threads(1)

SOURCE = "a photo of a cat on the grass"


class Recorder:
    """A stand-in CLIP that remembers what it was shown: texts embed by the words they contain, images by colour."""

    id = "recorder"
    vocab = ("cat", "dog", "grass", "sand", "photo")

    def __init__(self) -> None:
        self.images: list[np.ndarray] = []
        self.texts: list[str] = []

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        self.texts += list(texts)
        f = np.array([[0.2 + (w in t.split()) * 3 for w in self.vocab] for t in texts])
        return f / np.linalg.norm(f, axis=1, keepdims=True)

    def encode_images(self, images: list[np.ndarray]) -> np.ndarray:
        self.images += [np.asarray(im) for im in images]
        m = np.array([np.asarray(im, float).mean((0, 1)) / 255 for im in images])
        f = np.concatenate([m, 1 - m.mean(1, keepdims=True), np.full((len(m), 1), 0.1)], axis=1)  # as texts: 5-D
        return f / np.linalg.norm(f, axis=1, keepdims=True)


def test_consistency_of_a_pure_addition_is_against_the_empty_text() -> None:
    """LANCE's pred_consistency compares cos(I2, "sand") with cos(I2, "") when the edit only adds words."""
    scorer = Recorder()
    rng = np.random.default_rng(0)
    a, b = (rng.integers(0, 256, (8, 8, 3), dtype=np.uint8) for _ in range(2))
    (s,) = score_edits(scorer, a, [b], SOURCE, SOURCE + " on the sand", removed=[], added=["on", "the", "sand"])
    assert scorer.texts == [SOURCE, SOURCE + " on the sand", "", "on the sand"]
    img = scorer.encode_images([b])[0]
    t = scorer.encode_texts(["", "on the sand"])
    assert s.consistency == pytest.approx(float(img @ t[1] - img @ t[0]), abs=1e-9)
    assert "consistent" in s.passed(QualityThresholds())


def test_edits_are_scored_against_the_reconstruction(request: pytest.FixtureRequest,
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    cache = getattr(request.config, "cache", None)
    pipe = tiny_sd(Path(cache.mkdir("sd-tiny")) if cache is not None else tmp_path_factory.mktemp("sd"))
    image = tiny_image(pipe, SOURCE, seed=1)
    scorer = Recorder()
    editor = SDEditor(pipeline=pipe, inversion=InversionSettings(steps=4, null_steps=2, null_lr=0.1), scorer=scorer,
                      editing=EditSettings(self_steps=(0.5,)))
    out = editor.edit(Generation(image=image, prompt=SOURCE, seed=1), SOURCE, "a photo of a dog on the grass")
    inv, cached = editor.invert(image, SOURCE)
    assert cached
    (rec,) = decode_latents(pipe, reconstruct(pipe, inv))
    reference, edit = scorer.images
    # The reference is what the inversion reproduces (to a grey level: explicit vs fused attention), not the photo.
    assert int(np.abs(reference.astype(int) - rec.astype(int)).max()) <= 1
    assert float(np.abs(reference.astype(int) - image.astype(int)).mean()) > 5
    np.testing.assert_array_equal(edit, out.image)
    f = scorer.encode_images([reference, edit])
    assert out.scores["clip_image_image"] == pytest.approx(float(f[0] @ f[1]), abs=1e-9)
