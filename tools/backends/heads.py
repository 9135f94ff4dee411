"""A classifier's final linear layer, to retrain on new data with the rest frozen (`sleuth mitigate`).

The head is the last ``nn.Linear`` of the model with one output per label; its input (caught by a forward hook) is
the feature the head is retrained on, so the features are computed once and training is a few hundred steps of a
linear model. For the toyworld CNN the last convolutional block can be retrained with it (its input is cached
instead). Works for the toyworld CNN and for torchvision, timm and Hugging Face image classifiers; a classifier
without such a head (open_clip zero-shot, a callable) is refused with the reason.

The retrained classifier is written where its kind's spec can load it again, so it can be audited like any other:
``toyworld:FILE``, ``torchvision:ARCH:FILE`` and ``timm:NAME:FILE`` (safetensors, with the label names in the
metadata), or ``hf:FOLDER`` (``save_pretrained`` plus the original image processor).
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from sleuth.tools.backends.base import BackendError, Image
from sleuth.tools.backends.specs import Spec, make_classifier, parse_spec

Progress = Callable[[str, int, int], None]
RETRAINABLE = ("toyworld", "torchvision", "timm", "efficientnet-lite0", "hf")


@dataclass
class Group:
    """Training data of one kind (in-distribution images, or one failure mode's) and its weight in the loss."""

    features: torch.Tensor
    labels: torch.Tensor
    weight: float


def find_head(module: nn.Module, n_labels: int) -> tuple[str, nn.Linear]:
    """The qualified name and module of the last linear layer with ``n_labels`` outputs."""
    found = [(name, m) for name, m in module.named_modules() if isinstance(m, nn.Linear) and m.out_features == n_labels]
    if not found:
        raise BackendError(f"the classifier has no linear layer with {n_labels} outputs to retrain.")
    return found[-1]


class LinearHead:
    """A loaded classifier seen as frozen features followed by a trainable tail: its linear head (``train="head"``),
    or for the toyworld CNN also its last convolutional block (``train="block"``)."""

    def __init__(self, classifier: Any, spec: Spec, *, train: str = "head", batch_size: int = 256) -> None:
        if spec.kind not in RETRAINABLE:
            raise BackendError(f"a {spec.kind} classifier has no final linear layer to retrain; mitigation works on "
                               f"{', '.join(RETRAINABLE)} classifiers.")
        if train not in ("head", "block"):
            raise BackendError(f"train must be 'head' or 'block', got {train!r}")
        if train == "block" and spec.kind != "toyworld":
            raise BackendError("retraining the last block is supported for the toyworld classifier; real "
                               "classifiers retrain their head (train: head).")
        module = getattr(classifier, "net", None) if spec.kind == "toyworld" else getattr(classifier, "module", None)
        if not isinstance(module, nn.Module):
            raise BackendError(f"classifier {classifier.id} does not expose its torch module.")
        self.classifier = classifier
        self.spec = spec
        self.module = module
        self.labels = classifier.labels
        self.head_name, self.head = find_head(module, len(self.labels.labels))
        self.train = train
        self.batch_size = batch_size
        # (name in the module, module) of each trained part, in the order the tail runs them
        self.parts: list[tuple[str, nn.Module]] = [(self.head_name, self.head)]
        if train == "block":
            features = module.get_submodule("trunk.features")
            assert isinstance(features, nn.Sequential)
            last = max(i for i, m in enumerate(features) if isinstance(m, nn.Sequential))
            self.parts = [(f"trunk.features.{i}", features[i]) for i in range(last, len(features))] + self.parts
        self.entry = self.parts[0][1]

    @property
    def id(self) -> str:
        return str(self.classifier.id)

    def features(self, images: Sequence[Image]) -> torch.Tensor:
        """What enters the trained tail for each image (the head's input, a feature vector; or the last block's
        input), float32 on the CPU."""
        caught: list[torch.Tensor] = []

        def hook(_: nn.Module, inputs: tuple[Any, ...]) -> None:
            caught.append(inputs[0].detach().float().cpu())

        run = getattr(self.classifier, "forward", self.module)
        handle = self.entry.register_forward_pre_hook(hook)
        try:
            with torch.inference_mode():
                for start in range(0, len(images), self.batch_size):
                    run(self.classifier.preprocess(images[start:start + self.batch_size]))
        finally:
            handle.remove()
        if not caught:
            return torch.zeros((0, self.head.in_features))
        x = torch.cat(caught)
        if self.train == "head" and x.ndim != 2:
            raise BackendError(f"the head of {self.id} takes inputs of shape {tuple(x.shape[1:])}, not feature "
                               "vectors: it cannot be retrained on its own.")
        return x

    def tail(self) -> nn.Sequential:
        """A float32 CPU copy of the trained parts, in order: cached features in, logits out."""
        return nn.Sequential(*(copy.deepcopy(m) for _, m in self.parts)).float().cpu().eval()

    def save(self, tail: nn.Sequential, out: Path, *, note: str = "") -> str:
        """Write the classifier with ``tail`` in place of its own parts under ``out`` (a folder); returns the spec
        that loads it."""
        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous().clone() for k, v in self.module.state_dict().items()}
        for (name, _), trained in zip(self.parts, tail):
            for key, value in trained.state_dict().items():
                full = f"{name}.{key}"
                state[full] = value.detach().to(state[full].dtype).contiguous().clone()
        labels = json.dumps(list(self.labels.labels))
        kind = self.spec.kind
        if kind == "hf":
            return self._save_hf(state, out)
        path = out / "classifier.safetensors"
        tmp = path.with_name(f".{path.name}.tmp")
        if kind == "toyworld":
            world = self.classifier.world
            save_file({f"classifier.{k}": v for k, v in state.items()}, str(tmp),
                      metadata={"config_hash": world.config_hash(), "world": world.name, "mitigated_from": self.id,
                                "note": note})
            tmp.replace(path)
            return f"toyworld:{path}"
        save_file(state, str(tmp), metadata={"labels": labels, "mitigated_from": self.id, "note": note})
        tmp.replace(path)
        if kind == "torchvision":
            return f"torchvision:{self.spec.parts(2)[0]}:{path}"
        name = "tf_efficientnet_lite0" if kind == "efficientnet-lite0" else self.spec.parts(2)[0]
        return f"timm:{name}:{path}"

    def _save_hf(self, state: dict[str, torch.Tensor], out: Path) -> str:
        from sleuth.tools.backends.loading import resolve_pretrained

        source = resolve_pretrained(self.spec.argument, what="Hugging Face classifier")
        folder = out / "classifier"
        model = copy.deepcopy(self.module).cpu()
        model.load_state_dict(state)
        model.save_pretrained(str(folder), safe_serialization=True)  # type: ignore[operator]
        for name in ("preprocessor_config.json",):
            if (Path(source) / name).is_file():
                shutil.copy2(Path(source) / name, folder / name)
        return f"hf:{folder}"


