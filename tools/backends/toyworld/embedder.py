"""The embedder: the captioner's attribute features, so failures cluster by what the scene shows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sleuth.tools.backends.base import Image
from sleuth.tools.backends.toyworld.captioner import ToyCaptioner


class ToyEmbedder:
    """The attribute network's penultimate features, L2-normalised: images of one kind of scene cluster."""

    def __init__(self, captioner: ToyCaptioner) -> None:
        self.captioner = captioner
        self.id = f"toyworld-embedder:{captioner.world.name}:{captioner.world.config_hash()[:8]}"

    def embed(self, images: Sequence[Image]) -> np.ndarray:
        if len(images) == 0:
            return np.zeros((0, 64), np.float32)
        f = self.captioner.features(images).astype(np.float32)
        return f / np.maximum(np.linalg.norm(f, axis=1, keepdims=True), 1e-8)
