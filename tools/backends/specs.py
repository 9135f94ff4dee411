"""Backend spec strings -> backends.

A spec is ``kind[:argument][,option=value...]``, e.g. ``diffusers:stabilityai/sd-turbo,steps=1,guidance=0``,
``torchvision:resnet50``, ``torchvision:resnet50:/path/state_dict.pt``, ``timm:convnext_tiny:/path/ckpt.pth``,
``open_clip:ViT-B-32:/path/open_clip_model.safetensors``, ``hf:/path/to/folder``, ``efficientnet-lite0``,
``callable:my_package.models:predict``, ``blip:Salesforce/blip-image-captioning-base``, ``toyworld``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tools.backends.base import BackendError, Backends, Classifier, EditOutcome, Generation

KINDS: dict[str, tuple[str, ...]] = {
    "generator": ("toyworld", "diffusers"),
    "classifier": ("toyworld", "torchvision", "timm", "open_clip", "hf", "efficientnet-lite0", "callable"),
    "captioner": ("toyworld", "blip"),
    "embedder": ("toyworld", "open_clip"),
    "editor": ("toyworld", "sd-edit"),
}


@dataclass
class Spec:
    kind: str
    argument: str = ""
    options: dict[str, str] = field(default_factory=dict)

    def option(self, key: str, default: Any = None, cast: type = str) -> Any:
        if key not in self.options:
            return default
        try:
            return cast(self.options[key])
        except ValueError:
            raise BackendError(f"option {key}={self.options[key]!r} of {self.kind} is not a {cast.__name__}.") from None

    def check_options(self, allowed: set[str]) -> None:
        unknown = sorted(set(self.options) - allowed)
        if unknown:
            raise BackendError(f"{self.kind}: unknown option(s) {', '.join(unknown)}; "
                               f"known: {', '.join(sorted(allowed)) or 'none'}.")

    def parts(self, n: int) -> list[str]:
        """The argument split on ':' into at most ``n`` parts, padded with empty strings."""
        got = self.argument.split(":", n - 1) if self.argument else []
        return got + [""] * (n - len(got))


def parse_spec(text: str, component: str) -> Spec:
    text = text.strip()
    head, *opts = text.split(",")
    kind, _, argument = head.partition(":")
    known = KINDS[component]
    if kind not in known:
        raise BackendError(f"unknown {component} kind {kind!r} in {text!r}; known kinds: {', '.join(known)}.")
    options: dict[str, str] = {}
    for o in opts:
        key, eq, value = o.partition("=")
        if not eq or not key.strip():
            raise BackendError(f"bad option {o!r} in {text!r}: expected key=value.")
        options[key.strip()] = value.strip()
    return Spec(kind, argument, options)


class UnavailableEditor:
    """Stands in for the editor when the generator is a real model: editing needs the SD editor."""

    id = "unavailable"

    def edit(self, generation: Generation, source_caption: str, target_caption: str) -> EditOutcome:
        raise BackendError("counterfactual editing on real models needs the Stable Diffusion editor "
                           "(null-text inversion + prompt-to-prompt): start with --editor sd-edit:PATH, PATH a "
                           "Stable Diffusion 1.x/2.x pipeline folder or Hub id in the cache.")


def make_classifier(text: str, *, device: str = "cpu") -> Classifier:
    """A real classifier from its spec (everything but toyworld)."""
    spec = parse_spec(text, "classifier")
    common = {"dtype", "batch"}
    dtype, batch = spec.option("dtype"), spec.option("batch", 32, int)
    if spec.kind == "torchvision":
        spec.check_options(common)
        arch, weights = spec.parts(2)
        if not arch:
            raise BackendError("torchvision spec needs an architecture, e.g. torchvision:resnet50.")
        from tools.backends.classifiers import torchvision_classifier

        return torchvision_classifier(arch, weights or None, device=device, dtype=dtype, batch_size=batch)
    if spec.kind == "timm":
        spec.check_options(common)
        name, ckpt = spec.parts(2)
        if not name:
            raise BackendError("timm spec needs a model name, e.g. timm:resnet50:/path/ckpt.pth.")
        from tools.backends.classifiers import timm_classifier

        return timm_classifier(name, ckpt or None, device=device, dtype=dtype, batch_size=batch)
    if spec.kind == "efficientnet-lite0":
        spec.check_options(common)
        from tools.backends.classifiers import efficientnet_lite0_classifier

        return efficientnet_lite0_classifier(device=device, dtype=dtype, batch_size=batch)
    if spec.kind == "hf":
        spec.check_options(common)
        from tools.backends.classifiers import hf_classifier

        return hf_classifier(_need(spec, "hf:PATH"), device=device, dtype=dtype, batch_size=batch)
    if spec.kind == "open_clip":
        spec.check_options(common | {"templates"})
        from tools.backends.classifiers import OpenClipZeroShotClassifier

        return OpenClipZeroShotClassifier(_open_clip(spec, device), templates=spec.option("templates", "openai"))
    if spec.kind == "callable":
        spec.check_options(set())
        from tools.backends.classifiers import CallableClassifier

        return CallableClassifier(_need(spec, "callable:module:function"))
    raise BackendError(f"classifier kind {spec.kind!r} needs the toyworld loader.")


def _need(spec: Spec, example: str) -> str:
    if not spec.argument:
        raise BackendError(f"{spec.kind} spec needs an argument: {example}.")
    return spec.argument


def _open_clip(spec: Spec, device: str) -> Any:
    from tools.backends.clip import OpenClipModel

    name, pretrained = spec.parts(2)
    if not name:
        raise BackendError("open_clip spec needs a model name, e.g. open_clip:ViT-B-32:/path/weights.safetensors.")
    quick = spec.options.get("quick_gelu")
    return OpenClipModel(name, pretrained or None, device=device, dtype=spec.option("dtype"),
                         batch_size=spec.option("batch", 32, int),
                         quick_gelu=None if quick is None else quick.lower() in {"1", "true", "yes"})


def _generator(spec: Spec, device: str, class_names: list[str]) -> Any:
    from tools.backends.diffusers_generator import DiffusersGenerator

    spec.check_options({"steps", "guidance", "dtype", "height", "width", "batch", "negative", "class_token",
                        "class_name", "checks", "class_top_k", "shift_threshold"})
    checks = None
    if "checks" in spec.options:
        from tools.backends.clip import ClipChecks

        model = _open_clip(parse_spec(spec.options["checks"], "embedder"), device)
        checks = ClipChecks(model, class_names, class_top_k=spec.option("class_top_k", 5, int),
                            shift_threshold=spec.option("shift_threshold", 0.2, float))
    return DiffusersGenerator(
        _need(spec, "diffusers:PATH_OR_ID"), device=device, dtype=spec.option("dtype"),
        num_inference_steps=spec.option("steps", 30, int), guidance_scale=spec.option("guidance", 7.5, float),
        height=spec.option("height", None, int), width=spec.option("width", None, int),
        batch_size=spec.option("batch", 4, int), negative_prompt=spec.option("negative"),
        class_token=spec.option("class_token"), class_name=spec.option("class_name"), checks=checks)


def make_backends(generator: str = "toyworld", classifier: str = "toyworld", captioner: str = "toyworld",
                  embedder: str = "toyworld", editor: str = "toyworld", *, world: str | None = None,
                  device: str = "cpu") -> Backends:
    """The backends named by the specs; toyworld parts come from ``toyworld.load_backends(world)``."""
    specs = {name: parse_spec(text, name) for name, text in
             [("generator", generator), ("classifier", classifier), ("captioner", captioner),
              ("embedder", embedder), ("editor", editor)]}
    real_generator = specs["generator"].kind != "toyworld"
    if specs["editor"].kind == "sd-edit":
        raise BackendError("the Stable Diffusion editor (sd-edit:PATH) is not available in this version.")
    # Real parts first: a missing checkpoint is reported before any toy world is built.
    parts: dict[str, Any] = {}
    if specs["classifier"].kind != "toyworld":
        parts["classifier"] = make_classifier(classifier, device=device)
    if specs["captioner"].kind != "toyworld":
        parts["captioner"] = _captioner(specs["captioner"], device)
    if specs["embedder"].kind != "toyworld":
        from tools.backends.clip import OpenClipEmbedder

        parts["embedder"] = OpenClipEmbedder(_open_clip(specs["embedder"], device))
    toy = None
    # The toyworld editor only edits toyworld images, so it alone does not call for the toy world.
    if any(s.kind == "toyworld" for name, s in specs.items() if not (name == "editor" and real_generator)):
        from tools.backends.toyworld import load_backends

        toy = load_backends(world, device=device)
        for name in ("classifier", "captioner", "embedder"):
            parts.setdefault(name, getattr(toy, name))
    if real_generator:
        parts["generator"] = _generator(specs["generator"], device, list(parts["classifier"].labels.labels))
        parts["editor"] = UnavailableEditor()
        return Backends(**parts)
    assert toy is not None
    return Backends(generator=toy.generator, editor=toy.editor, vocabulary=toy.vocabulary,
                    class_prompt=toy.class_prompt, **parts)


def _captioner(s: Spec, device: str) -> Any:
    s.check_options({"dtype", "batch", "beams", "samples", "max_new_tokens", "seed"})
    from tools.backends.blip_captioner import BlipCaptioner

    return BlipCaptioner(_need(s, "blip:PATH"), device=device, dtype=s.option("dtype"),
                         num_beams=s.option("beams", 3, int), num_samples=s.option("samples", 3, int),
                         max_new_tokens=s.option("max_new_tokens", 30, int), seed=s.option("seed", 0, int),
                         batch_size=s.option("batch", 8, int))
