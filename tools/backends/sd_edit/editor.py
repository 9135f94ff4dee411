"""The Stable Diffusion editor: null-text inversion chained with prompt-to-prompt, under LANCE's controls.

``SDEditor.edit(generation, source, target)`` inverts the image under the source caption (or takes the
inversion from the cache), denoises the source and one target row per injection schedule of the sweep in one
batch, scores every candidate with CLIP, keeps the best one and reports the filters it passed.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sleuth.tools.backends.base import BackendError, EditCost, EditOutcome, Generation, Image
from sleuth.tools.backends.loading import (
    choose_device,
    choose_dtype,
    dtype_tag,
    fingerprint,
    load_diffusion_pipeline,
    resolve_pretrained,
)
from sleuth.tools.backends.sd_edit.cache import InversionCache, inversion_key
from sleuth.tools.backends.sd_edit.controls import (
    QualityThresholds,
    Scorer,
    choose,
    class_word_check,
    find_class,
    score_edits,
)
from sleuth.tools.backends.sd_edit.ddim import (
    DDIMSchedule,
    check_folder,
    check_pipeline,
    decode_latents,
    encode_image,
    encode_text,
    psnr,
    resize,
    sample,
    working_size,
)
from sleuth.tools.backends.sd_edit.inversion import Inversion, InversionSettings, invert, reconstruct
from sleuth.tools.backends.sd_edit.p2p import (
    AttentionEdit,
    Injection,
    LocalBlend,
    TokenAlignment,
    align,
    controlled,
    is_content,
    word_tokens,
)
from sleuth.tools.backends.sd_edit.regions import RegionSettings, class_region


class EditSettings(BaseModel):
    """Prompt-to-prompt settings; LANCE's defaults (cross 0.8, self swept over 0.4..0.8, new words x2)."""

    model_config = ConfigDict(frozen=True)

    cross_steps: tuple[float, ...] = Field((0.8,), description="Fractions of steps with cross-attention injected "
                                                               "(swept).")
    self_steps: tuple[float, ...] = Field((0.4, 0.5, 0.6, 0.7, 0.8),
                                          description="Fractions of steps with self-attention injected (swept).")
    mode: Literal["auto", "refine"] = Field("auto", description="auto: same-length word swaps take the replaced "
                                                                "words' maps; refine: every change is new words.")
    edit_word_weight: float = Field(2.0, gt=0, description="Cross-attention weight of the content words the edit puts "
                                                           "in (stop words and pronouns keep 1).")
    reweight: dict[str, float] = Field(default_factory=dict, description="Further target words to re-weight.")
    local_blend: bool = Field(True, description="Keep the source latent outside the changed content words' region.")
    blend_threshold: float = Field(0.3, ge=0, le=1)
    blend_start: float = Field(0.2, ge=0, le=1, description="Fraction of steps before blending starts.")
    keep: Literal["none", "class"] = Field("none", description="class: keep the source latent in the class region "
                                                               "(regions.class_region), so the edit changes only "
                                                               "what is around the object.")
    self_max_tokens: int | None = Field(None, description="Largest self-attention map (query positions) injected; "
                                                          "default: a quarter of the latent's positions.")
    max_rows: int = Field(6, ge=2, description="Rows (source included) denoised per batch; the sweep is chunked.")

    def grid(self) -> list[Injection]:
        return [Injection(c, s) for c in self.cross_steps for s in self.self_steps]

    def middle(self) -> Injection:
        """The schedule used when there is no CLIP model to sweep with."""
        return Injection(sorted(self.cross_steps)[len(self.cross_steps) // 2],
                         sorted(self.self_steps)[len(self.self_steps) // 2])


@dataclass
class EditRun:
    latents: Any
    """``(1 + K, C, h, w)``: row 0 the source (the inversion's reconstruction), then one per injection."""
    alignment: TokenAlignment
    injections: list[Injection]
    blend_mask: Any = None


def edit_latents(pipe: Any, inversion: Inversion, target: str, injections: Sequence[Injection],
                 settings: EditSettings, keep: Any = None) -> EditRun:
    """Prompt-to-prompt from an inversion: the source row and one target row per injection schedule; ``keep``, a
    ``(1, 1, h, w)`` latent mask, is kept from the source after the blend starts."""
    import torch

    schedule = DDIMSchedule.from_pipeline(pipe, inversion.settings.steps)
    source = inversion.prompt
    alignment = align(pipe.tokenizer, source, target, settings.mode)
    equalizer = torch.ones(alignment.mapper.shape[0])
    equalizer[alignment.target_content] = settings.edit_word_weight
    for word, weight in settings.reweight.items():
        equalizer[word_tokens(pipe.tokenizer, target, word)] = weight
    h, w = inversion.latent.shape[-2:]
    self_max = settings.self_max_tokens if settings.self_max_tokens is not None else max(h * w // 4, 1)
    n = len(schedule)
    rows, mask = [], None
    for k in range(0, len(injections), settings.max_rows - 1):
        chunk = list(injections[k:k + settings.max_rows - 1])
        blend = None
        if (settings.local_blend or keep is not None) and alignment.mode != "same":
            words = settings.local_blend
            blend = LocalBlend(alignment.source_content if words else [], alignment.target_content if words else [],
                               threshold=settings.blend_threshold, start=int(settings.blend_start * n), keep=keep)
        control = AttentionEdit(alignment, chunk, n, equalizer=equalizer, self_max_tokens=self_max, blend=blend,
                                guided=inversion.settings.guidance != 1.0)
        cond = encode_text(pipe, [source] + [target] * len(chunk)).float()
        with controlled(pipe.unet, control):
            x = sample(pipe, schedule, inversion.latent, cond, inversion.nulls, inversion.settings.guidance,
                       before_step=control.begin_step, after_step=control.end_step)
        rows.append(x if k == 0 else x[1:])
        mask = blend.last_mask if blend is not None and mask is None else mask
    return EditRun(torch.cat(rows), alignment, list(injections), mask)


def sham_latents(pipe: Any, inversion: Inversion, injection: Injection) -> EditRun:
    """The edit of an inversion to its own caption: the source row and one target row, both the reconstruction
    (the null-text run's end when known, else sampled)."""
    import torch

    rec = inversion.reconstruction
    if rec is None:
        rec = reconstruct(pipe, inversion)
    alignment = align(pipe.tokenizer, inversion.prompt, inversion.prompt, "auto")
    return EditRun(torch.cat([rec, rec]), alignment, [injection])


SEED_PSNR = 35.0
"""dB. An image drawn from a seed's noise by the same weights, steps and guidance is edited from that noise, with
no inversion, when the editor's own sampling from it reproduces the image at least this closely (it does to
rounding on the machine that drew it; null-text inversion reaches about 31 dB); else it is inverted."""


def seeded_start(pipe: Any, generation: Generation, prompt: str, settings: InversionSettings, hw: tuple[int, int],
                 model_id: str) -> Inversion | None:
    """Where sampling started for an image the generator drew from its seed's noise (``meta["drawn"]``) under
    ``prompt`` with these weights (``model_id``), steps, guidance and size: the seed's noise, with the plain
    unconditional embedding as every step's null. ``None`` when the image was drawn any other way."""
    from sleuth.tools.backends.diffusers_generator import NOISE, initial_latents

    drawn = generation.meta.get("drawn")
    if not isinstance(drawn, dict) or generation.prompt != prompt:
        return None
    same = (drawn.get("model") == model_id and drawn.get("noise") == NOISE and drawn.get("steps") == settings.steps
            and drawn.get("guidance") == settings.guidance and drawn.get("scheduler") == "DDIMScheduler"
            and list(drawn.get("size") or ()) == list(hw))
    if not same:
        return None
    start = time.perf_counter()
    latent = initial_latents(pipe, [generation.seed], hw[0], hw[1])
    if latent is None:
        return None
    latent = latent.float()  # DDIM's initial sigma is 1
    null = encode_text(pipe, [""]).float()
    z0 = encode_image(pipe, np.asarray(generation.image), hw).float()
    return Inversion(latent, null, z0, prompt, settings, hw, time.perf_counter() - start)


SEEDED_KEPT = 64
"""Seeded starts an editor keeps in memory (each a latent and an embedding, a few hundred kB for SD 1.5)."""

MAX_PAIRS = 20
"""Counterfactual pairs per measurement by default: each is an inversion (about a minute for SD 1.5 on an A100)."""


def default_cost(inversion: InversionSettings, editing: EditSettings, sweep: bool,
                 generator_passes: float | None = None) -> EditCost:
    """Cost in images, counted in UNet passes over one row (the text encoder and the VAE are left out).

    In the editor's own images (``steps`` guided passes of 2 rows, 1 at guidance 1): an inversion is ``steps`` DDIM
    passes plus, per step, null-text optimisation's conditional pass, up to ``null_steps`` forward and backward
    passes (about 3 rows each) and the step itself; an edit ``steps`` guided passes over the source row and the
    candidates (with ``keep=class``, also two guided passes over each of the class region's noise draws).
    ``generator_passes``: the UNet passes one image of the investigation's generator takes; the cost is then in
    the generator's images, so an image budget buys editing at what it costs next to generating (a one-step
    generator's image is a fiftieth of a 50-step one's, an inversion is not)."""
    halves = 1 if inversion.guidance == 1.0 else 2
    null = inversion.null_steps if halves == 2 else 0
    per_step = 1 + (2 + 3 * null if null else 0)
    rows = 1 + (len(editing.grid()) if sweep else 1)
    # keep=class: two guided passes over each noise draw, once per edit.
    region = 2 * RegionSettings().draws / inversion.steps if editing.keep == "class" else 0.0
    own = float(inversion.steps * halves)
    scale = 1.0 if generator_passes is None else own / generator_passes
    basis = (f"in images of the editor's pipeline at its steps and guidance ({own:g} UNet passes each)"
             if generator_passes is None else
             f"in images of the generator ({generator_passes:g} UNet passes each; the editor's image is {own:g})")
    return EditCost(inversion=per_step / halves * scale, edit=(float(rows) + region) * scale, max_pairs=MAX_PAIRS,
                    basis=basis)


class SDEditor:
    """Counterfactual edits of real images with a Stable Diffusion 1.x/2.x pipeline (an ``Editor``).

    ``scorer`` is a CLIP model (``encode_images``/``encode_texts``); without one there is no sweep (the middle
    schedule is used) and only the class-word filter, by exact word overlap, is reported. ``class_names`` let
    the editor find the class a caption names, for that filter. ``size``: long side in pixels edits run at
    (default: the image's own, rounded to what the model accepts). ``cost``: what its work costs the image budget
    (default: from the settings, see :func:`default_cost`; at most ``MAX_PAIRS`` counterfactual pairs).
    """

    def __init__(self, model: str | None = None, *, pipeline: Any = None, device: str = "cpu",
                 dtype: str | None = None, inversion: InversionSettings | None = None,
                 editing: EditSettings | None = None, thresholds: QualityThresholds | None = None,
                 scorer: Scorer | None = None, class_names: Sequence[str] = (), size: int | None = None,
                 cache: InversionCache | None = None, cost: EditCost | None = None,
                 start: Literal["seed", "invert"] = "seed") -> None:
        if (model is None) == (pipeline is None):
            raise ValueError("give exactly one of model (path or Hub id) and pipeline")
        if start not in ("seed", "invert"):
            raise BackendError(f"sd-edit: start must be seed or invert, not {start!r}.")
        self.start = start
        """seed: an image the same weights drew from its seed's noise is edited from that noise (no inversion);
        invert: every image is inverted."""
        self._seeded: dict[Any, Inversion | None] = {}
        self.model = model
        self.device = choose_device(device)
        self.dtype = choose_dtype(dtype, self.device)
        self._folder = resolve_pretrained(model, what="Stable Diffusion pipeline") if model is not None else None
        if self._folder is not None:
            check_folder(self._folder)  # an SDXL folder fails here, not at its first edit hours later
        self.inversion_settings = inversion or InversionSettings()
        self.settings = editing or EditSettings()
        self.thresholds = thresholds or QualityThresholds()
        self.region_settings = RegionSettings()
        self.scorer = scorer
        self.class_names = list(class_names)
        self.size = size
        self.cache = cache or InversionCache()
        self.inversions_run = 0
        self._pipe = pipeline
        source = f"{model}@{fingerprint(self._folder)}" if self._folder is not None else type(pipeline).__name__
        self.model_id = f"{source}{dtype_tag(self.dtype)}"
        """The model part of the id: inversions are keyed by it (and their own settings), not by edit settings."""
        s = self.inversion_settings
        clip = None if scorer is None else getattr(scorer, "id", type(scorer).__name__)
        # Editors that keep nothing have the ids they had before the option existed.
        edit = self.settings.model_dump(exclude={"keep"} if self.settings.keep == "none" else None)
        parts: dict[str, Any] = {"edit": edit, "thresholds": self.thresholds.model_dump(), "size": size,
                                 "clip": clip}
        if self.settings.keep != "none":
            parts["region"] = self.region_settings.model_dump()
        if start == "seed":
            parts["start"] = "seed"
        rest = json.dumps(parts, sort_keys=True)
        # "p2p": edits made before prompt-to-prompt's alignment, store and words matched the reference differ, so
        # outcomes kept by the old id are not reused.
        rest = json.dumps({"inversion": s.model_dump(), "null_schedule": "official", "p2p": "reference", "rest": rest},
                          sort_keys=True)
        self.id = (f"sd-edit:{self.model_id}:steps={s.steps}:cfg={s.guidance:g}:null={s.null_steps}x{s.null_lr:g}:"
                   f"{hashlib.sha256(rest.encode()).hexdigest()[:8]}")
        self.cost = cost or default_cost(self.inversion_settings, self.settings, scorer is not None)
        """What an inversion and an edit cost the image budget, and the cap on counterfactual pairs."""
        self.cache_outcomes = True
        self.is_content = is_content  # the words prompt-to-prompt re-weights and blends
        """Edits are costly and, on a GPU, not bit-reproducible: investigations keep them (tools/counterfactual.py)."""
        if pipeline is not None:
            self._prepare(pipeline)

    def load(self) -> None:
        """Load the pipeline now (it otherwise loads on the first edit)."""
        if self._pipe is not None:
            return
        assert self._folder is not None  # built without a pipeline object, so from a folder
        pipe = load_diffusion_pipeline(self._folder, self.dtype, f"Stable Diffusion pipeline {self.model!r}")
        self._prepare(pipe)
        self._pipe = pipe

    @property
    def pipe(self) -> Any:
        self.load()
        return self._pipe

    def _prepare(self, pipe: Any) -> None:
        check_pipeline(pipe)
        pipe.to(self.device)
        # Inference only: null-text optimisation differentiates w.r.t. the embedding alone.
        for part in (pipe.unet, pipe.vae, pipe.text_encoder):
            part.requires_grad_(False)

    # -- inversion -----------------------------------------------------------------------------------------------

    def invert(self, image: Image, prompt: str, size: tuple[int, int] | None = None) -> tuple[Inversion, bool]:
        """The inversion of ``image`` under ``prompt`` and whether it came from the cache."""
        pipe = self.pipe
        hw = size or working_size(image, pipe, self.size)
        key = inversion_key(image, prompt, self.inversion_settings, self.model_id, hw)

        def compute() -> Inversion:
            self.inversions_run += 1
            return invert(pipe, image, prompt, self.inversion_settings, hw)

        inv, cached = self.cache.get_or_compute(key, compute)
        return inv.to(pipe.unet.device), cached

    # -- editing -------------------------------------------------------------------------------------------------

    def seeded(self, generation: Generation, prompt: str, hw: tuple[int, int]) -> tuple[Any, Inversion | None]:
        """The start of an image this editor's weights drew from its seed (see :func:`seeded_start`) and its key;
        kept for the image's next edit (a counterfactual edits each image twice: to the target and to itself)."""
        digest = hashlib.sha256(np.ascontiguousarray(generation.image).tobytes()).hexdigest()
        key = (generation.seed, prompt, hw, digest)
        if self.start != "seed":
            return key, None
        if key not in self._seeded:
            self._seeded[key] = seeded_start(self.pipe, generation, prompt, self.inversion_settings, hw,
                                             self.model_id)
            while len(self._seeded) > SEEDED_KEPT:
                self._seeded.pop(next(iter(self._seeded)))
        return key, self._seeded[key]

    def edit(self, generation: Generation, source_caption: str, target_caption: str) -> EditOutcome:
        image = np.asarray(generation.image)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] < 3:
            raise BackendError(f"{self.id}: expected a uint8 RGB image, got {image.dtype} {image.shape}.")
        image = np.ascontiguousarray(image[..., :3])
        key, start = self.seeded(generation, source_caption, working_size(image, self.pipe, self.size))
        redrawn: float | None = None
        if start is not None:
            out = self._edit_from(start, image, source_caption, target_caption, seeded=True)
            redrawn = out.meta["start_psnr"]
            if redrawn >= SEED_PSNR:
                return out
            self._seeded[key] = None  # this image did not come from that start: invert it, now and next time
        inv, cached = self.invert(image, source_caption)
        out = self._edit_from(inv, image, source_caption, target_caption, cached=cached)
        if redrawn is not None:
            out.meta["seeded_psnr"] = redrawn
        return out

    def _edit_from(self, inv: Inversion, image: Image, source_caption: str, target_caption: str, *,
                   seeded: bool = False, cached: bool = False) -> EditOutcome:
        start = time.perf_counter()
        injections = self.settings.grid() if self.scorer is not None else [self.settings.middle()]
        class_name = find_class(source_caption, self.class_names)
        keep = None
        if source_caption.split() == target_caption.split():
            # A sham edit: every attention map is injected from the source row, under the same prompt, so the
            # target row is the source row, the reconstruction; null-text optimisation already sampled it.
            run = sham_latents(self.pipe, inv, injections[0])
        else:
            if self.settings.keep == "class" and class_name is not None:
                keep = class_region(self.pipe, inv.z0, source_caption, class_name, inv.settings.guidance,
                                    self.region_settings)
            run = edit_latents(self.pipe, inv, target_caption, injections, self.settings, keep=keep)
        if seeded and inv.reconstruction is None:
            inv.reconstruction = run.latents[:1].clone()  # the source row: a sham of this start needs no sampling
        decoded = [resize(im, image.shape[:2]) for im in decode_latents(self.pipe, run.latents)]
        a = run.alignment
        scores: dict[str, float] = {}
        passed: dict[str, bool] = {}
        sweep: list[dict[str, Any]] = []
        pick = 0
        if self.scorer is not None:
            # Against the reconstruction (row 0), as LANCE scores: the inversion's error is not the edit's.
            cands = score_edits(self.scorer, decoded[0], decoded[1:], source_caption, target_caption, a.removed,
                                a.added)
            pick = choose(cands, self.thresholds)
            scores = {f"clip_{k}": v for k, v in cands[pick].model_dump().items() if v is not None}
            passed = cands[pick].passed(self.thresholds)
            sweep = [{"cross": i.cross, "self": i.self_, **c.model_dump()} for i, c in zip(injections, cands)]
        ok, sim = class_word_check(a.removed, class_name, self.thresholds, self.scorer)
        if ok is not None:
            passed["class_word"] = ok
        if sim is not None:
            scores["class_word_similarity"] = sim
        chosen = run.injections[pick]
        meta = {"editor": self.id, "mode": a.mode, "removed": a.removed, "added": a.added, "class": class_name,
                "cross_steps": chosen.cross, "self_steps": chosen.self_, "sweep": sweep,
                "start": "seed" if seeded else "inversion", "inversion_cached": cached,
                "inversion_seconds": round(inv.seconds, 3),
                "edit_seconds": round(time.perf_counter() - start, 3),
                "reconstruction_mse": float(((run.latents[0] - inv.z0) ** 2).mean()),
                "kept_region": None if keep is None else round(float(keep.mean()), 4),
                "size": list(inv.size), "thresholds": self.thresholds.model_dump()}
        if seeded:
            # The source row is the generator's sampling again: how closely it redraws the image says whether the
            # image really came from this start.
            meta["start_psnr"] = round(psnr(decoded[0], image), 2)
        return EditOutcome(image=decoded[1 + pick], source_caption=source_caption, target_caption=target_caption,
                           scores=scores, passed=passed, meta=meta)
