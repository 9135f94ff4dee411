"""Counterfactual pairs: the same image before and after an edit, both classified.

Two rules hold for every tool that edits (``edit_image``, ``measure_rate(mode="counterfactual")``):

- **Editing is paid for.** An edit costs what its editor declares (``EditCost``: per image inverted, per edit, in
  images), charged to the image budget before the work starts; an editor that declares a cap on counterfactual
  pairs (the Stable Diffusion editor: about a minute per inversion on a GPU) gets at most that many per measurement.
- **Only edits that passed their editor's quality filters count.** An edit that failed a filter (LANCE's CLIP
  checks: the edit no longer looks like the image, does not match its caption or changed the class word; toyworld:
  the edit did not happen or could not be rendered) says nothing about the classifier: a flip there may be the
  editor destroying or replacing the object. Such pairs are left out of the paired test, and how many, by which
  filter, is reported.
- **Edits are compared with a sham edit.** ``measure_rate(mode="counterfactual")`` also passes every image through
  the same editor with the caption left unchanged (for a diffusion editor: inversion and reconstruction; for
  toyworld: the same scene re-rendered). Its test is the exact McNemar test of the edited image against the
  sham-edited one, pair by pair, so it asks whether the captioned attribute changes failures, not whether editing
  does; the sham's own flips against the originals are reported beside it. The effect is the matched-pairs rate
  ratio (edited / sham) with its paired interval (``stats.paired_rate_ratio``).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
from pydantic import BaseModel, Field

from sleuth.tools import stats
from sleuth.tools.backends.base import BackendError, EditOutcome, Generation, edit_cost
from sleuth.tools.backends.criteria import failed as failed_by_criterion
from sleuth.tools.cache import edit_key
from sleuth.tools.defaults import BUDGET_EXHAUSTED
from sleuth.tools.investigation import Investigation, Sample
from sleuth.tools.registry import ToolError
from sleuth.tools.text import pv

MAX_PAIRS = 200
"""Most images one counterfactual measurement edits, whatever the editor."""


class Flip(BaseModel):
    original: str = Field(description="Ref of the original image.")
    edited: str = Field(description="Ref of the edited image.")
    before: list[str] = Field(description="Top predictions before the edit.")
    after: list[str] = Field(description="Top predictions after the edit.")
    failed_before: bool
    failed_after: bool
    passed: dict[str, bool] = Field(default_factory=dict, description="Edit-quality filters passed, by name.")
    counted: bool = Field(True, description="Whether the pair counts in the paired test: the edit passed every "
                                            "quality filter.")
    sham: str | None = Field(None, description="Ref of the sham-edited image (same editor, caption unchanged).")
    failed_sham: bool | None = Field(None, description="Whether the sham-edited image fails.")


class PairedCounts(BaseModel):
    """The counterfactual pairs a paired test may use, and those it may not."""

    pairs: int = Field(description="Pairs whose edit passed every quality filter: the paired test's sample.")
    to_failure: int = Field(description="Counted pairs classified correctly before the edit and wrongly after.")
    to_correct: int = Field(description="Counted pairs classified wrongly before the edit and correctly after.")
    failed_before: int = Field(description="Counted pairs that failed before the edit.")
    failed_after: int = Field(description="Counted pairs that failed after the edit.")
    excluded: int = Field(description="Pairs left out: their edit failed a quality filter.")
    excluded_by: dict[str, int] = Field(default_factory=dict, description="Excluded pairs by filter failed.")
    failed_sham: int | None = Field(None, description="Counted pairs whose sham edit fails.")
    sham_to_failure: int | None = Field(None, description="Counted pairs the sham edit alone turned into failures.")
    sham_to_correct: int | None = Field(None, description="Counted pairs the sham edit alone turned correct.")
    vs_sham_to_failure: int | None = Field(None, description="Counted pairs that fail edited and not sham-edited.")
    vs_sham_to_correct: int | None = Field(None, description="Counted pairs that fail sham-edited and not edited.")
    both_fail: int | None = Field(None, description="Counted pairs that fail both edited and sham-edited.")

    def note(self) -> str | None:
        if not self.excluded:
            return None
        by = ", ".join(f"{k} {v}" for k, v in sorted(self.excluded_by.items()))
        return (f"{self.excluded} of {self.excluded + self.pairs} edits failed the editor's quality filters ({by}) "
                "and are left out of the paired test")


def paired_counts(flips: list[Flip]) -> PairedCounts:
    kept = [f for f in flips if f.counted]
    by: dict[str, int] = {}
    for f in flips:
        if not f.counted:
            for name, ok in f.passed.items():
                if not ok:
                    by[name] = by.get(name, 0) + 1
    pc = PairedCounts(pairs=len(kept), to_failure=sum(not f.failed_before and f.failed_after for f in kept),
                      to_correct=sum(f.failed_before and not f.failed_after for f in kept),
                      failed_before=sum(f.failed_before for f in kept),
                      failed_after=sum(f.failed_after for f in kept),
                      excluded=len(flips) - len(kept), excluded_by=by)
    if kept and all(f.failed_sham is not None for f in kept):
        pc.failed_sham = sum(bool(f.failed_sham) for f in kept)
        pc.sham_to_failure = sum(not f.failed_before and bool(f.failed_sham) for f in kept)
        pc.sham_to_correct = sum(f.failed_before and not f.failed_sham for f in kept)
        pc.vs_sham_to_failure = sum(f.failed_after and not f.failed_sham for f in kept)
        pc.vs_sham_to_correct = sum(not f.failed_after and bool(f.failed_sham) for f in kept)
        pc.both_fail = sum(f.failed_after and bool(f.failed_sham) for f in kept)
    return pc


# -- cost ---------------------------------------------------------------------------------------------------------


def editing_charge(inv: Investigation, images: list[np.ndarray]) -> int:
    """Images' worth that editing ``images`` (each once) costs: every distinct image inverted, every one edited."""
    cost = edit_cost(inv.backends.editor)
    distinct = len({hashlib.sha256(np.ascontiguousarray(im).tobytes()).digest() + repr(np.shape(im)).encode()
                    for im in images})
    return math.ceil(cost.inversion * distinct + cost.edit * len(images))


