"""Deterministic DDIM on a Stable Diffusion pipeline, both ways, written out.

Song et al.'s DDIM (eta = 0) moves a latent between noise levels along the model's noise estimate:
``x_to = sqrt(a_to) * x0 + sqrt(1 - a_to) * eps`` with ``x0 = (x - sqrt(1 - a_from) * eps) / sqrt(a_from)``.
Sampling walks the timesteps down; inversion walks them up, estimating the noise at the *target* timestep
from the latent it has (the usual DDIM-inversion approximation). Both directions share one schedule, so
inverting then sampling with the same conditioning returns to the start up to that approximation.

The model may predict the noise (``epsilon``) or the velocity (``v_prediction``); its output is turned
into a noise estimate before any step.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sleuth.tools.backends.base import BackendError, Image

PREDICTIONS = ("epsilon", "v_prediction")


@dataclass
class DDIMSchedule:
    """The timesteps a run visits (descending) and the cumulative alphas along them."""

    timesteps: list[int]
    alphas_cumprod: Any
    """``torch.Tensor`` of the training schedule's cumulative alphas (float64, CPU)."""
    final_alpha: float
    """The alpha a sampling run ends at (below the lowest timestep)."""
    prediction_type: str

    @classmethod
    def from_pipeline(cls, pipe: Any, steps: int) -> DDIMSchedule:
        from diffusers import DDIMScheduler

        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        # Whatever scheduler the pipeline ships (PNDM for SD 1.x), its betas and offsets define the DDIM one.
        sched = DDIMScheduler.from_config(pipe.scheduler.config)
        sched.set_timesteps(steps)
        kind = sched.config.prediction_type
        if kind not in PREDICTIONS:
            raise BackendError(f"the editor supports epsilon- and v-prediction models, not {kind!r}.")
        alphas = sched.alphas_cumprod.double().cpu()
        timesteps = [int(t) for t in sched.timesteps]
        if float(alphas[timesteps[0]]) < 1e-8:
            raise BackendError("the scheduler ends at zero signal (zero terminal SNR): DDIM inversion is undefined "
                               "there; use a scheduler config without rescale_betas_zero_snr.")
        return cls(timesteps, alphas, float(sched.final_alpha_cumprod), kind)

    def __len__(self) -> int:
        return len(self.timesteps)

    def alpha(self, i: int) -> float:
        """Cumulative alpha at step ``i``'s timestep; ``i == len(self)`` is the end of sampling."""
        return self.final_alpha if i >= len(self.timesteps) else float(self.alphas_cumprod[self.timesteps[i]])

    def eps(self, out: Any, x: Any, alpha: float) -> Any:
        """The noise estimate in a model output, for latent ``x`` at cumulative alpha ``alpha``."""
        if self.prediction_type == "epsilon":
            return out
        return alpha ** 0.5 * out + (1.0 - alpha) ** 0.5 * x

    @staticmethod
    def move(x: Any, eps: Any, a_from: float, a_to: float) -> Any:
        x0 = (x - (1.0 - a_from) ** 0.5 * eps) / a_from ** 0.5
        return a_to ** 0.5 * x0 + (1.0 - a_to) ** 0.5 * eps

    def step(self, out: Any, i: int, x: Any) -> Any:
        """Sampling: latent at step ``i`` -> latent at step ``i + 1`` (less noise)."""
        a = self.alpha(i)
        return self.move(x, self.eps(out, x, a), a, self.alpha(i + 1))

    def unstep(self, out: Any, i: int, x: Any) -> Any:
        """Inversion: latent at step ``i + 1`` -> latent at step ``i`` (more noise); ``out`` is the model's
        output for ``x`` told timestep ``timesteps[i]``."""
        a = self.alpha(i)
        return self.move(x, self.eps(out, x, a), self.alpha(i + 1), a)


# -- the pipeline's parts ---------------------------------------------------------------------------------------


UNSUPPORTED = ("the editor runs Stable Diffusion 1.x/2.x pipelines (one CLIP text encoder); {what} conditions its "
               "UNet on more (SDXL: a second text encoder, pooled text embeddings and added time ids), which its "
               "inversion and prompt-to-prompt do not provide. Edit with an SD 1.x/2.x checkpoint instead, e.g. "
               "sd-edit:stable-diffusion-v1-5/stable-diffusion-v1-5 or sd-edit:stabilityai/stable-diffusion-2-1-base "
               "(images are then inverted, not redrawn from their seeds).")


def check_pipeline(pipe: Any) -> None:
    missing = [p for p in ("unet", "vae", "text_encoder", "tokenizer", "scheduler") if getattr(pipe, p, None) is None]
    if missing:
        raise BackendError(f"{type(pipe).__name__} is not a Stable Diffusion 1.x/2.x pipeline "
                           f"(no {', '.join(missing)}); the editor needs one.")
    added = getattr(pipe.unet.config, "addition_embed_type", None)
    if getattr(pipe, "text_encoder_2", None) is not None or added not in (None, "text"):
        raise BackendError(UNSUPPORTED.format(what=type(pipe).__name__))


