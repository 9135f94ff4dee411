"""Prompt-to-prompt (Hertz et al.) through diffusers attention processors.

The source prompt and one or more target rows are denoised in one batch from the same inverted latent.
In the conditional half of the batch, each target row's attention is overridden by the source row's:

- cross-attention (image -> text tokens), for the first ``cross`` fraction of the steps: a target token that
  has a counterpart in the source takes the source token's map (word swap maps a swapped word to the word it
  replaces; refinement leaves new words their own maps), the target's own *values* carry the new words in;
- re-weighting scales chosen target tokens' maps (the edit's content words x2: the words prompt-to-prompt's user
  would name, not the articles, pronouns and verbs a caption's sentence carries along);
- self-attention (image -> image), for the first ``self`` fraction of the steps, in layers up to a size;
- local blending (optional): after each step from ``blend_start`` on, a target row keeps the source latent
  outside the region the edit's content words attend to (their maps, as injected, summed over every step so far),
  and inside a fixed region to keep (the class, ``regions.class_region``) when one is given.

Attention probabilities are computed explicitly only in calls that edit or record them; others run the
layer's own (fused) processor. Of the maps, only the changed words' running sum is kept.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

TOKENS = 77
"""Stable Diffusion's text length; a pipeline's own is its tokenizer's ``model_max_length`` (see `token_length`)."""


def token_length(tokenizer: Any) -> int:
    """The padded prompt length the pipeline encodes: the tokenizer's ``model_max_length`` (77 for SD's CLIP)."""
    n = getattr(tokenizer, "model_max_length", TOKENS)
    return int(n) if isinstance(n, int) and 0 < n <= 4096 else TOKENS


@dataclass
class TokenAlignment:
    """How each target token relates to the source prompt's tokens."""

    mapper: Any
    """``(L, L)`` tensor, L the prompt length (77 for SD): ``mapper[i, j]`` is the weight of source token ``i``'s
    map in target token ``j``'s."""
    alpha: Any
    """``(L,)`` tensor: 1 where a target token takes the source's map, 0 for new words."""
    source_changed: list[int] = field(default_factory=list)
    target_changed: list[int] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    """Source words the edit removes or replaces."""
    added: list[str] = field(default_factory=list)
    """Target words the edit adds or puts in."""
    mode: str = "same"
    """``same`` (no change), ``replace`` (only same-length word swaps) or ``refine`` (words added or removed)."""
    source_content: list[int] = field(default_factory=list)
    target_content: list[int] = field(default_factory=list)
    """Token positions of the changed *content* words (``source_changed``/``target_changed`` without stop words):
    the words re-weighted and blended, as prompt-to-prompt re-weights and blends the words its user names."""


STOP_WORDS = frozenset("""
a an the this that these those it its it's itself they them their theirs he him his she her hers we us our you your
i me my one ones there here is are was were be been being am has have had do does did will would can could shall
should may might must of in on at to by for from with without into onto over under above below near next beside
behind between among through across along around against about as and or but nor so than then too very also just
not no some any each every all both other another such what which who whom whose where when how while if
""".split())
"""Words an edit carries along without naming anything to draw: articles, pronouns, auxiliaries, prepositions and
conjunctions."""


def is_content(word: str) -> bool:
    """A word that names something (not punctuation, not a stop word)."""
    return not _is_punctuation(word) and word.lower() not in STOP_WORDS


_UNIT = re.compile(r"\w+(?:[-'’]\w+)*|[^\w\s]+")
"""Words (with inner hyphens and apostrophes) and runs of punctuation: "cat." is the word "cat" and ".", as CLIP's
tokenizer reads it, so a caption that goes on after "cat." still has the class word unchanged."""


def _is_punctuation(unit: str) -> bool:
    return not any(c.isalnum() for c in unit)


def _words(tokenizer: Any, prompt: str) -> list[tuple[str, list[int]]]:
    """(unit, its token ids) for each word or run of punctuation, in order; their ids concatenate to the prompt's."""
    words = [(w, tokenizer(w, add_special_tokens=False).input_ids) for w in _UNIT.findall(prompt)]
    whole = tokenizer(prompt, add_special_tokens=False).input_ids
    if [t for _, ids in words for t in ids] != whole:
        # A tokenizer that merges across these boundaries: align token by token instead (as seq_aligner does).
        return [(tokenizer.decode([t]), [t]) for t in whole]
    return words


