"""DDIM inversion and null-text optimisation (Mokady et al., *Null-text Inversion for Editing Real Images*).

1. DDIM inversion at guidance 1 maps the image latent ``z0`` to a noise latent ``zT``, keeping every
   intermediate latent: the *pivot* trajectory. Sampling back at guidance 1 retraces it closely.
2. At the guidance editing needs (7.5), sampling from ``zT`` drifts off the pivot. Null-text optimisation
   fixes it without touching the model or the prompt: for each step, starting from the latent it has reached,
   it optimises that step's unconditional ("null") text embedding with Adam so that one guided DDIM step lands
   on the pivot's next latent, then takes the step. The per-step null embeddings, with ``zT``, reproduce the
   image at full guidance, and prompt-to-prompt edits start from them.

The schedule is the official one (google/prompt-to-prompt's notebook, written there for 50 steps): Adam's learning
rate decays from ``null_lr`` to half of it over the steps (``1e-2 * (1 - i / 100)``), and step ``i`` stops early
once its loss is below a tolerance that grows from ``null_tol`` (``1e-5 + 2e-5 * i`` at 50 steps): later steps,
which change the image less, get fewer iterations. Gradients are taken of a scaled loss: in float16 the mean
squared error's gradients (``2 r / N`` for a residual ``r`` over ``N`` latent values, ~1e-8 near convergence)
flush to zero inside the UNet, and the embedding stops moving.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sleuth.tools.backends.base import Image
from sleuth.tools.backends.sd_edit.ddim import (
    DDIMSchedule,
    encode_image,
    encode_text,
    sample,
    unet_out,
)


class InversionSettings(BaseModel):
    """How an image is inverted; part of the inversion cache key."""

    model_config = ConfigDict(frozen=True)

    steps: int = Field(50, ge=1, le=1000, description="DDIM steps (inversion, and every edit of the inversion).")
    guidance: float = Field(7.5, ge=1.0, description="Classifier-free guidance the edits run at.")
    null_steps: int = Field(10, ge=0, description="Adam iterations per step of null-text optimisation "
                                                    "(0: plain DDIM inversion).")
    null_lr: float = Field(0.01, gt=0, description="Adam learning rate of null-text optimisation at the first step; "
                                                   "it decays to half of it by the last (the official schedule).")
    null_tol: float = Field(1e-5, ge=0, description="Stop the first step's optimisation once its latent MSE is below "
                                                    "this; later steps stop earlier, the last at 101 times it "
                                                    "(official schedule: 1e-5 + 2e-5 a step at 50 steps); 0: never "
                                                    "stop early.")


@dataclass
class Inversion:
    """An image inverted under a prompt: where editing starts from."""

    latent: Any
    """``zT``, shape ``(1, C, h, w)``, float32."""
    nulls: Any
    """Null embeddings: one per step ``(T, 1, L, D)`` after null-text optimisation, else ``(1, L, D)``."""
    z0: Any
    """The image's own latent, the target of reconstruction."""
    prompt: str
    settings: InversionSettings
    size: tuple[int, int]
    """(height, width) in pixels the image was inverted at."""
    seconds: float = 0.0
    reconstruction_mse: float | None = None
    """Latent MSE of the null-text trajectory's end against ``z0`` (known after optimisation)."""
    reconstruction: Any = None
    """The clean latent guided sampling from ``latent`` under ``prompt`` reaches: the null-text run's end, which is
    what a sham edit (caption unchanged) produces, so a sham costs no sampling. None when not optimised."""

    def to(self, device: Any) -> Inversion:
        rec = None if self.reconstruction is None else self.reconstruction.to(device)
        return Inversion(self.latent.to(device), self.nulls.to(device), self.z0.to(device), self.prompt,
                         self.settings, self.size, self.seconds, self.reconstruction_mse, rec)


def ddim_invert(pipe: Any, schedule: DDIMSchedule, z0: Any, cond: Any) -> list[Any]:
    """The pivot trajectory at guidance 1: ``[z0, ..., zT]``, entry ``k`` the latent at step ``T - k``."""
    import torch

    x = z0.float()
    path = [x]
    with torch.no_grad():
        for i in reversed(range(len(schedule))):
            x = schedule.unstep(unet_out(pipe, x, schedule.timesteps[i], cond), i, x)
            path.append(x)
    return path


def null_schedule(i: int, steps: int, settings: InversionSettings) -> tuple[float, float]:
    """Adam's learning rate and the early-stop tolerance at step ``i`` of ``steps`` (the official schedule: at 50
    steps, ``1e-2 * (1 - i / 100)`` and ``1e-5 + i * 2e-5``). The tolerance grows in proportion to ``null_tol``
    (to 101 times it by the last step), so ``null_tol=0`` runs every Adam iteration of every step."""
    frac = i / steps
    return settings.null_lr * (1.0 - frac / 2.0), settings.null_tol * (1.0 + 100.0 * frac)


