"""Another machine, simulated: toyworld renders and classifier logits that differ in their last digits.

Another CPU (or a GPU) does not repeat a float computation bit for bit. Here every rendered image has ``share`` of
its pixel values moved by one grey level, chosen by a hash of the image (so the generator and the editor, which
re-renders a scene to check it, agree with each other, as they would on one real machine), and every logit moves by
about ``logit_noise``. Borderline labels flip, image hashes change, counts may drift by one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from sleuth.tools.backends.toyworld.classifier import ToyClassifier
from sleuth.tools.backends.toyworld.render import Renderer


def _rng(data: bytes, salt: int) -> np.random.Generator:
    return np.random.default_rng([salt, int.from_bytes(hashlib.sha256(data).digest()[:8], "little")])


@contextmanager
def another_machine(mp: pytest.MonkeyPatch, *, share: float = 0.005, logit_noise: float = 1e-5) -> Iterator[None]:
    render, logits = Renderer.render, ToyClassifier.logits

    def noisy_render(self: Renderer, scenes: list) -> np.ndarray:
        out = render(self, scenes)
        for img in out:
            rng = _rng(img.tobytes(), 1)
            flat = img.reshape(-1)
            idx = rng.choice(flat.size, size=max(1, int(share * flat.size)), replace=False)
            flat[idx] = np.clip(flat[idx].astype(np.int16) + rng.choice([-1, 1], size=idx.size), 0, 255)
        return out

    def noisy_logits(self: ToyClassifier, images: list) -> np.ndarray:
        out = logits(self, images)
        rng = _rng(np.ascontiguousarray(out).tobytes(), 2)
        return (out + logit_noise * rng.standard_normal(out.shape)).astype(np.float32)

    with mp.context() as m:
        m.setattr(Renderer, "render", noisy_render)
        m.setattr(ToyClassifier, "logits", noisy_logits)
        m.setenv("SLEUTH_NO_CACHE", "1")  # predictions cached from this machine would hide the other one
        yield
