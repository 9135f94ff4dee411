"""An independent prompt-to-prompt on a diffusers pipeline, written the way google/prompt-to-prompt computes it, to
check sleuth's editor against.

What it reproduces of the reference (``ptp_utils.py``, ``seq_aligner.py`` and the null-text notebook):

- token alignment by global alignment of the two token sequences (gap 0, match 1, mismatch -1; ties go to an
  insertion, then a deletion, then the diagonal), target positions past the target's end of text taking the
  source's same position;
- an attention store that keeps the conditional half's maps *as the controller leaves them* (the store holds the
  tensor the controller then edits in place), summed over steps;
- refinement (a target token takes its aligned source token's map, new tokens keep theirs), re-weighting of named
  tokens, both only during the cross-attention steps (``int(cross * (steps + 1))``), self-attention from the
  source during ``int(self * steps)`` steps for maps up to a size;
- local blending after each scheduler step from ``int(start * steps)`` on: the named tokens' maps at one
  resolution, summed over words, averaged over heads and layers, 3 x 3 max-pooled, resized to the latent, divided
  by their maximum, thresholded, the source row's mask joined to each target's.

Written from the reference's behaviour, not copied.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F


def reference_alignment(tokenizer: Any, source: str, target: str, n: int = 77) -> tuple[torch.Tensor, torch.Tensor]:
    """``(index, alpha)``: target position ``j`` takes source position ``index[j]``'s map where ``alpha[j]`` is 1."""
    x = tokenizer(source).input_ids
    y = tokenizer(target).input_ids
    score = [[0] * (len(y) + 1) for _ in range(len(x) + 1)]
    move = [[0] * (len(y) + 1) for _ in range(len(x) + 1)]  # 1 insertion (left), 2 deletion (up), 3 diagonal
    for j in range(1, len(y) + 1):
        move[0][j] = 1
    for i in range(1, len(x) + 1):
        move[i][0] = 2
        for j in range(1, len(y) + 1):
            left, up = score[i][j - 1], score[i - 1][j]
            diag = score[i - 1][j - 1] + (1 if x[i - 1] == y[j - 1] else -1)
            best = max(left, up, diag)
            score[i][j] = best
            move[i][j] = 1 if best == left else (2 if best == up else 3)
    pairs: list[tuple[int, int]] = []
    i, j = len(x), len(y)
    while i > 0 or j > 0:
        m = move[i][j]
        if m == 3:
            i, j = i - 1, j - 1
            pairs.append((j, i))
        elif m == 1:
            j -= 1
            pairs.append((j, -1))
        else:
            i -= 1
    pairs.reverse()
    index = torch.arange(n)
    alpha = torch.ones(n)
    for t, s in pairs:
        index[t] = max(s, 0)
        alpha[t] = float(s >= 0)
    return index, alpha


