"""The two small networks: a CNN classifier and a multi-head attribute network (the captioner's eyes).

Both see images area-resized to ``input_size`` (32 px by default), which keeps training within a couple of
minutes on two CPU cores and makes fine cues (spots, stripes) weak, as they are for real models at a distance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

MEAN = torch.tensor([0.5, 0.5, 0.5]).view(1, 3, 1, 1)
STD = torch.tensor([0.25, 0.25, 0.25]).view(1, 3, 1, 1)


def to_tensor(images: Sequence[np.ndarray] | np.ndarray, input_size: int) -> torch.Tensor:
    """uint8 ``(N, H, W, 3)`` -> normalised float ``(N, 3, input_size, input_size)``."""
    arr = np.ascontiguousarray(np.stack(images) if not isinstance(images, np.ndarray) else images)
    if arr.ndim != 4 or arr.shape[-1] != 3 or arr.dtype != np.uint8:
        raise ValueError(f"expected uint8 RGB images (N, H, W, 3), got {arr.dtype} {arr.shape}")
    x = torch.from_numpy(arr).permute(0, 3, 1, 2).float().div_(255.0)
    if x.shape[-1] != input_size or x.shape[-2] != input_size:
        x = F.adaptive_avg_pool2d(x, input_size) if x.shape[-1] % input_size == 0 else \
            F.interpolate(x, size=(input_size, input_size), mode="area")
    return (x - MEAN) / STD


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Trunk(nn.Module):
    """Four conv blocks with pooling: 32 px -> a ``width * 4``-d feature."""

    def __init__(self, width: int = 16, input_size: int = 32) -> None:
        super().__init__()
        w = width
        # Larger inputs get a strided stem: fine detail reaches the features at the cost of a 32 px network.
        stride = max(1, input_size // 32)
        stem = nn.Sequential(nn.Conv2d(3, w, 2 * stride + 1, stride=stride, padding=stride, bias=False),
                             nn.BatchNorm2d(w), nn.ReLU(inplace=True))
        self.features = nn.Sequential(
            stem, nn.MaxPool2d(2),
            _block(w, 2 * w), nn.MaxPool2d(2),
            _block(2 * w, 4 * w), nn.MaxPool2d(2),
            _block(4 * w, 4 * w), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.dim = 4 * w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


class ClassifierNet(nn.Module):
    def __init__(self, n_classes: int, width: int = 16, input_size: int = 32) -> None:
        super().__init__()
        self.trunk = Trunk(width, input_size)
        self.head = nn.Linear(self.trunk.dim, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(x))


class AttributeNet(nn.Module):
    """One softmax head per scene attribute; ``features`` is the embedder's representation."""

    def __init__(self, head_sizes: dict[str, int], width: int = 16, input_size: int = 32) -> None:
        super().__init__()
        self.trunk = Trunk(width, input_size)
        self.proj = nn.Sequential(nn.Linear(self.trunk.dim, 64), nn.ReLU(inplace=True))
        self.heads = nn.ModuleDict({k: nn.Linear(64, n) for k, n in head_sizes.items()})

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.trunk(x))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        f = self.features(x)
        return {k: h(f) for k, h in self.heads.items()}
