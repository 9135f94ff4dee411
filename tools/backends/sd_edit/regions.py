"""Where the class is in an inverted image: a mask the edit leaves untouched (``keep=class``).

Prompt-to-prompt's local blend finds the region to change from the changed words' cross-attention maps. That
needs maps that sit on what the words name. A model whose text also reaches the image through a global route (a
pooled text embedding added to the time embedding, as toyworld-sd's) may attend almost uniformly: its maps then
cover the whole image and the blend keeps nothing, so an edit of the background redraws the object too.

This module finds the object instead, as DiffEdit (Couairon et al., 2022) finds an edit region: noise the clean
latent half-way (several noise draws), predict the noise under the source caption and under the source caption
without the class word, and take where the two predictions differ most, averaged over draws and channels, clipped
at ``ratio`` times its mean and thresholded at half of that. The class region is dilated by one latent pixel and
the edit changes only what lies outside it; the source latent is kept inside from the blend's first step on.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sleuth.tools.backends.sd_edit.ddim import encode_text, guided


class RegionSettings(BaseModel):
    """How the class region is estimated; DiffEdit's defaults where it has them."""

    model_config = ConfigDict(frozen=True)

    strength: float = Field(0.5, gt=0, lt=1, description="Noise level the predictions are compared at (fraction "
                                                         "of the training schedule).")
    draws: int = Field(8, ge=1, le=64, description="Noise draws averaged.")
    ratio: float = Field(3.0, gt=0, description="The difference map is clipped at this multiple of its mean, then "
                                                "thresholded at half the clip.")
    dilate: int = Field(1, ge=0, le=8, description="Latent pixels the class region grows by.")
    seed: int = 0


def without_class(caption: str, class_name: str) -> str | None:
    """``caption`` with every whole-word occurrence of ``class_name`` removed; None when it does not occur."""
    pattern = re.compile(rf"(?<![\w-]){re.escape(class_name)}(?![\w-])", re.IGNORECASE)
    if not pattern.search(caption):
        return None
    return re.sub(r"\s{2,}", " ", pattern.sub("", caption)).strip()


def class_region(pipe: Any, z0: Any, caption: str, class_name: str, guidance: float,
                 settings: RegionSettings | None = None) -> Any:
    """``(1, 1, h, w)`` float mask of the class region of clean latent ``z0`` (1 inside, 0 outside); None when the
    caption does not name the class."""
    import torch
    import torch.nn.functional as F

    s = settings or RegionSettings()
    other = without_class(caption, class_name)
    if other is None:
        return None
    z0 = z0.float()
    t = int(round(s.strength * (pipe.scheduler.config.num_train_timesteps - 1)))
    a = float(pipe.scheduler.alphas_cumprod[t])
    gen = torch.Generator().manual_seed(s.seed)
    eps = torch.randn((s.draws, *z0.shape[1:]), generator=gen).to(z0.device)
    xt = a**0.5 * z0 + (1 - a) ** 0.5 * eps
    texts = encode_text(pipe, [caption, other, ""]).float()
    with torch.no_grad():
        with_cls = guided(pipe, xt, t, texts[:1].expand(s.draws, -1, -1), texts[2:], guidance)
        without = guided(pipe, xt, t, texts[1:2].expand(s.draws, -1, -1), texts[2:], guidance)
    diff = (with_cls - without).abs().mean(dim=(0, 1))
    clip = float(diff.mean()) * s.ratio
    if clip <= 0:
        return torch.zeros((1, 1, *diff.shape), device=z0.device)
    mask = ((diff.clamp(0, clip) / clip) > 0.5).float()[None, None]
    if s.dilate:
        mask = F.max_pool2d(mask, 2 * s.dilate + 1, stride=1, padding=s.dilate)
    return mask