class ReferenceEdit:
    """Refinement + re-weighting + local blending of a batch ``[source, target]``."""

    def __init__(self, index: torch.Tensor, alpha: torch.Tensor, steps: int, cross: float, self_: float, *,
                 equalizer: torch.Tensor | None = None, blend_source: Sequence[int] = (),
                 blend_target: Sequence[int] = (), blend_q: int | None = None, start: float = 0.2,
                 threshold: float = 0.3, self_max: int = 32 ** 2, swap: torch.Tensor | None = None) -> None:
        self.index, self.alpha = index, alpha
        self.swap = swap
        """A ``(L, L)`` replacement mapper (word swap) used instead of ``index``/``alpha`` when given."""
        self.cross_until = int(cross * (steps + 1))
        self.self_until = int(self_ * steps)
        self.equalizer = torch.ones(len(index)) if equalizer is None else equalizer
        self.words = torch.zeros(2, len(index))
        self.words[0, list(blend_source)] = 1
        self.words[1, list(blend_target)] = 1
        self.blend = bool(blend_source or blend_target)
        self.blend_q = blend_q
        self.start = int(start * steps)
        self.threshold = threshold
        self.self_max = self_max
        self.step = 0
        self.store: dict[int, list[torch.Tensor]] = {}
        self.step_store: list[torch.Tensor] = []
        self.mask: torch.Tensor | None = None

    def __call__(self, probs: torch.Tensor, heads: int, is_cross: bool) -> torch.Tensor:
        half = probs.shape[0] // 2
        cond = probs[half:]  # a view: editing it edits probs, and the stored tensor too
        if is_cross:
            self.step_store.append(cond)
        p = cond.view(2, heads, *cond.shape[1:])
        base, other = p[0], p[1]
        if is_cross:
            if self.step < self.cross_until:
                if self.swap is not None:
                    moved = torch.einsum("hpw,wn->hpn", base, self.swap)
                else:
                    moved = base[:, :, self.index] * self.alpha + other * (1 - self.alpha)
                p[1] = moved * self.equalizer
        elif self.step < self.self_until and cond.shape[1] <= self.self_max:
            p[1] = base
        return probs

    def end_step(self, x: torch.Tensor) -> torch.Tensor:
        for t in self.step_store:
            self.store.setdefault(t.shape[1], []).append(t.clone())
        self.step_store = []
        self.step += 1
        if not self.blend or self.step <= self.start:
            return x
        q = self.blend_q or min(self.store)
        side = int(q ** 0.5)
        maps = torch.stack(self.store[q])  # (layers * steps, 2 * heads, q, L)
        maps = maps.reshape(maps.shape[0], 2, -1, side, side, maps.shape[-1]).transpose(0, 1)
        maps = maps.reshape(2, -1, side, side, maps.shape[-1])
        m = (maps * self.words[:, None, None, None, :]).sum(-1).mean(1, keepdim=True)
        m = F.max_pool2d(m, 3, 1, padding=1)
        m = F.interpolate(m, size=x.shape[2:])
        m = m / m.amax(dim=(2, 3), keepdim=True)
        hit = m.gt(self.threshold)
        mask = (hit[:1] | hit[1:]).float()
        self.mask = mask
        return x[:1] + mask * (x - x[:1])


class ReferenceProcessor:
    def __init__(self, control: ReferenceEdit) -> None:
        self.control = control

    def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: Any = None, temb: Any = None, *args: Any, **kwargs: Any) -> torch.Tensor:
        is_cross = encoder_hidden_states is not None
        context = encoder_hidden_states if is_cross else hidden_states
        q = attn.head_to_batch_dim(attn.to_q(hidden_states))
        k = attn.head_to_batch_dim(attn.to_k(context))
        v = attn.head_to_batch_dim(attn.to_v(context))
        probs = (q @ k.transpose(-1, -2) * attn.scale).softmax(-1)
        probs = self.control(probs, attn.heads, is_cross)
        out = attn.to_out[1](attn.to_out[0](attn.batch_to_head_dim(probs @ v)))
        return out / attn.rescale_output_factor


@torch.no_grad()
def reference_sample(pipe: Any, latent: torch.Tensor, prompts: list[str], nulls: torch.Tensor, steps: int,
                     guidance: float, control: ReferenceEdit) -> torch.Tensor:
    """Guided DDIM from ``latent`` with per-step (or one) null embeddings, under ``control``."""
    from diffusers import DDIMScheduler

    sched = DDIMScheduler.from_config(pipe.scheduler.config)
    sched.set_timesteps(steps)
    tok = pipe.tokenizer(prompts, padding="max_length", max_length=pipe.tokenizer.model_max_length,
                         truncation=True, return_tensors="pt")
    cond = pipe.text_encoder(tok.input_ids)[0]
    original = dict(pipe.unet.attn_processors)
    pipe.unet.set_attn_processor(ReferenceProcessor(control))
    try:
        x = latent.float().expand(len(prompts), -1, -1, -1).clone()
        for i, t in enumerate(sched.timesteps):
            null = nulls[i] if nulls.dim() == 4 else nulls
            ctx = torch.cat([null.expand(len(prompts), -1, -1), cond])
            out = pipe.unet(torch.cat([x, x]), t, encoder_hidden_states=ctx).sample
            u, c = out.chunk(2)
            x = sched.step(u + guidance * (c - u), t, x).prev_sample
            x = control.end_step(x)
    finally:
        pipe.unet.set_attn_processor(original)
    return x
