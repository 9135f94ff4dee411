"""Text-to-image generation with any diffusers pipeline (Stable Diffusion 1.x/2.x, SDXL, SD-Turbo, ...).

Reproducibility: every image's initial latents are drawn on the CPU from its own NumPy generator seeded with its
whole seed, so (prompt, seed) gives the same initial noise, hence the same image, whatever the batch size or
device. Not from a ``torch.Generator``: torch's CPU generator keeps only the seed's low 32 bits, so seed s and
s + 2**40 (a discovery seed and its confirmation twin) would draw the same image. Stochastic schedulers (Euler
ancestral, LCM, DDPM, ...) also draw noise at every step: each image gets its own CPU ``torch.Generator`` for that,
seeded with a 32-bit digest of its whole seed, so those images too depend on (prompt, seed) alone.
Images a safety checker blacks out come back with ``valid=False``: unusable, not classifier failures.
Each image drawn from such noise says how in ``meta["drawn"]`` (weights, noise, steps, guidance, scheduler, size),
so an editor on the same weights can start from its seed's noise instead of inverting it.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sleuth.tools.backends.base import BackendError, Generation
from sleuth.tools.backends.clip import ClipChecks
from sleuth.tools.backends.loading import (
    batches,
    choose_device,
    choose_dtype,
    dtype_tag,
    fingerprint,
    load_diffusion_pipeline,
    quiet_loading,
    resolve_pretrained,
)


class DiffusersGenerator:
    """A diffusers text-to-image pipeline loaded on first use (or by `load`) from a local folder or the HF cache.

    ``class_tokens`` maps class names to textual-inversion embedding files (Dataset Interfaces learns one per
    ImageNet class so generated images match the dataset's look): each name is replaced by its learned token in
    every prompt before encoding; a file under the name ``""`` only adds its token to the vocabulary.
    ``checks`` (optional) are Dataset Interfaces' CLIP checks: an image CLIP cannot see the class in is
    marked invalid, and a shift CLIP cannot see is reported in ``unrendered``.
    """

    def __init__(self, model: str | None = None, *, pipeline: Any = None, device: str = "cpu",
                 dtype: str | None = None, num_inference_steps: int = 30, guidance_scale: float = 7.5,
                 height: int | None = None, width: int | None = None, batch_size: int = 4,
                 negative_prompt: str | None = None, class_tokens: Mapping[str, str] | None = None,
                 checks: ClipChecks | None = None, class_prompt: str = "a realistic photograph of a {label}",
                 scheduler: str | None = None) -> None:
        if (model is None) == (pipeline is None):
            raise ValueError("give exactly one of model (path or Hub id) and pipeline")
        if num_inference_steps < 1 or batch_size < 1:
            raise BackendError(f"diffusers: steps and batch must be at least 1 (got {num_inference_steps}, "
                               f"{batch_size}).")
        self.model = model
        self.device = choose_device(device)
        self.dtype = choose_dtype(dtype, self.device)
        self._folder = resolve_pretrained(model, what="diffusers pipeline") if model is not None else None
        self.class_tokens = {name.strip(): Path(f).expanduser() for name, f in (class_tokens or {}).items()}
        for f in self.class_tokens.values():
            if not f.is_file():
                raise BackendError(f"class token file not found: {f}")
        self.num_inference_steps = num_inference_steps
        self.guidance_scale = guidance_scale
        self.height = height
        self.width = width
        self.batch_size = batch_size
        self.negative_prompt = negative_prompt
        self.checks = checks
        self.class_prompt = class_prompt
        if scheduler is not None and scheduler not in SCHEDULERS:
            raise BackendError(f"diffusers: unknown scheduler {scheduler!r}; known: {', '.join(SCHEDULERS)}.")
        self.scheduler = scheduler
        """A scheduler replacing the pipeline's own (``SCHEDULERS``), built from its config; None: the pipeline's."""
        self._shipped = (type(pipeline.scheduler).__name__ if pipeline is not None
                         else shipped_scheduler(self._folder))
        self._pipe = pipeline
        self._tokens: dict[str, str] = {}
        source = (f"{model}@{fingerprint(self._folder)}" if self._folder is not None else type(pipeline).__name__)
        self.id = self._make_id(source)
        self.model_key = source + dtype_tag(self.dtype)
        """The weights images are drawn with, named as an editor on the same folder names them
        (``SDEditor.model_id``)."""
        if pipeline is not None:
            with quiet_loading():
                self._prepare(pipeline)

    def _make_id(self, source: str) -> str:
        """Everything that changes the images: the cache keys predictions by this id."""
        parts = [f"diffusers:{source}", f"steps={self.num_inference_steps}", f"cfg={self.guidance_scale:g}",
                 f"noise={NOISE}"]
        if self.height is not None or self.width is not None:
            parts.append(f"size={self.height or 'auto'}x{self.width or 'auto'}")
        if self.scheduler is not None and SCHEDULERS[self.scheduler] != self._shipped:
            parts.append(f"scheduler={self.scheduler}")  # the shipped one keeps the id it always had
        if self.negative_prompt:
            parts.append(f"negative={self.negative_prompt!r}")
        parts += [f"token={name or '-'}={f.name}@{fingerprint(f)}" for name, f in sorted(self.class_tokens.items())]
        if self.checks is not None:
            parts.append(f"checks={self.checks.id}")
        return ":".join(parts) + dtype_tag(self.dtype)

    # -- loading ---------------------------------------------------------------------------------------------

    def load(self) -> None:
        """Load the pipeline now (it otherwise loads on the first `generate`)."""
        if self._pipe is not None:
            return
        assert self._folder is not None  # built without a pipeline object, so from a folder
        pipe = load_diffusion_pipeline(self._folder, self.dtype, f"diffusers pipeline {self.model!r}")
        with quiet_loading():
            self._prepare(pipe)
        self._pipe = pipe

    @property
    def pipe(self) -> Any:
        self.load()
        return self._pipe

    def _prepare(self, pipe: Any) -> None:
        if not _text_to_image(pipe):
            raise BackendError(f"diffusers pipeline {self.model!r} ({type(pipe).__name__}) is not a text-to-image "
                               f"pipeline.")
        if self.scheduler is not None and SCHEDULERS[self.scheduler] != type(pipe.scheduler).__name__:
            import diffusers

            pipe.scheduler = getattr(diffusers, SCHEDULERS[self.scheduler]).from_config(pipe.scheduler.config)
        pipe.to(self.device)
        pipe.set_progress_bar_config(disable=True)
        for name, path in self.class_tokens.items():
            self._tokens[name] = load_class_token(pipe, path)[0]

    # -- generation ------------------------------------------------------------------------------------------

    def prompt_with_token(self, prompt: str) -> str:
        """The prompt as encoded: each class name that has a learned token replaced by it (longest names first)."""
        for name in sorted((n for n in self._tokens if n), key=len, reverse=True):
            prompt = re.sub(rf"(?<![\w-]){re.escape(name)}(?![\w-])", self._tokens[name], prompt,
                            flags=re.IGNORECASE)
        return prompt

    def generate(self, prompts: Sequence[str], seeds: Sequence[int]) -> list[Generation]:
        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        out: list[Generation] = []
        for sl in batches(len(prompts), self.batch_size):
            out.extend(self._generate_batch(list(prompts[sl]), [int(s) for s in seeds[sl]]))
        if self.checks is not None and out:
            self._apply_checks(out)
        return out

    def _generate_batch(self, prompts: list[str], seeds: list[int]) -> list[Generation]:
        import torch

        pipe = self.pipe
        kwargs: dict[str, Any] = {
            "prompt": [self.prompt_with_token(p) for p in prompts],
            "num_inference_steps": self.num_inference_steps,
            "guidance_scale": self.guidance_scale,
            "output_type": "np",
        }
        latents = initial_latents(pipe, seeds, self.height, self.width)
        drawn: dict[str, Any] | None = None
        # One generator per image, for every noise the pipeline draws besides the initial latents (a stochastic
        # scheduler's at each step): an image's noise is its seed's, whatever else is in the batch.
        kwargs["generator"] = [torch.Generator("cpu").manual_seed(seed32(s)) for s in seeds]
        if latents is not None:
            kwargs["latents"] = latents
            if self.negative_prompt is None:
                factor = int(pipe.vae_scale_factor)
                drawn = {"model": self.model_key, "noise": NOISE, "steps": self.num_inference_steps,
                         "guidance": self.guidance_scale, "scheduler": type(pipe.scheduler).__name__,
                         "size": [int(latents.shape[-2]) * factor, int(latents.shape[-1]) * factor]}
        # A pipeline that takes no latents of this shape draws them too from those generators, on 32-bit digests of
        # the whole seeds (two seeds share noise only by a digest collision).
        if self.height is not None:
            kwargs["height"] = self.height
        if self.width is not None:
            kwargs["width"] = self.width
        if self.negative_prompt is not None:
            kwargs["negative_prompt"] = [self.negative_prompt] * len(prompts)
        with torch.no_grad():
            result = pipe(**kwargs)
        images = to_uint8(result.images)
        flagged = getattr(result, "nsfw_content_detected", None) or [False] * len(prompts)
        return [Generation(image=im, prompt=p, seed=s, valid=not bool(bad),
                           meta={"nsfw": True} if bad else ({"drawn": dict(drawn)} if drawn is not None
                                                           and self.prompt_with_token(p) == p else {}))
                for im, p, s, bad in zip(images, prompts, seeds, flagged)]

    def _apply_checks(self, gens: list[Generation]) -> None:
        assert self.checks is not None
        usable = [g for g in gens if g.valid]
        if not usable:
            return
        results = self.checks.check([g.image for g in usable], [g.prompt for g in usable], self.class_prompt)
        for g, c in zip(usable, results):
            g.meta["clip"] = {"class": c.class_name, "class_rank": c.class_rank, "class_present": c.class_present,
                              "shift": c.shift_text, "shift_present": c.shift_present, **c.scores}
            if not c.class_present:
                # The object is not in the image: the classifier cannot be blamed for missing it.
                g.valid = False
            if c.shift_text and not c.shift_present:
                g.unrendered = (*g.unrendered, c.shift_text)


def _text_to_image(pipe: Any) -> bool:
    """Takes a prompt and needs no input image (image-to-image and inpainting pipelines do)."""
    try:
        params = inspect.signature(pipe.__call__).parameters
    except (TypeError, ValueError):
        return True
    image = params.get("image")
    return "prompt" in params and (image is None or image.default is not inspect.Parameter.empty)


def to_uint8(images: Any) -> list[np.ndarray]:
    """Pipeline output (float in [0, 1], or PIL) as uint8 (H, W, 3) arrays."""
    out = []
    for im in images:
        a = np.asarray(im)
        if a.dtype != np.uint8:
            a = (np.clip(a, 0.0, 1.0) * 255.0).round().astype(np.uint8)
        out.append(a[..., :3])
    return out


def load_class_token(pipe: Any, path: Path) -> list[str]:
    """Load a textual-inversion embedding into the pipeline; the tokens it adds, in order.

    Accepts the formats diffusers reads (``{token: tensor}``, A1111 ``string_to_param``, safetensors) and the
    one Dataset Interfaces writes (``{"placeholder": (token, tensor)}``).
    """
    import torch

    if not hasattr(pipe, "load_textual_inversion"):
        raise BackendError(f"{type(pipe).__name__} cannot load textual-inversion class tokens.")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state: Any = load_file(str(path))
    else:
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
        except (RuntimeError, OSError, EOFError, ValueError) as e:
            raise BackendError(f"class token {path}: cannot read it: {str(e).splitlines()[0]}") from None
    if isinstance(state, dict) and "placeholder" in state and isinstance(state["placeholder"], (tuple, list)):
        token, emb = state["placeholder"]
        state = {str(token): emb}
    if isinstance(state, dict) and "string_to_param" in state:
        tokens = [f"<{path.stem}>"]
        _load_embedding(pipe, state, tokens[0], path)
        return tokens
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise BackendError(f"class token {path}: not a textual-inversion embedding.")
    tokens = [str(k) for k in state]
    for token in tokens:
        emb = state[token].reshape(-1, state[token].shape[-1])
        # One row is one token; several rows are a multi-vector token (diffusers adds token_1, token_2, ...).
        _load_embedding(pipe, {token: emb[0] if len(emb) == 1 else emb}, token, path)
    return tokens


def _load_embedding(pipe: Any, state: dict[str, Any], token: str, path: Path) -> None:
    try:
        pipe.load_textual_inversion(state, token=token)
    except ValueError as e:
        # Already in the vocabulary, or an embedding of another text encoder's width.
        raise BackendError(f"class token {path}: {str(e).splitlines()[0]}") from None


SCHEDULERS = {"ddim": "DDIMScheduler", "euler": "EulerDiscreteScheduler", "euler_a": "EulerAncestralDiscreteScheduler",
              "dpm": "DPMSolverMultistepScheduler", "unipc": "UniPCMultistepScheduler", "pndm": "PNDMScheduler",
              "lcm": "LCMScheduler", "ddpm": "DDPMScheduler"}
"""The ``scheduler=`` option's names: diffusers scheduler classes, built from the pipeline's scheduler config."""


def shipped_scheduler(folder: Path | None) -> str | None:
    """The scheduler class a pipeline folder ships (``scheduler/scheduler_config.json``), if it says."""
    import json

    if folder is None:
        return None
    try:
        name = json.loads((folder / "scheduler" / "scheduler_config.json").read_text()).get("_class_name")
    except (OSError, ValueError, AttributeError):
        return None
    return str(name) if name else None


NOISE = "np64"
"""How initial latents are drawn from seeds (part of the generator's id): NumPy's default generator on the whole
seed. Images made before, from torch generators on the seed's low 32 bits, are not reused from caches."""


def seed32(seed: int) -> int:
    """A 32-bit digest of a non-negative seed of any size (NumPy's SeedSequence mixes every bit)."""
    return int(np.random.SeedSequence(seed).generate_state(1, np.uint32)[0])


def initial_latents(pipe: Any, seeds: Sequence[int], height: int | None, width: int | None) -> Any:
    """Standard-normal initial latents ``(len(seeds), C, H/f, W/f)`` for a UNet latent-diffusion pipeline, each
    image's from ``numpy.random.default_rng(seed)`` on the CPU, in the UNet's dtype on the pipeline's device; the
    pipeline scales them by its scheduler's initial sigma. ``None`` for a pipeline without a UNet, a VAE scale
    factor or a ``latents`` argument."""
    import torch

    unet = getattr(pipe, "unet", None)
    factor = getattr(pipe, "vae_scale_factor", None)
    if unet is None or not factor or "latents" not in inspect.signature(pipe.__call__).parameters:
        return None
    size = unet.config.sample_size
    default_h, default_w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    h = height // factor if height else default_h
    w = width // factor if width else default_w
    shape = (int(unet.config.in_channels), h, w)
    noise = np.stack([np.random.default_rng(int(s)).standard_normal(shape, dtype=np.float32) for s in seeds])
    return torch.from_numpy(noise).to(device=pipe.device, dtype=unet.dtype)
