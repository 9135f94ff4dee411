"""The classifier under audit: a small CNN trained on the world's biased training set."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sleuth.tools.backends.base import BackendError, Image, LabelSpace
from sleuth.tools.backends.toyworld.config import World
from sleuth.tools.backends.toyworld.nets import ClassifierNet, to_tensor
from sleuth.tools.backends.toyworld.train import Progress, load_prefixed, state_dicts

BATCH = 1024


class ToyClassifier:
    """Top-k logits over the world's labels; weights load (or train, for a new world) on first use."""

    def __init__(self, world: World, device: str = "cpu", progress: Progress | None = None) -> None:
        self.world = world
        self.labels: LabelSpace = world.labels
        self.device = torch.device(device)
        self.id = f"toyworld-cnn:{world.name}:{world.config_hash()[:8]}"
        self.progress = progress
        self._net: ClassifierNet | None = None

    @property
    def net(self) -> ClassifierNet:
        if self._net is None:
            net = ClassifierNet(len(self.labels.labels), input_size=self.world.classifier_training.input_size)
            load_prefixed(net, state_dicts(self.world, self.progress), "classifier.")
            self._net = net.to(self.device)
        return self._net

    def logits(self, images: Sequence[Image] | np.ndarray) -> np.ndarray:
        if len(images) == 0:
            return np.zeros((0, len(self.labels.labels)), np.float32)
        size = self.world.classifier_training.input_size
        net = self.net  # outside inference mode: a new world trains here on first use
        out = []
        with torch.inference_mode():
            for start in range(0, len(images), BATCH):
                try:
                    x = to_tensor(images[start:start + BATCH], size)
                except ValueError as e:
                    raise BackendError(f"{self.id}: {e}") from None
                out.append(net(x.to(self.device)).float().cpu().numpy())
        return np.concatenate(out)