def align(tokenizer: Any, source: str, target: str, mode: str = "auto") -> TokenAlignment:
    """Token alignment of ``target`` to ``source`` at the word level.

    ``auto``: a run of words replaced by as many words is a word swap (each new word takes the map of the
    word it replaces); anything else is refinement (new words keep their own maps). ``refine`` treats every
    change as refinement, as LANCE does.
    """
    import torch

    if mode not in ("auto", "refine"):
        raise ValueError(f"mode must be 'auto' or 'refine', not {mode!r}")
    src, tgt = _words(tokenizer, source), _words(tokenizer, target)
    starts_s, starts_t = _starts(src), _starts(tgt)
    n = token_length(tokenizer)
    mapper = torch.zeros(n, n)
    alpha = torch.zeros(n)
    out = TokenAlignment(mapper, alpha)

    def link(i: int, j: int, w: float = 1.0) -> None:
        if i < n and j < n:
            mapper[i, j] += w
            alpha[j] = 1.0

    link(0, 0)
    matcher = difflib.SequenceMatcher(a=[tuple(t) for _, t in src], b=[tuple(t) for _, t in tgt], autojunk=False)
    kinds: set[str] = set()
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        swap = tag == "replace" and mode == "auto" and i2 - i1 == j2 - j1
        for a, b in zip(range(i1, i2), range(j1, j2)):
            s_ids, t_ids = _span(starts_s, a), _span(starts_t, b)
            if tag == "equal":
                for i, j in zip(s_ids, t_ids):
                    link(i, j)
            elif swap:
                for j in t_ids:
                    for i in s_ids:
                        link(i, j, 1.0 / len(s_ids))
        if tag == "equal":
            continue
        kinds.add("replace" if swap else "refine")
        # Punctuation put in or taken out is no word of the edit: it is not re-weighted, blended or reported.
        words_s = [a for a in range(i1, i2) if not _is_punctuation(src[a][0])]
        words_t = [b for b in range(j1, j2) if not _is_punctuation(tgt[b][0])]
        out.removed += [src[a][0] for a in words_s]
        out.added += [tgt[b][0] for b in words_t]
        out.source_changed += [i for a in words_s for i in _span(starts_s, a)]
        out.target_changed += [j for b in words_t for j in _span(starts_t, b)]
        out.source_content += [i for a in words_s if is_content(src[a][0]) for i in _span(starts_s, a)]
        out.target_content += [j for b in words_t if is_content(tgt[b][0]) for j in _span(starts_t, b)]
    # End of text to end of text; after it, target position j takes source position j (padding, which in CLIP
    # carries the prompt's summary), as prompt-to-prompt's aligner does, not the source's end of text + k.
    end_s, end_t = starts_s[-1], starts_t[-1]
    link(end_s, end_t)
    for j in range(end_t + 1, n):
        link(j, j)
    out.source_changed = [i for i in out.source_changed if i < n]
    out.target_changed = [j for j in out.target_changed if j < n]
    out.source_content = [i for i in out.source_content if i < n]
    out.target_content = [j for j in out.target_content if j < n]
    out.mode = "refine" if "refine" in kinds else ("replace" if kinds else "same")
    return out


def word_tokens(tokenizer: Any, prompt: str, word: str) -> list[int]:
    """Token positions of every occurrence of ``word`` (whole words, case-insensitive) in ``prompt``."""
    words = _words(tokenizer, prompt)
    starts = _starts(words)
    key = tokenizer(word, add_special_tokens=False).input_ids
    n = token_length(tokenizer)
    return [j for k, (_, ids) in enumerate(words) if ids == key for j in _span(starts, k) if j < n]


def _starts(words: list[tuple[str, list[int]]]) -> list[int]:
    """Token position of each word (after the start token), then the end-of-text position."""
    starts = [1]
    for _, ids in words:
        starts.append(starts[-1] + len(ids))
    return starts


def _span(starts: list[int], k: int) -> range:
    return range(starts[k], starts[k + 1])


@dataclass(frozen=True)
class Injection:
    """One target row's schedule: fractions of the steps, from the first, with attention injected."""

    cross: float
    self_: float


