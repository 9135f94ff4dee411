"""Backend spec strings -> backends.

A spec is ``kind[:argument][,option=value...]``, e.g. ``diffusers:stabilityai/sd-turbo,steps=1,guidance=0``,
``torchvision:resnet50``, ``torchvision:resnet50:/path/state_dict.pt``, ``timm:convnext_tiny:/path/ckpt.pth``,
``open_clip:ViT-B-32:/path/open_clip_model.safetensors``, ``open_clip:/path/folder``, ``hf:/path/to/folder``,
``efficientnet-lite0``, ``callable:my_package.models:predict``, ``blip:Salesforce/blip-image-captioning-base``,
``toyworld``. `BackendSpecs` holds one spec per slot plus the settings shared by all of them (device, dtype,
textual-inversion class tokens, CLIP checks); commands and audit configs build their backends from it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sleuth.tools.backends.base import BackendError, Backends, Classifier, EditOutcome, Generation

Progress = Callable[[str, int, int], None]

KINDS: dict[str, tuple[str, ...]] = {
    "generator": ("toyworld", "diffusers"),
    "classifier": ("toyworld", "torchvision", "timm", "open_clip", "hf", "efficientnet-lite0", "callable"),
    "captioner": ("toyworld", "blip"),
    "embedder": ("toyworld", "open_clip", "clip", "toyworld-clip"),
    "editor": ("toyworld", "sd-edit"),
}
SLOTS = tuple(KINDS)
CLIP_EMBEDDERS = ("open_clip", "clip", "toyworld-clip")
COMMON = {"dtype", "batch", "device"}
"""Options every real-model spec takes; ``device`` and ``dtype`` override the shared settings for that model."""


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


def make_classifier(text: str, *, device: str = "cpu", dtype: str | None = None) -> Classifier:
    """A real classifier from its spec (everything but toyworld)."""
    spec = parse_spec(text, "classifier")
    device, dtype = spec.option("device", device), spec.option("dtype", dtype)
    batch = spec.option("batch", 32, int)
    if spec.kind == "torchvision":
        spec.check_options(COMMON)
        arch, weights = spec.parts(2)
        if not arch:
            raise BackendError("torchvision spec needs an architecture, e.g. torchvision:resnet50.")
        from sleuth.tools.backends.classifiers import torchvision_classifier

        return torchvision_classifier(arch, weights or None, device=device, dtype=dtype, batch_size=batch)
    if spec.kind == "timm":
        spec.check_options(COMMON)
        name, ckpt = spec.parts(2)
        if not name:
            raise BackendError("timm spec needs a model name, e.g. timm:resnet50:/path/ckpt.pth.")
        from sleuth.tools.backends.classifiers import timm_classifier

        return timm_classifier(name, ckpt or None, device=device, dtype=dtype, batch_size=batch)
    if spec.kind == "efficientnet-lite0":
        spec.check_options(COMMON)
        from sleuth.tools.backends.classifiers import efficientnet_lite0_classifier

        return efficientnet_lite0_classifier(device=device, dtype=dtype, batch_size=batch)
    if spec.kind == "hf":
        spec.check_options(COMMON)
        from sleuth.tools.backends.classifiers import hf_classifier

        return hf_classifier(_need(spec, "hf:PATH"), device=device, dtype=dtype, batch_size=batch)
    if spec.kind == "open_clip":
        spec.check_options(COMMON | {"templates", "quick_gelu"})
        from sleuth.tools.backends.classifiers import OpenClipZeroShotClassifier

        return OpenClipZeroShotClassifier(_open_clip(spec, device, dtype),
                                          templates=spec.option("templates", "openai"))
    if spec.kind == "callable":
        spec.check_options(set())
        from sleuth.tools.backends.classifiers import CallableClassifier

        return CallableClassifier(_need(spec, "callable:module:function"))
    raise BackendError(f"classifier kind {spec.kind!r} needs the toyworld loader.")


def _need(spec: Spec, example: str) -> str:
    if not spec.argument:
        raise BackendError(f"{spec.kind} spec needs an argument: {example}.")
    return spec.argument


def _open_clip(spec: Spec, device: str, dtype: str | None) -> Any:
    from sleuth.tools.backends.clip import OpenClipModel

    name, pretrained = spec.parts(2)
    if name == "hf-hub":  # the Hub id is the model, not a weights file: open_clip:hf-hub:org/repo
        name, pretrained = f"hf-hub:{pretrained}", ""
    if not name:
        raise BackendError("open_clip spec needs a model, e.g. open_clip:ViT-B-32:/path/weights.safetensors or "
                           "open_clip:/path/model_folder.")
    quick = spec.options.get("quick_gelu")
    return OpenClipModel(name, pretrained or None, device=spec.option("device", device),
                         dtype=spec.option("dtype", dtype), batch_size=spec.option("batch", 32, int),
                         quick_gelu=None if quick is None else quick.lower() in {"1", "true", "yes"})


def _clip(spec: Spec, device: str, dtype: str | None) -> Any:
    """A CLIP model from an embedder spec: open_clip:..., clip:PATH_OR_ID (transformers) or toyworld-clip."""
    if spec.kind == "open_clip":
        spec.check_options(COMMON | {"quick_gelu"})
        return _open_clip(spec, device, dtype)
    if spec.kind not in ("clip", "toyworld-clip"):
        raise BackendError(f"{spec.kind} is not a CLIP model: give open_clip:..., clip:PATH_OR_ID or toyworld-clip.")
    spec.check_options(COMMON)
    from sleuth.tools.backends.clip import HFClipModel

    ref = "toyworld-clip" if spec.kind == "toyworld-clip" else _need(spec, "clip:PATH_OR_ID")
    if spec.kind == "toyworld-clip" and spec.argument:
        raise BackendError(f"toyworld-clip takes no argument, got {spec.argument!r}.")
    return HFClipModel(ref, device=spec.option("device", device), dtype=spec.option("dtype", dtype),
                       batch_size=spec.option("batch", 64, int))


def _captioner(s: Spec, device: str, dtype: str | None) -> Any:
    s.check_options(COMMON | {"beams", "samples", "max_new_tokens", "seed"})
    from sleuth.tools.backends.blip_captioner import BlipCaptioner

    return BlipCaptioner(_need(s, "blip:PATH"), device=s.option("device", device), dtype=s.option("dtype", dtype),
                         num_beams=s.option("beams", 3, int), num_samples=s.option("samples", 3, int),
                         max_new_tokens=s.option("max_new_tokens", 30, int), seed=s.option("seed", 0, int),
                         batch_size=s.option("batch", 8, int))


def _editor(spec: Spec, device: str, dtype: str | None, parts: Mapping[str, Any], load: bool,
            shared: Mapping[str, str] | None = None) -> Any:
    """The Stable Diffusion editor; ``clip=on`` scores edits with the open_clip embedder's model. ``shared``: the
    generator's settings the editor takes unless its spec sets them (steps, guidance and dtype on the same
    weights; ``generator_passes``, the unit its costs are charged in)."""
    from sleuth.tools.backends.clip import ClipEmbedder
    from sleuth.tools.backends.sd_edit.options import editor_from_options

    def clip(text: str) -> Any:
        embedder = parts.get("embedder")
        if text == "on":
            if not isinstance(embedder, ClipEmbedder):
                raise BackendError("sd-edit clip=on uses the CLIP embedder: give --embedder open_clip:..., "
                                   "clip:... or toyworld-clip, or a CLIP spec (clip=open_clip:MODEL:WEIGHTS).")
            return embedder.model
        model = _clip(parse_spec(text, "embedder"), device, dtype)
        _load(model, load)
        return model

    from sleuth.tools.backends.packaged import EDITOR_DEFAULTS

    model = _need(spec, "sd-edit:PATH_OR_ID")
    shared = dict(shared or {})
    passes = shared.pop("generator_passes", None)
    options = {**EDITOR_DEFAULTS.get(model, {}), **shared, **spec.options}
    editor = editor_from_options(model, options, device=device, dtype=dtype,
                                 class_names=list(parts["classifier"].labels.labels), make_scorer=clip,
                                 generator_passes=float(passes) if passes is not None else None)
    _load(editor, load)
    return editor


class BackendSpecs(BaseModel):
    """Which models an investigation runs on: one spec per slot, and settings shared by the real ones."""

    model_config = ConfigDict(extra="forbid")

    generator: str = Field(default="toyworld",
                           description="toyworld, or diffusers:PATH_OR_ID[,steps=N,guidance=X,...].")
    classifier: str = Field(default="toyworld",
                            description="toyworld[:WEIGHTS], efficientnet-lite0, torchvision:ARCH[:WEIGHTS], "
                                        "timm:NAME[:CKPT], "
                                        "open_clip:MODEL[:WEIGHTS], hf:PATH_OR_ID, callable:module:function.")
    captioner: str = Field(default="toyworld", description="toyworld, or blip:PATH_OR_ID[,beams=N,samples=N,...].")
    embedder: str = Field(default="toyworld",
                          description="toyworld, toyworld-clip, open_clip:MODEL[:WEIGHTS] / open_clip:FOLDER, or "
                                      "clip:PATH_OR_ID (a transformers CLIPModel).")
    editor: str = Field(default="toyworld", description="toyworld, or sd-edit:PATH_OR_ID.")
    world: str | None = Field(default=None,
                              description="toyworld config for the toyworld parts (None: the default world).")
    device: str = Field(default="cpu", description="cpu, cuda, cuda:N, mps or auto; a spec's device= option wins.")
    dtype: str | None = Field(default=None,
                              description="float32 (None), float16 or bfloat16; a spec's dtype= option wins.")
    class_tokens: dict[str, str] = Field(default_factory=dict, description=(
        "Textual-inversion embeddings by class name: the class name is replaced by the learned token in every "
        "prompt the diffusers generator encodes (Dataset Interfaces)."))
    clip_checks: str = Field(default="off", description=(
        "Dataset Interfaces' CLIP checks on generated images: off, on (with the open_clip embedder's model), or an "
        "open_clip spec."))
    clip_class_top_k: int = Field(default=5, ge=1,
                                  description="Class present: the class ranks within this many by CLIP.")
    clip_shift_threshold: float = Field(default=0.2,
                                        description="Shift present: CLIP similarity to the shift text >= this.")

    def parsed(self) -> dict[str, Spec]:
        """Every slot's spec parsed and checked against the shared settings; raises `BackendError`."""
        specs = {slot: parse_spec(getattr(self, slot), slot) for slot in SLOTS}
        if specs["generator"].kind == "toyworld":
            if self.class_tokens:
                raise BackendError("class tokens (textual inversion) need a diffusers generator.")
            if self.clip_checks != "off":
                raise BackendError("CLIP checks are for real generators: toyworld reports what it cannot render.")
        if self.clip_checks not in ("off", "on"):
            parse_spec(self.clip_checks, "embedder")
        elif self.clip_checks == "on" and specs["embedder"].kind not in CLIP_EMBEDDERS:
            raise BackendError("CLIP checks 'on' use the CLIP embedder: give --embedder open_clip:..., clip:... or "
                               "toyworld-clip, or a CLIP spec for the checks.")
        return specs

    def build(self, progress: Progress | None = None, *, load: bool = False) -> Backends:
        """The backends, as the interface views tools hold; toyworld parts come from ``toyworld.load_backends``.

        Real models are checked to be on disk here and otherwise load on first use; ``load=True`` loads them now
        (commands do, so a broken checkpoint is reported before a run starts). ``progress`` gets
        ``("loading models", done, total)`` and is passed on to toyworld, which may train.
        """
        parts = self.build_parts(progress, load=load)
        return Backends(**parts)

    def build_parts(self, progress: Progress | None = None, *, load: bool = False) -> dict[str, Any]:
        """What ``build`` wraps: the real models themselves (toyworld's parts as views) and the class prompt, for
        whoever configures or inspects the models rather than auditing with them."""
        specs = self.parsed()
        real_generator = specs["generator"].kind != "toyworld"
        # The toyworld editor only edits toyworld images, so it alone does not call for the toy world.
        need_toy = any(s.kind == "toyworld" for name, s in specs.items() if not (name == "editor" and real_generator))
        steps = [n for n in ("classifier", "captioner", "embedder", "generator", "editor")
                 if specs[n].kind != "toyworld"] + (["toyworld"] if need_toy else [])
        done = 0

        def tick() -> None:
            nonlocal done
            done += 1
            if progress is not None:
                progress("loading models", done, len(steps))

        if progress is not None:
            progress("loading models", 0, len(steps))
        # Real parts first: a missing checkpoint is reported before any toy world is built.
        parts: dict[str, Any] = {}
        if specs["classifier"].kind != "toyworld":
            parts["classifier"] = make_classifier(self.classifier, device=self.device, dtype=self.dtype)
            tick()
        if specs["captioner"].kind != "toyworld":
            parts["captioner"] = _captioner(specs["captioner"], self.device, self.dtype)
            _load(parts["captioner"], load)
            tick()
        if specs["embedder"].kind != "toyworld":
            from sleuth.tools.backends.clip import ClipEmbedder

            parts["embedder"] = ClipEmbedder(_clip(specs["embedder"], self.device, self.dtype))
            _load(parts["embedder"].model, load)
            tick()
        toy = None
        if need_toy:
            from sleuth.tools.backends.toyworld import load_backends

            # toyworld:WEIGHTS: the toy classifier with weights from a file (what `sleuth mitigate` wrote)
            weights = specs["classifier"].argument if specs["classifier"].kind == "toyworld" else ""
            extra: dict[str, Any] = {"classifier_weights": weights} if weights else {}
            toy = load_backends(self.world, device=self.device, progress=progress, **extra)
            for name in ("classifier", "captioner", "embedder"):
                parts.setdefault(name, getattr(toy, name))
        shared: dict[str, str] = {}
        if real_generator:
            parts["generator"], shared = self._generator(specs["generator"], specs["editor"], parts, load)
            tick()
        if specs["editor"].kind != "toyworld":
            parts["editor"] = _editor(specs["editor"], self.device, self.dtype, parts, load, shared)
            tick()
        elif real_generator:
            parts["editor"] = UnavailableEditor()
        if need_toy:
            tick()
        if toy is not None and not real_generator:
            parts = {"generator": toy.generator, "class_prompt": toy.class_prompt, "editor": toy.editor, **parts}
        return parts

    def _generator(self, spec: Spec, editor: Spec, parts: Mapping[str, Any],
                   load: bool) -> tuple[Any, dict[str, str]]:
        """The diffusers generator, and what an editor next to it takes from it (see ``profiles``)."""
        from sleuth.tools.backends.clip import ClipChecks, ClipEmbedder
        from sleuth.tools.backends.diffusers_generator import DiffusersGenerator

        spec.check_options(COMMON | {"steps", "guidance", "height", "width", "negative", "class_token", "class_name",
                                     "checks", "class_top_k", "shift_threshold", "scheduler"})
        checks_spec = spec.options.get("checks")
        if checks_spec and self.clip_checks != "off":
            raise BackendError("CLIP checks given twice: in the generator spec (checks=) and as a setting.")
        checks_spec = checks_spec or self.clip_checks
        checks = None
        if checks_spec != "off":
            embedder = parts.get("embedder")
            if checks_spec == "on" and isinstance(embedder, ClipEmbedder):
                model = embedder.model  # one CLIP in memory for clustering and checking
            else:
                model = _clip(parse_spec(checks_spec, "embedder"), self.device, self.dtype)
                _load(model, load)
            checks = ClipChecks(model, list(parts["classifier"].labels.labels),
                                class_top_k=spec.option("class_top_k", self.clip_class_top_k, int),
                                shift_threshold=spec.option("shift_threshold", self.clip_shift_threshold, float))
        tokens = dict(self.class_tokens)
        if "class_token" in spec.options:
            tokens[spec.option("class_name", "")] = spec.options["class_token"]
        from sleuth.tools.backends.loading import resolve_pretrained
        from sleuth.tools.backends.packaged import EDITOR_DEFAULTS, GENERATOR_DEFAULTS
        from sleuth.tools.backends.profiles import distilled, editing_profile

        weights = _need(spec, "diffusers:PATH_OR_ID")
        defaults: dict[str, Any] = dict(GENERATOR_DEFAULTS.get(spec.argument, {}))
        few = None if defaults else distilled(weights, resolve_pretrained(weights, what="diffusers pipeline"))
        if few is not None:
            defaults.update(few, distilled=True)
        profile = editing_profile(spec, editor, defaults, EDITOR_DEFAULTS.get(editor.argument, {}))
        if profile is not None:
            defaults.update(steps=profile.steps, guidance=profile.guidance, scheduler=profile.scheduler)
        steps = spec.option("steps", int(defaults.get("steps", 30)), int)
        guidance = spec.option("guidance", float(defaults.get("guidance", 7.5)), float)
        dtype = spec.option("dtype", self.dtype)
        gen = DiffusersGenerator(
            weights, device=spec.option("device", self.device), dtype=dtype, num_inference_steps=steps,
            guidance_scale=guidance, height=spec.option("height", None, int), width=spec.option("width", None, int),
            batch_size=spec.option("batch", int(defaults.get("batch", 4)), int),
            negative_prompt=spec.option("negative"), class_tokens=tokens, checks=checks,
            scheduler=spec.option("scheduler", defaults.get("scheduler")))
        _load(gen, load)
        # UNet passes over one row an image takes: the unit editing is charged in (sd_edit.editor.default_cost).
        rows = int(defaults.get("rows", 2 if guidance > 1 else 1))
        shared = {"generator_passes": str(steps * rows)}
        if profile is not None:
            shared.update(steps=str(steps), guidance=f"{guidance:g}")
            if dtype is not None:
                shared["dtype"] = dtype
        return gen, shared


def _load(model: Any, load: bool) -> None:
    if load:
        model.load()


def make_backends(generator: str = "toyworld", classifier: str = "toyworld", captioner: str = "toyworld",
                  embedder: str = "toyworld", editor: str = "toyworld", *, world: str | None = None,
                  device: str = "cpu", dtype: str | None = None, class_tokens: Mapping[str, str] | None = None,
                  clip_checks: str = "off", progress: Progress | None = None, load: bool = False) -> Backends:
    """The backends named by the specs; toyworld parts come from ``toyworld.load_backends(world)``."""
    return BackendSpecs(generator=generator, classifier=classifier, captioner=captioner, embedder=embedder,
                        editor=editor, world=world, device=device, dtype=dtype, class_tokens=dict(class_tokens or {}),
                        clip_checks=clip_checks).build(progress, load=load)
