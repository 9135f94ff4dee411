"""A null classifier: right about one class except for errors that do not depend on the image's content.

It fails on a fixed share of images, chosen by a hash of the pixels, and names a hashed wrong label when it does.
No caption can change its failure rate, so every confirmed finding against it is a false finding: the benchmark's
calibration runs investigations against it to measure how often the statistics let one through.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from sleuth.tools.backends.base import BackendError, Image, LabelSpace


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