def cross_steps(fraction: float, steps: int) -> int:
    """Steps with cross-attention injected, counted as prompt-to-prompt counts them (over ``steps + 1`` entries;
    self-attention's are ``int(fraction * steps)``)."""
    return int(fraction * (steps + 1))


class LocalBlend:
    """Keeps each target row on the source latent outside the changed words' attention region.

    As prompt-to-prompt's ``AttentionStore``, the words' cross-attention maps are summed over every step from the
    first, and the mask at each step from ``start`` on comes from that running sum: one step's map alone is noisy
    and moves from step to step, so a mask from it frees or freezes different pixels at each step.
    """

    def __init__(self, source_tokens: Sequence[int], target_tokens: Sequence[int], *, threshold: float = 0.3,
                 start: int = 0, keep: Any = None) -> None:
        self.source_tokens = list(source_tokens)
        self.target_tokens = list(target_tokens)
        self.threshold = threshold
        self.start = start
        self.keep = keep
        """``(1, 1, h, w)`` latent mask (1: keep the source) applied whatever the words' maps say; None: none."""
        self.sums: dict[int, Any] = {}
        """Query length -> ``(rows, q)`` sum of the words' maps over layers of that size and steps so far."""
        self.last_mask: Any = None

    def wants(self, step: int) -> bool:
        """Whether the maps of ``step`` are needed: every step's, from the first, when there are words to blend."""
        return bool(self.source_tokens or self.target_tokens)

    def record(self, cond: Any) -> None:
        """``cond``: conditional-half cross-attention ``(rows, heads, q, L)``; adds the words' maps to the sum."""
        import torch

        rows = [cond[0, :, :, self.source_tokens].sum(-1).mean(0)]
        rows += [cond[r, :, :, self.target_tokens].sum(-1).mean(0) for r in range(1, cond.shape[0])]
        maps = torch.stack(rows).float()
        q = cond.shape[2]
        self.sums[q] = maps if q not in self.sums else self.sums[q] + maps

    def after_step(self, step: int, x: Any) -> Any:
        """``x`` blended from step ``start`` on (earlier steps: unchanged)."""
        if step < self.start or (not self.sums and self.keep is None):
            return x
        return self.apply(x)

    def apply(self, x: Any) -> Any:
        import torch
        import torch.nn.functional as F

        h, w = x.shape[-2:]
        if self.sums:
            # Hertz et al. blend from the maps at a quarter of the latent side: coarse, so the mask is a region.
            q = min(self.sums, key=lambda n: (abs(math.log(n / max(h * w / 16, 1))), -n))
            f = math.sqrt(h * w / q)
            m = self.sums[q].reshape(x.shape[0], 1, round(h / f), round(w / f))
            m = F.max_pool2d(m, 3, stride=1, padding=1)
            m = F.interpolate(m, size=(h, w), mode="nearest")
            m = m / m.amax(dim=(2, 3), keepdim=True).clamp_min(1e-12)
            words = m > self.threshold
            mask = (words[1:] | words[:1]).to(x.dtype)
        else:
            mask = torch.ones((x.shape[0] - 1, 1, h, w), dtype=x.dtype, device=x.device)
        if self.keep is not None:
            mask = mask * (1 - self.keep.to(device=x.device, dtype=x.dtype))
        self.last_mask = mask
        return torch.cat([x[:1], x[:1] + mask * (x[1:] - x[:1])])


