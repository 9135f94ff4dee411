"""CLIP models (open_clip, or transformers' CLIPModel): image embeddings for clustering, and Dataset Interfaces'
CLIP checks on generated images.

Vendrow et al. keep a generated image only if CLIP sees the class in it and the intended shift ("in the snow",
"pencil sketch", ...). Here both checks are explicit, with thresholds the user can set:

- class present: among the prompts "a photo of a {class}" for every class, the image's own class ranks within
  ``class_top_k`` by CLIP similarity;
- shift present: the cosine similarity of the image to the shift text is at least ``shift_threshold``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sleuth.tools.backends.base import BackendError, Image
from sleuth.tools.backends.loading import (
    batches,
    choose_device,
    choose_dtype,
    dtype_tag,
    fingerprint,
    resolve_hub_file,
    resolve_pretrained,
    to_pil,
)


class OpenClipModel:
    """An open_clip model loaded on first use (or by `load`) from a checkpoint file, a pretrained tag in the HF
    cache, a model folder (``open_clip_config.json`` + weights, open_clip's Hub layout) or ``hf-hub:org/repo`` in
    the cache. Never downloads."""

    def __init__(self, model_name: str, pretrained: str | None = None, *, device: str = "cpu",
                 dtype: str | None = None, batch_size: int = 32, quick_gelu: bool | None = None) -> None:
        import open_clip

        self.model_name = model_name
        self.pretrained = pretrained
        self.batch_size = batch_size
        self.device = choose_device(device)
        self.dtype = choose_dtype(dtype, self.device)
        self._kwargs: dict[str, Any] = {}
        self._name = model_name
        self._weights: str | None = None
        self._source: str = pretrained or "random"
        folder = None
        if model_name.startswith("hf-hub:"):
            folder = resolve_pretrained(model_name[len("hf-hub:"):], what="open_clip model")
        elif Path(model_name).expanduser().is_dir():
            folder = Path(model_name).expanduser()
        elif model_name not in open_clip.list_models():
            raise BackendError(f"unknown open_clip model {model_name!r}: neither a model folder nor one of "
                               f"open_clip.list_models(), e.g. ViT-B-32.")
        if folder is not None:
            if not (folder / "open_clip_config.json").is_file():
                raise BackendError(f"open_clip model {model_name!r}: no open_clip_config.json in {folder}.")
            if not any(next(folder.glob(f"*.{ext}"), None) for ext in ("safetensors", "bin", "pth")):
                raise BackendError(f"open_clip model {model_name!r}: no weights (.safetensors, .bin, .pth) in "
                                   f"{folder}.")
            self._name = f"local-dir:{folder}"
            self._source = f"folder@{fingerprint(folder)}"
            if pretrained:
                raise BackendError(f"open_clip model {model_name!r} is a folder holding its weights; drop "
                                   f"{pretrained!r}.")
        if pretrained:
            self._weights = self._resolve_weights(pretrained)
            # A file's own fingerprint; a cached tag's snapshot commit.
            weights = Path(self._weights).expanduser()
            self._source = f"{pretrained}@{fingerprint(weights if resolve_local(pretrained) else weights.parent)}"
        if quick_gelu is not None:
            self._kwargs["force_quick_gelu"] = quick_gelu
        self._model: Any = None
        self._preprocess: Any = None
        self._tokenizer: Any = None

    @property
    def id(self) -> str:
        return f"open_clip:{self.model_name}:{self._source}{dtype_tag(self.dtype)}"

    def _resolve_weights(self, pretrained: str) -> str:
        import open_clip

        if resolve_local(pretrained):
            return pretrained
        cfg = open_clip.get_pretrained_cfg(self.model_name, pretrained)
        if not cfg:
            tags = ", ".join(t for m, t in open_clip.list_pretrained() if m == self.model_name) or "none"
            raise BackendError(f"open_clip {self.model_name}: {pretrained!r} is neither a checkpoint file nor a "
                               f"pretrained tag (tags: {tags}).")
        if not cfg.get("hf_hub"):
            raise BackendError(f"open_clip {self.model_name}:{pretrained} is only published by URL "
                               f"({cfg.get('url')}); download it and pass the file path.")
        repo = cfg["hf_hub"].strip("/")
        path = resolve_hub_file(repo, ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"],
                                what=f"open_clip {self.model_name}:{pretrained}")
        # The tag's own settings are lost when loading from a path, so they are passed on explicitly.
        self._kwargs.update(force_quick_gelu=bool(cfg.get("quick_gelu", False)))
        for k in ("mean", "std", "interpolation", "resize_mode"):
            if k in cfg:
                self._kwargs[f"image_{k}"] = cfg[k]
        return str(path)

    def load(self) -> None:
        if self._model is not None:
            return
        import open_clip

        try:
            model, _, preprocess = open_clip.create_model_and_transforms(
                self._name, pretrained=self._weights, device=self.device, **self._kwargs)
        except (RuntimeError, ValueError, OSError) as e:
            raise BackendError(f"open_clip {self.model_name}: cannot load {self._weights}: "
                               f"{str(e).splitlines()[0]}") from None
        self._model = model.to(dtype=self.dtype).eval()
        self._preprocess = preprocess
        self._tokenizer = open_clip.get_tokenizer(self._name)

    @property
    def logit_scale(self) -> float:
        self.load()
        return float(self._model.logit_scale.detach().exp())

    def encode_images(self, images: Sequence[Image]) -> np.ndarray:
        import torch

        self.load()
        pils = to_pil(images)
        out = []
        for sl in batches(len(pils), self.batch_size):
            x = torch.stack([self._preprocess(p) for p in pils[sl]]).to(self.device, self.dtype)
            with torch.no_grad():
                f = self._model.encode_image(x).float()
            out.append(torch.nn.functional.normalize(f, dim=-1).cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, 0), np.float32)

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        self.load()
        out = []
        for sl in batches(len(texts), max(self.batch_size, 256)):
            tokens = self._tokenizer(list(texts[sl])).to(self.device)
            with torch.no_grad():
                f = self._model.encode_text(tokens).float()
            out.append(torch.nn.functional.normalize(f, dim=-1).cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def resolve_local(ref: str) -> bool:
    return Path(ref).expanduser().is_file()


class HFClipModel:
    """A transformers ``CLIPModel`` (with its ``CLIPTokenizer`` and image processor) from a local folder, the HF
    cache, or a packaged name (``toyworld-clip``). Never downloads."""

    def __init__(self, ref: str, *, device: str = "cpu", dtype: str | None = None, batch_size: int = 64) -> None:
        from sleuth.tools.backends.packaged import packaged

        self.ref = ref
        self.batch_size = batch_size
        self.device = choose_device(device)
        self.dtype = choose_dtype(dtype, self.device)
        self.folder = packaged(ref) or resolve_pretrained(ref, what="CLIP model")
        if not (self.folder / "config.json").is_file():
            raise BackendError(f"CLIP model {ref!r}: no config.json in {self.folder} (expected a transformers "
                               f"CLIPModel folder, as save_pretrained writes).")
        self._model: Any = None
        self._processor: Any = None

    @property
    def id(self) -> str:
        return f"clip:{self.ref}@{fingerprint(self.folder)}{dtype_tag(self.dtype)}"

    def load(self) -> None:
        if self._model is not None:
            return
        from transformers import CLIPModel, CLIPProcessor

        from sleuth.tools.backends.loading import quiet_loading

        try:
            with quiet_loading():
                model = CLIPModel.from_pretrained(self.folder, local_files_only=True)
                self._processor = CLIPProcessor.from_pretrained(self.folder, local_files_only=True)
        except (OSError, ValueError) as e:
            raise BackendError(f"CLIP model {self.ref!r}: cannot load {self.folder}: {str(e).splitlines()[0]}") \
                from None
        self._model = model.to(self.device, self.dtype).eval()

    @property
    def logit_scale(self) -> float:
        self.load()
        return float(self._model.logit_scale.detach().exp())

    def encode_images(self, images: Sequence[Image]) -> np.ndarray:
        import torch

        self.load()
        pils = to_pil(images)
        out = []
        for sl in batches(len(pils), self.batch_size):
            x = self._processor(images=pils[sl], return_tensors="pt")["pixel_values"].to(self.device, self.dtype)
            with torch.no_grad():
                f = self._model.get_image_features(pixel_values=x)
            f = getattr(f, "pooler_output", f).float()
            out.append(torch.nn.functional.normalize(f, dim=-1).cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, 0), np.float32)

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        self.load()
        tokenizer = self._processor.tokenizer
        out = []
        for sl in batches(len(texts), max(self.batch_size, 256)):
            tokens = tokenizer(list(texts[sl]), padding="max_length", truncation=True, return_tensors="pt",
                               max_length=tokenizer.model_max_length)
            with torch.no_grad():
                f = self._model.get_text_features(input_ids=tokens["input_ids"].to(self.device))
            f = getattr(f, "pooler_output", f).float()
            out.append(torch.nn.functional.normalize(f, dim=-1).cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


class ClipEmbedder:
    """L2-normalised CLIP image features (open_clip or transformers) for clustering failed images."""

    def __init__(self, model: OpenClipModel | HFClipModel) -> None:
        self.model = model
        self.id = model.id

    def embed(self, images: Sequence[Image]) -> np.ndarray:
        return self.model.encode_images(images).astype(np.float32)


OpenClipEmbedder = ClipEmbedder
"""The former name, from when open_clip was the only CLIP."""


@dataclass
class ClipCheck:
    """CLIP's view of one generated image."""

    class_name: str | None
    class_rank: int | None = None
    """1 = the image's own class scored highest among all class prompts."""
    class_present: bool = True
    shift_text: str = ""
    shift_score: float | None = None
    shift_present: bool = True
    scores: dict[str, float] = field(default_factory=dict)


class ClipChecks:
    """Dataset Interfaces' two checks: is the class in the image, and is the intended shift in it."""

    def __init__(self, model: OpenClipModel | HFClipModel, class_names: Sequence[str], *, class_top_k: int = 5,
                 shift_threshold: float = 0.2, class_template: str = "a photo of a {}.") -> None:
        if not class_names:
            raise BackendError("CLIP checks need the list of class names.")
        self.model = model
        self.class_names = list(class_names)
        self.class_top_k = class_top_k
        self.shift_threshold = shift_threshold
        self.class_template = class_template
        self._class_text: np.ndarray | None = None
        self.id = f"{model.id}:top{class_top_k}:shift{shift_threshold:g}"
        # Longest names first so "tiger cat" wins over "cat" when both are classes.
        self._by_length = sorted(self.class_names, key=len, reverse=True)

    def split_prompt(self, prompt: str,
                     class_prompt: str = "a realistic photograph of a {label}") -> tuple[str | None, str]:
        """(class named in the prompt, the rest of it: the shift). No class → (None, "")."""
        low = prompt.lower()
        for name in self._by_length:
            m = re.search(rf"(?<![\w-]){re.escape(name.lower())}(?![\w-])", low)
            if m is None:
                continue
            base = class_prompt.format(label=name).lower()
            rest = low.replace(base, " ", 1) if base in low else low[:m.start()] + " " + low[m.end():]
            rest = re.sub(r"\s+", " ", rest).strip(" ,.")
            return name, rest
        return None, ""

    def class_text_features(self) -> np.ndarray:
        if self._class_text is None:
            self._class_text = self.model.encode_texts([self.class_template.format(c) for c in self.class_names])
        return self._class_text

    def check(self, images: Sequence[Image], prompts: Sequence[str],
              class_prompt: str = "a realistic photograph of a {label}") -> list[ClipCheck]:
        feats = self.model.encode_images(images)
        splits = [self.split_prompt(p, class_prompt) for p in prompts]
        sims = feats @ self.class_text_features().T
        shift_texts = sorted({s for _, s in splits if s})
        shift_feats = dict(zip(shift_texts, self.model.encode_texts(shift_texts))) if shift_texts else {}
        out = []
        for i, (name, shift) in enumerate(splits):
            c = ClipCheck(class_name=name, shift_text=shift)
            if name is not None:
                j = self.class_names.index(name)
                c.class_rank = int((sims[i] > sims[i, j]).sum()) + 1
                c.class_present = c.class_rank <= self.class_top_k
                c.scores["class_similarity"] = float(sims[i, j])
            if shift:
                c.shift_score = float(feats[i] @ shift_feats[shift])
                c.shift_present = c.shift_score >= self.shift_threshold
                c.scores["shift_similarity"] = c.shift_score
            out.append(c)
        return out