def fit(tail: nn.Sequential, groups: Sequence[Group], *, steps: int = 1200, lr: float = 3e-3,
        batch: int = 2048, seed: int = 0, progress: Progress | None = None) -> nn.Sequential:
    """Adam on ``sum_g weight_g * cross_entropy_g`` (each group's mean loss), one minibatch of each group per step,
    drawn with a seeded generator: the same data give the same weights. The tail stays in eval mode (batch-norm
    statistics frozen: they were estimated on far more data than this)."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam([p for p in tail.parameters() if p.requires_grad], lr=lr)
    tail.eval()
    for step in range(steps):
        loss = torch.zeros(())
        for g in groups:
            if len(g.labels) == 0 or g.weight == 0:
                continue
            idx = torch.randint(len(g.labels), (batch,), generator=gen) if len(g.labels) > batch \
                else torch.arange(len(g.labels))
            loss = loss + g.weight * F.cross_entropy(tail(g.features[idx]), g.labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if progress is not None and ((step + 1) % 25 == 0 or step + 1 == steps):
            progress("training", step + 1, steps)
    return tail


def tail_logits(tail: nn.Module, features: torch.Tensor, batch: int = 4096) -> np.ndarray:
    with torch.inference_mode():
        out = [tail(features[i:i + batch]).float().numpy() for i in range(0, len(features), batch)]
    return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def reload(spec_text: str, *, device: str = "cpu", world: str | None = None) -> Any:
    """The classifier a saved spec names, loaded as an investigation would load it."""
    spec = parse_spec(spec_text, "classifier")
    if spec.kind == "toyworld":
        from sleuth.tools.backends.toyworld.classifier import ToyClassifier
        from sleuth.tools.backends.toyworld.config import load_world

        return ToyClassifier(load_world(world), device, weights=spec.argument or None)
    return make_classifier(spec_text, device=device)