class AttentionEdit:
    """Prompt-to-prompt control of a batch ``[source, target_1 .. target_K]``, one schedule per target."""

    def __init__(self, alignment: TokenAlignment, injections: Sequence[Injection], steps: int, *,
                 equalizer: Any = None, self_max_tokens: int | None = None, blend: LocalBlend | None = None,
                 guided: bool = True) -> None:
        import torch

        self.alignment = alignment
        self.guided = guided
        """Whether the batch has an unconditional half before the conditional one (guidance != 1)."""
        self.cross_until = [cross_steps(inj.cross, steps) for inj in injections]
        self.self_until = [int(inj.self_ * steps) for inj in injections]
        self.equalizer = torch.ones(alignment.mapper.shape[0]) if equalizer is None else equalizer
        self.self_max_tokens = self_max_tokens
        self.blend = blend
        self.step = 0
        self.explicit_calls = 0

    def begin_step(self, i: int) -> None:
        self.step = i

    def end_step(self, i: int, x: Any) -> Any:
        return x if self.blend is None else self.blend.after_step(i, x)

    def needs(self, is_cross: bool, q: int) -> bool:
        if is_cross:
            return any(self.step < c for c in self.cross_until) or (
                self.blend is not None and self.blend.wants(self.step))
        ok = self.self_max_tokens is None or q <= self.self_max_tokens
        return ok and any(self.step < s for s in self.self_until)

    def edit(self, probs: Any, heads: int, is_cross: bool) -> Any:
        """``probs``: ``(halves * rows * heads, q, k)`` attention probabilities, the unconditional rows first when
        guided (at guidance 1 there is only the conditional half)."""
        import torch

        halves = 2 if self.guided else 1
        rows = probs.shape[0] // heads // halves
        p = probs.reshape(halves * rows, heads, *probs.shape[1:])
        uncond, cond = p[:(halves - 1) * rows], list(p[(halves - 1) * rows:].unbind(0))
        src = cond[0]
        if is_cross:
            injected = None
            eq = self.equalizer.to(src.device, src.dtype)
            for r, until in enumerate(self.cross_until, start=1):
                if self.step < until:
                    if injected is None:
                        injected = src @ self.alignment.mapper.to(src.device, src.dtype)
                    a = self.alignment.alpha.to(src.device, src.dtype)
                    cond[r] = (a * injected + (1 - a) * cond[r]) * eq
            if self.blend is not None and self.blend.wants(self.step):
                # The maps as injected and re-weighted: prompt-to-prompt's AttentionStore holds the very tensor
                # its controller then edits in place. While injected, a swapped-in word's region is the source
                # word's.
                self.blend.record(torch.stack(cond))
        elif self.self_max_tokens is None or src.shape[1] <= self.self_max_tokens:
            for r, until in enumerate(self.self_until, start=1):
                if self.step < until:
                    cond[r] = src
        return torch.cat([uncond, torch.stack(cond)]).reshape(probs.shape)


class P2PAttnProcessor:
    """A diffusers attention processor that lets an :class:`AttentionEdit` rewrite the probabilities."""

    def __init__(self, control: AttentionEdit, fallback: Any) -> None:
        self.control = control
        self.fallback = fallback

    def __call__(self, attn: Any, hidden_states: Any, encoder_hidden_states: Any = None, attention_mask: Any = None,
                 temb: Any = None, *args: Any, **kwargs: Any) -> Any:
        import torch

        is_cross = encoder_hidden_states is not None
        ndim = hidden_states.ndim
        q_len = hidden_states.shape[2] * hidden_states.shape[3] if ndim == 4 else hidden_states.shape[1]
        if not self.control.needs(is_cross, q_len):
            return self.fallback(attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kwargs)
        self.control.explicit_calls += 1
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        if ndim == 4:
            b, c, h, w = hidden_states.shape
            hidden_states = hidden_states.view(b, c, h * w).transpose(1, 2)
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        batch, seq = context.shape[:2]
        attention_mask = attn.prepare_attention_mask(attention_mask, seq, batch)
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        query = attn.to_q(hidden_states)
        if encoder_hidden_states is None:
            context = hidden_states
        elif attn.norm_cross:
            context = attn.norm_encoder_hidden_states(encoder_hidden_states)
        key = attn.head_to_batch_dim(attn.to_k(context))
        value = attn.head_to_batch_dim(attn.to_v(context))
        # Probabilities explicitly, not the fused kernel: prompt-to-prompt needs to rewrite them.
        probs = attn.get_attention_scores(attn.head_to_batch_dim(query), key, attention_mask)
        probs = self.control.edit(probs, attn.heads, is_cross)
        out = attn.batch_to_head_dim(torch.bmm(probs, value))
        out = attn.to_out[1](attn.to_out[0](out))
        if ndim == 4:
            out = out.transpose(-1, -2).reshape(b, c, h, w)
        if attn.residual_connection:
            out = out + residual
        return out / attn.rescale_output_factor


@contextmanager
def controlled(unet: Any, control: AttentionEdit) -> Iterator[None]:
    """Every attention layer of ``unet`` under ``control`` inside the block; the original processors after."""
    original = dict(unet.attn_processors)
    unet.set_attn_processor({name: P2PAttnProcessor(control, proc) for name, proc in original.items()})
    try:
        yield
    finally:
        unet.set_attn_processor(original)
