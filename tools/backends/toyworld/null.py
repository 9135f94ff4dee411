"""A null classifier: right about one class except for errors that do not depend on the image's content.

It fails on a fixed share of images, chosen by a hash of the pixels, and names a hashed wrong label when it does.
No caption can change its failure rate, so every confirmed finding against it is a false finding: the benchmark's
calibration runs investigations against it to measure how often the statistics let one through.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from sleuth.tools.backends.base import BackendError, EditOutcome, Generation, Image, LabelSpace
from sleuth.tools.backends.toyworld.config import World
from sleuth.tools.backends.toyworld.parser import parse


class NullClassifier:
    def __init__(self, labels: LabelSpace, label: str, failure_rate: float = 0.05, salt: int = 0) -> None:
        if label not in labels.labels:
            raise BackendError(labels.unknown_message(label))
        if not 0.0 <= failure_rate < 1.0:
            raise BackendError(f"failure_rate must be in [0, 1), got {failure_rate}")
        self.labels = labels
        self.label = label
        self.failure_rate = failure_rate
        self.salt = salt
        self.id = f"toyworld-null:{label}:{failure_rate:g}:{salt}"

    def _u(self, image: Image) -> tuple[float, int]:
        h = hashlib.sha256(np.ascontiguousarray(image).tobytes() + self.salt.to_bytes(8, "little")).digest()
        return int.from_bytes(h[:8], "little") / 2.0**64, int.from_bytes(h[8:12], "little")

    def logits(self, images: Sequence[Image] | np.ndarray) -> np.ndarray:
        n_labels = len(self.labels.labels)
        target = self.labels.index(self.label)
        out = np.zeros((len(images), n_labels), np.float32)
        for i, image in enumerate(images):
            u, pick = self._u(image)
            wrong = [j for j in range(n_labels) if j != target]
            out[i, wrong[pick % len(wrong)] if u < self.failure_rate else target] = 5.0
        return out


class SceneLedger:
    """What toyworld drew in each image it generated or edited, by the image's bytes: how a partial-null classifier
    knows an image's attributes exactly, where a real classifier would have to read them from the pixels."""

    def __init__(self) -> None:
        self.scenes: dict[bytes, dict[str, Any]] = {}

    @staticmethod
    def key(image: Image) -> bytes:
        a = np.ascontiguousarray(image)
        return hashlib.sha256(a.tobytes() + repr(a.shape).encode()).digest()

    def note(self, image: Image, meta: dict[str, Any]) -> None:
        if "scene" in meta:
            self.scenes[self.key(image)] = meta["scene"]

    def scene(self, image: Image) -> dict[str, Any]:
        try:
            return self.scenes[self.key(image)]
        except KeyError:
            raise BackendError("the partial-null classifier only classifies images toyworld made in this run") from None


class LedgerGenerator:
    """A toyworld generator that notes each image's scene in a ledger (everything else delegated)."""

    def __init__(self, inner: Any, ledger: SceneLedger) -> None:
        self._inner = inner
        self._ledger = ledger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def generate(self, prompts: Sequence[str], seeds: Sequence[int]) -> list[Generation]:
        out: list[Generation] = self._inner.generate(prompts, seeds)
        for g in out:
            self._ledger.note(g.image, g.meta)
        return out


class LedgerEditor:
    """A toyworld editor that notes each edited image's scene in a ledger."""

    def __init__(self, inner: Any, ledger: SceneLedger) -> None:
        self._inner = inner
        self._ledger = ledger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def edit(self, generation: Generation, source_caption: str, target_caption: str) -> EditOutcome:
        out: EditOutcome = self._inner.edit(generation, source_caption, target_caption)
        self._ledger.note(out.image, out.meta)
        return out


class PartialNullClassifier(NullClassifier):
    """Fails at ``failure_rate`` on every image except those whose scene has ``attribute`` = ``value``, where it
    fails at ``hot_rate`` (the choice of which, by a hash of the pixels, as the null classifier's). Exactly one
    attribute value matters, and which captions are null is known: a caption is null when it does not make that
    value more likely than the class prompt does (``hot_share``)."""

    def __init__(self, labels: LabelSpace, label: str, ledger: SceneLedger, attribute: str, value: str,
                 failure_rate: float = 0.05, hot_rate: float = 0.3, salt: int = 0) -> None:
        super().__init__(labels, label, failure_rate, salt)
        if not 0.0 <= hot_rate < 1.0:
            raise BackendError(f"hot_rate must be in [0, 1), got {hot_rate}")
        self.ledger = ledger
        self.attribute = attribute
        self.value = value
        self.hot_rate = hot_rate
        self.id = f"toyworld-partial-null:{label}:{failure_rate:g}:{attribute}={value}:{hot_rate:g}:{salt}"

    def logits(self, images: Sequence[Image] | np.ndarray) -> np.ndarray:
        n_labels = len(self.labels.labels)
        target = self.labels.index(self.label)
        wrong = [j for j in range(n_labels) if j != target]
        out = np.zeros((len(images), n_labels), np.float32)
        for i, image in enumerate(images):
            u, pick = self._u(image)
            hot = self.ledger.scene(image).get(self.attribute) == self.value
            out[i, wrong[pick % len(wrong)] if u < (self.hot_rate if hot else self.failure_rate) else target] = 5.0
        return out


def hot_share(world: World, caption: str, attribute: str, value: str) -> float:
    """P(attribute = value) among the images toyworld generates for ``caption`` (exact, from the priors)."""
    parsed = parse(caption, world)
    label = parsed.label
    if label is None:
        raise BackendError(f"the caption names no class of world {world.name}: {caption!r}")
    names = world.vocabulary.names(attribute)
    p = np.asarray(world.natural(label, attribute), dtype=float)
    allowed = parsed.scene_constraints.get(attribute)
    if allowed:
        mask = np.asarray([v in allowed for v in names])
        if not (p * mask).sum():  # values the priors never draw: the sampler falls back to the allowed ones
            p = mask.astype(float)
        else:
            p = p * mask
    p = p / p.sum()
    return float(p[names.index(value)])
