"""The classifier under audit: a small CNN trained on the world's biased training set."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from sleuth.tools.backends.base import BackendError, Image, LabelSpace
from sleuth.tools.backends.loading import fingerprint
from sleuth.tools.backends.toyworld.config import World
from sleuth.tools.backends.toyworld.nets import ClassifierNet, to_tensor
from sleuth.tools.backends.toyworld.train import Progress, load_prefixed, state_dicts

BATCH = 1024


class ToyClassifier:
    """Top-k logits over the world's labels; weights load (or train, for a new world) on first use."""

    def __init__(self, world: World, device: str = "cpu", progress: Progress | None = None,
                 weights: str | Path | None = None) -> None:
        self.world = world
        self.labels: LabelSpace = world.labels
        self.device = torch.device(device)
        self.id = f"toyworld-cnn:{world.name}:{world.config_hash()[:8]}"
        self.progress = progress
        self.weights = None if weights is None else Path(weights).expanduser()
        if self.weights is not None:
            self._check_weights(self.weights)
            self.id += f":{self.weights.name}@{fingerprint(self.weights)}"
        self._net: ClassifierNet | None = None

    def _check_weights(self, path: Path) -> None:
        """Weights of this world's classifier from a file (a mitigated classifier, say): refused unless they were
        made for this world's config."""
        if not path.is_file():
            raise BackendError(f"toyworld classifier weights not found: {path} is not a file.")
        try:
            with safe_open(str(path), framework="pt") as f:
                made_for = (f.metadata() or {}).get("config_hash")
        except Exception as e:  # a file safetensors cannot read
            raise BackendError(f"toyworld classifier weights {path}: cannot read: {str(e).splitlines()[0]}") from None
        if made_for != self.world.config_hash():
            raise BackendError(f"toyworld classifier weights {path} were made for another world config "
                               f"({(made_for or 'unknown')[:8]}), not {self.world.name} "
                               f"({self.world.config_hash()[:8]}).")

    @property
    def net(self) -> ClassifierNet:
        if self._net is None:
            net = ClassifierNet(len(self.labels.labels), input_size=self.world.classifier_training.input_size)
            if self.weights is not None:
                tensors = load_file(str(self.weights))
                prefix = "classifier." if any(k.startswith("classifier.") for k in tensors) else ""
                try:
                    load_prefixed(net, tensors, prefix)
                except RuntimeError as e:
                    raise BackendError(f"toyworld classifier weights {self.weights} do not fit the network: "
                                       f"{str(e).splitlines()[0]}") from None
            else:
                load_prefixed(net, state_dicts(self.world, self.progress), "classifier.")
            self._net = net.to(self.device)
        return self._net

    def preprocess(self, images: Sequence[Image]) -> torch.Tensor:
        """The network's input for ``images``."""
        return to_tensor(images, self.world.classifier_training.input_size).to(self.device)

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