def check_folder(folder: Path) -> None:
    """The same check from a pipeline folder's ``model_index.json``, before any weights load."""
    index = folder / "model_index.json"
    if not index.is_file():
        return
    try:
        parts = json.loads(index.read_text())
    except (OSError, ValueError):
        return
    if isinstance(parts, dict) and (parts.get("text_encoder_2") or "XL" in str(parts.get("_class_name", ""))):
        raise BackendError(UNSUPPORTED.format(what=f"{parts.get('_class_name', 'this pipeline')} ({folder})"))


def encode_text(pipe: Any, prompts: Sequence[str]) -> Any:
    """Text-encoder hidden states ``(N, L, D)`` for the prompts, padded as the pipeline pads them."""
    import torch

    tok = pipe.tokenizer(list(prompts), padding="max_length", max_length=pipe.tokenizer.model_max_length,
                         truncation=True, return_tensors="pt")
    with torch.no_grad():
        return pipe.text_encoder(tok.input_ids.to(pipe.unet.device))[0].to(pipe.unet.dtype)


def latent_multiple(pipe: Any) -> int:
    """Image sides must be multiples of this: the VAE's factor times the UNet's downsampling."""
    vae_factor = 2 ** (len(pipe.vae.config.block_out_channels) - 1)
    return vae_factor * 2 ** (len(pipe.unet.config.block_out_channels) - 1)


def working_size(image: Image, pipe: Any, size: int | None) -> tuple[int, int]:
    """(height, width) the image is edited at: ``size`` on the long side if given, rounded to the multiple."""
    h, w = image.shape[:2]
    if size is not None:
        scale = size / max(h, w)
        h, w = h * scale, w * scale
    m = latent_multiple(pipe)
    return max(m, int(round(h / m)) * m), max(m, int(round(w / m)) * m)


def resize(image: Image, hw: tuple[int, int]) -> Image:
    if image.shape[:2] == hw:
        return image
    from PIL import Image as PILImage

    return np.asarray(PILImage.fromarray(image).resize((hw[1], hw[0]), PILImage.Resampling.LANCZOS))


def encode_image(pipe: Any, image: Image, hw: tuple[int, int]) -> Any:
    """The VAE latent (mean of the posterior, scaled) of a uint8 image resized to ``hw``."""
    import torch

    a = resize(np.asarray(image, dtype=np.uint8)[..., :3], hw)
    x = torch.from_numpy(a.astype(np.float32) / 127.5 - 1.0).permute(2, 0, 1)[None]
    with torch.no_grad():
        dist = pipe.vae.encode(x.to(pipe.vae.device, pipe.vae.dtype)).latent_dist
        return dist.mean * pipe.vae.config.scaling_factor


def psnr(a: Image, b: Image) -> float:
    """Peak signal-to-noise ratio of two uint8 images, in dB (inf when equal)."""
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * float(np.log10(255.0**2 / mse))


def decode_latents(pipe: Any, latents: Any) -> list[Image]:
    import torch

    with torch.no_grad():
        x = pipe.vae.decode(latents.to(pipe.vae.dtype) / pipe.vae.config.scaling_factor).sample
    x = ((x.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    return list(x)


def unet_out(pipe: Any, x: Any, t: int, emb: Any) -> Any:
    # The first parameter's dtype: ``unet.dtype`` walks every parameter, a cost paid on each of many calls.
    dtype = next(pipe.unet.parameters()).dtype
    return pipe.unet(x.to(dtype), t, encoder_hidden_states=emb.to(dtype)).sample.float()


def guided(pipe: Any, x: Any, t: int, cond: Any, null: Any, guidance: float) -> Any:
    """Classifier-free guidance: ``u + w (c - u)``, one batched UNet call (unconditional half first)."""
    import torch

    if guidance == 1.0:
        return unet_out(pipe, x, t, cond)
    n = x.shape[0]
    out = unet_out(pipe, torch.cat([x, x]), t, torch.cat([null.expand(n, -1, -1), cond]))
    u, c = out[:n], out[n:]
    return u + guidance * (c - u)


def sample(pipe: Any, schedule: DDIMSchedule, latent: Any, cond: Any, nulls: Any, guidance: float, *,
           before_step: Callable[[int], None] | None = None,
           after_step: Callable[[int, Any], Any] | None = None) -> Any:
    """DDIM sampling from ``latent`` (broadcast over the batch of ``cond``) down to a clean latent.

    ``nulls`` is one unconditional embedding ``(1, L, D)`` or one per step ``(T, 1, L, D)`` (null-text
    inversion). ``before_step(i)`` runs before each UNet call (attention control reads the step from it);
    ``after_step(i, x)`` may return a changed latent (local blending).
    """
    import torch

    x = latent.float().expand(cond.shape[0], -1, -1, -1).clone()
    with torch.no_grad():
        for i, t in enumerate(schedule.timesteps):
            if before_step is not None:
                before_step(i)
            null = nulls[i] if nulls.dim() == 4 else nulls
            x = schedule.step(guided(pipe, x, t, cond, null, guidance), i, x)
            if after_step is not None:
                x = after_step(i, x)
    return x