def counterfactual_size(inv: Investigation, asked: int, sham: bool = False) -> tuple[int, list[str]]:
    """How many fresh class images a counterfactual measurement edits, and what to say about it.

    Raises when the budget cannot pay for generating and editing them (checked before anything is spent).
    """
    cost = edit_cost(inv.backends.editor)
    n = min(asked, MAX_PAIRS)
    notes = []
    if cost.max_pairs is not None and cost.max_pairs < n:
        notes.append(f"the editor is costly ({cost.inversion:g} images per inversion, {cost.edit:g} per edit): "
                     f"{cost.max_pairs} pairs edited, not {n}")
        n = cost.max_pairs
    charge = math.ceil((1 + cost.inversion + cost.edit * (2 if sham else 1)) * n)
    if charge > inv.budget.left:
        raise ToolError(f"{BUDGET_EXHAUSTED}: {n} counterfactual pairs cost {charge} images' worth "
                        f"({n} generated, {charge - n} for editing), {inv.budget.left} of {inv.budget.images} left")
    return n, notes


# -- editing ------------------------------------------------------------------------------------------------------


def mcnemar_text(m: stats.McNemar) -> str:
    return f"McNemar: {m.b} flipped to failure, {m.c} back, p={pv(m.p_value)}"


def counterfactual_pairs(inv: Investigation, sample: Sample, source: str, target: str,
                         sham: bool = False) -> tuple[list[Flip], list[bool]]:
    """Edit every valid image of ``sample`` from ``source`` to ``target`` (and, with ``sham``, from ``source`` to
    itself) and classify the edits."""
    idx = [i for i, ok in enumerate(sample.valid) if ok]
    gens = sample.images(idx)
    return edit_and_classify(inv, gens, source, target, before=[sample.topk[i] for i in idx],
                             failed_before=[bool(sample.failed[i]) for i in idx], sham=sham)


def _edit(inv: Investigation, g: Generation, source: str, target: str) -> EditOutcome:
    editor = inv.backends.editor
    # Editors whose outcomes a re-run would not repeat bit for bit (a GPU diffusion model) or that are costly keep
    # them: a resumed run or a verification on this machine gets the same edit back.
    keep = inv.cache if getattr(editor, "cache_outcomes", False) else None
    key = edit_key(editor.id, g.image, source, target) if keep is not None else ""
    if keep is not None:
        hit = keep.get_edit(key)
        if hit is not None:
            return hit
    try:
        out = editor.edit(g, source, target)
    except BackendError as e:
        raise ToolError(f"edit failed: {e}") from None
    if keep is not None:
        keep.put_edit(key, out)
    return out


def edit_and_classify(inv: Investigation, gens: list[Generation], source: str, target: str, *,
                      before: list[list[str]] | None = None,
                      failed_before: list[bool] | None = None,
                      sham: bool = False) -> tuple[list[Flip], list[bool]]:
    """Edit ``gens`` (paid for first, at the editor's declared cost) and classify before and after; with ``sham``,
    also pass each image through the editor with its caption unchanged (paid for too: one more edit per image)."""
    images = [g.image for g in gens]
    inv.budget.spend_editing(editing_charge(inv, images + images if sham else images))
    outcomes = []
    shams: list[EditOutcome] = []
    for i, g in enumerate(gens):
        outcomes.append(_edit(inv, g, source, target))
        if sham:
            shams.append(_edit(inv, g, source, source))
        if inv.progress is not None:
            inv.progress("editing", i + 1, len(gens))
    labels = inv.labels
    k = max(inv.top_k, 1)

    def classify(images: list[np.ndarray]) -> tuple[list[list[str]], list[bool]]:
        logits = np.asarray(inv.backends.classifier.logits(images))
        order = np.argsort(-logits, axis=1)[:, :k]
        bad = failed_by_criterion(logits, inv.label, labels, inv.criterion, k=inv.top_k)
        return [[labels.labels[j] for j in row] for row in order], [bool(b) for b in bad]

    if before is None or failed_before is None:
        before, failed_before = classify([g.image for g in gens])
    after, failed_after = classify([o.image for o in outcomes])
    failed_sham: list[bool | None] = [None] * len(gens)
    if sham:
        _, failed_sham_known = classify([o.image for o in shams])
        failed_sham = list(failed_sham_known)
    flips = []
    for i, (g, o, b, a, fb, fa) in enumerate(zip(gens, outcomes, before, after, failed_before, failed_after)):
        original = inv.put_image(g)
        edited = inv.put_image(Generation(image=o.image, prompt=target, seed=g.seed, meta=o.meta))
        sham_ref = None
        if sham:
            s_out = shams[i]
            same = np.array_equal(np.asarray(s_out.image), np.asarray(g.image))
            sham_ref = original if same else inv.put_image(Generation(image=s_out.image, prompt=source, seed=g.seed,
                                                                      meta=s_out.meta))
        flips.append(Flip(original=original, edited=edited, before=b, after=a, failed_before=fb,
                          failed_after=fa, passed=o.passed, counted=all(o.passed.values()),
                          sham=sham_ref, failed_sham=failed_sham[i]))
    return flips, failed_after