class StepLoss:
    """Latent MSE of one guided DDIM step from ``x`` against ``target``, as a function of the null embedding."""

    def __init__(self, pipe: Any, schedule: DDIMSchedule, i: int, x: Any, c: Any, target: Any,
                 guidance: float) -> None:
        self.pipe, self.schedule, self.i, self.x, self.c, self.target = pipe, schedule, i, x, c, target
        self.guidance = guidance
        self.numel = target.numel()

    def __call__(self, emb: Any) -> Any:
        import torch

        u = unet_out(self.pipe, self.x, self.schedule.timesteps[self.i], emb)
        step = self.schedule.step(u + self.guidance * (self.c - u), self.i, self.x)
        return torch.nn.functional.mse_loss(step, self.target)


def null_gradient(loss_of: StepLoss, emb: Any) -> tuple[Any, float]:
    """The gradient of the mean-squared-error ``loss_of(emb)`` with respect to ``emb``, and the loss.

    The loss is scaled before differentiating, by a power of two that brings the gradient at the UNet's output to
    about 0.1 whatever the residual, and unscaled after: exact in float32, and in float16 the gradients no longer
    underflow (the tiny test model in float16, at a loss of 1e-5, gives a gradient that is zero in every entry
    unscaled, and within 2% of float32's scaled).
    """
    import torch

    loss = loss_of(emb)
    value = float(loss.detach())
    # d(mean)/d(value) is 2 r / N for residuals r ~ sqrt(loss): this scale makes it ~0.1.
    scale = 2.0 ** min(40, round(math.log2(loss_of.numel / max(math.sqrt(value), 1e-12) / 20.0)))
    for _ in range(3):
        (grad,) = torch.autograd.grad(loss * scale, [emb])
        if bool(torch.isfinite(grad).all()):
            return grad / scale, value
        scale /= 2.0 ** 8  # overflow somewhere in the half-precision backward: try again, smaller
        loss = loss_of(emb)
    return torch.zeros_like(emb), value


def null_text_optimise(pipe: Any, schedule: DDIMSchedule, path: list[Any], cond: Any, null: Any,
                       settings: InversionSettings) -> tuple[Any, Any]:
    """Per-step null embeddings ``(T, 1, L, D)`` that keep guided sampling on ``path``; also the latent
    the optimised run ends at (its reconstruction of ``z0``)."""
    import torch

    n = len(schedule)
    x = path[-1]
    current = null.detach().float()
    out = []
    for i, t in enumerate(schedule.timesteps):
        with torch.no_grad():
            c = unet_out(pipe, x, t, cond)
        # The conditional half is fixed for this step, so only the unconditional UNet call is differentiated.
        loss_of = StepLoss(pipe, schedule, i, x, c, path[n - 1 - i], settings.guidance)
        lr, tol = null_schedule(i, n, settings)
        emb = current.clone().requires_grad_(True)
        opt = torch.optim.Adam([emb], lr=lr)
        for _ in range(settings.null_steps):
            # autograd.grad, not backward(): the model's own parameters get no gradients accumulated.
            emb.grad, loss = null_gradient(loss_of, emb)
            opt.step()
            if loss < tol:  # as the official loop: the step is taken, then the loss before it is checked
                break
        current = emb.detach()
        out.append(current)
        with torch.no_grad():
            u = unet_out(pipe, x, t, current)
            x = schedule.step(u + settings.guidance * (c - u), i, x)
    return torch.stack(out), x


def invert(pipe: Any, image: Image, prompt: str, settings: InversionSettings, hw: tuple[int, int]) -> Inversion:
    """Invert ``image`` (resized to ``hw``) under ``prompt``: DDIM inversion, then null-text optimisation
    when the guidance is above 1 and ``null_steps`` > 0."""
    import torch

    start = time.perf_counter()
    schedule = DDIMSchedule.from_pipeline(pipe, settings.steps)
    z0 = encode_image(pipe, image, hw).float()
    cond, null = encode_text(pipe, [prompt, ""]).float().split(1)
    path = ddim_invert(pipe, schedule, z0, cond)
    nulls, mse, end = null, None, None
    if settings.guidance != 1.0 and settings.null_steps > 0:
        nulls, end = null_text_optimise(pipe, schedule, path, cond, null, settings)
        mse = float(torch.mean((end - z0) ** 2))
    return Inversion(path[-1], nulls, z0, prompt, settings, hw, time.perf_counter() - start, mse, end)


def reconstruct(pipe: Any, inversion: Inversion, guidance: float | None = None) -> Any:
    """The clean latent sampling from the inversion reaches, under its own prompt (for checks and tests)."""
    schedule = DDIMSchedule.from_pipeline(pipe, inversion.settings.steps)
    cond = encode_text(pipe, [inversion.prompt]).float()
    g = inversion.settings.guidance if guidance is None else guidance
    return sample(pipe, schedule, inversion.latent, cond, inversion.nulls, g)

