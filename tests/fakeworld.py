"""A minimal backend set with known failure rates, for testing tools without toyworld.

Images are 8x8 colour patches: the background colour encodes the scene ("snow" white, "grass" green, "sand"
yellow); a red dot in the corner means the image is a sketch. The classifier fails on a known share of images per
background: `RATES`. The captioner reads the background colour back (always right), so the tools' logic can be
checked against exact expectations. Like a weak text encoder, the generator reports the words it cannot draw: every
word outside `WORDS`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sleuth.agent.config import RunConfig
from sleuth.agent.session import Session
from sleuth.tools.backends.base import (
    BackendError,
    Backends,
    EditOutcome,
    Generation,
    LabelSpace,
)
from sleuth.tools.cache import PredictionCache

LABELS = LabelSpace(("cat", "snow leopard", "dog"), {"cat": "pets", "dog": "pets", "snow leopard": "wild cats"})
COLOURS = {"snow": (250, 250, 250), "grass": (30, 160, 40), "sand": (220, 200, 90)}
RATES = {"snow": 0.6, "grass": 0.03, "sand": 0.03}
PRIORS = {"grass": 0.6, "sand": 0.3, "snow": 0.1}
WORDS = frozenset({"a", "an", "the", "of", "in", "on", "at", "it", "is", "there", "next", "to", "with", "and", "cat",
                   "snow", "leopard", "dog", "realistic", "photograph", "photo", "daytime", *COLOURS})
"""Every word the fake generator can render (or that changes nothing)."""


def unrendered(prompt: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(w for w in re.findall(r"[a-z]+", prompt.lower()) if w not in WORDS))


def _background(prompt: str, rng: np.random.Generator) -> str:
    for bg in COLOURS:
        if bg in prompt:
            return bg
    return str(rng.choice(list(PRIORS), p=list(PRIORS.values())))


class FakeGenerator:
    id = "fake-gen"

    def generate(self, prompts: Sequence[str], seeds: Sequence[int]) -> list[Generation]:
        out = []
        for p, s in zip(prompts, seeds):
            rng = np.random.default_rng(s)
            bg = _background(p, rng)
            img = np.zeros((8, 8, 3), np.uint8)
            img[:] = COLOURS[bg]
            # The failure draw lives in the pixels so the classifier can read it back deterministically.
            img[0, 0, 0] = 255 if rng.random() < RATES[bg] else 0
            out.append(Generation(image=img, prompt=p, seed=s, unrendered=unrendered(p),
                                  meta={"background": bg, "fake": True}))
        return out

    def unrendered(self, prompts: Sequence[str]) -> list[tuple[str, ...]]:
        return [unrendered(p) for p in prompts]


class FakeClassifier:
    id = "fake-clf"
    labels = LABELS

    def logits(self, images: Sequence[np.ndarray]) -> np.ndarray:
        out = np.zeros((len(images), 3), np.float32)
        for i, img in enumerate(images):
            out[i] = [0.0, 5.0, 1.0] if img[0, 0, 0] == 255 else [5.0, 0.0, 1.0]
        return out


class FakeCaptioner:
    id = "fake-cap"

    def captions(self, images: Sequence[np.ndarray], class_prompt: str) -> list[list[str]]:
        return [[f"it is in the {self._bg(img)}", "it is daytime"] for img in images]

    def sentence_loglik(self, images: Sequence[np.ndarray], sentence: str, class_prompt: str) -> np.ndarray:
        return np.array([-0.1 if self._bg(img) in sentence else (-1.0 if "daytime" in sentence else -5.0)
                         for img in images])

    @staticmethod
    def _bg(img: np.ndarray) -> str:
        rgb = tuple(int(v) for v in img[1, 1])
        return next(k for k, v in COLOURS.items() if v == rgb)


class FakeEmbedder:
    id = "fake-emb"

    def embed(self, images: Sequence[np.ndarray]) -> np.ndarray:
        f = np.stack([img[1, 1].astype(np.float32) for img in images])
        return f / np.linalg.norm(f, axis=1, keepdims=True)


class FakeEditor:
    id = "fake-edit"

    def edit(self, generation: Generation, source_caption: str, target_caption: str) -> EditOutcome:
        if not generation.meta.get("fake"):
            raise BackendError("this editor only edits images it generated")
        rng = np.random.default_rng(generation.seed)
        bg = _background(target_caption, rng)
        img = generation.image.copy()
        img[1:, :] = COLOURS[bg]
        img[0, 1:] = COLOURS[bg]
        # Re-draw the failure with the same uniform draw: a counterfactual of the same "noise".
        rng = np.random.default_rng(generation.seed)
        _background(generation.prompt, rng)
        img[0, 0] = COLOURS[bg]
        img[0, 0, 0] = 255 if rng.random() < RATES[bg] else 0
        return EditOutcome(image=img, source_caption=source_caption, target_caption=target_caption,
                           meta={"background": bg, "fake": True})


def fake_backends() -> Backends:
    return Backends(
        generator=FakeGenerator(), classifier=FakeClassifier(), captioner=FakeCaptioner(),
        embedder=FakeEmbedder(), editor=FakeEditor(),
    )


def new_session(backends: Backends, run_dir: Path, *, cache: PredictionCache | None = None,
                command: str = "investigate", **settings: Any) -> Session:
    """A session of the class 'cat' (unless ``settings`` name another) with the given config settings."""
    config = RunConfig.model_validate({"class": "cat", **settings})
    return Session(backends=backends, config=config, run_dir=run_dir, cache=cache, command=command)


def forget_seed_claims() -> None:
    """Forget which runs claimed which confirmation draws, in this process's shared caches and in the session's
    cache file: what follows runs as on a machine that never ran an investigation."""
    from sleuth.agent.session import _SHARED
    from sleuth.tools.cache import default_path

    for cache in _SHARED.values():
        cache.forget_claims()
    if default_path().is_file():
        disk = PredictionCache(default_path())
        disk.forget_claims()
        disk.close()
