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


class PairedCounts(BaseModel):
    """The counterfactual pairs a paired test may use, and those it may not."""

    pairs: int = Field(description="Pairs whose edit passed every quality filter: the paired test's sample.")
    to_failure: int = Field(description="Counted pairs classified correctly before the edit and wrongly after.")
    to_correct: int = Field(description="Counted pairs classified wrongly before the edit and correctly after.")
    failed_before: int = Field(description="Counted pairs that failed before the edit.")
    failed_after: int = Field(description="Counted pairs that failed after the edit.")
    excluded: int = Field(description="Pairs left out: their edit failed a quality filter.")
    excluded_by: dict[str, int] = Field(default_factory=dict, description="Excluded pairs by filter failed.")

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
    return PairedCounts(pairs=len(kept), to_failure=sum(not f.failed_before and f.failed_after for f in kept),
                        to_correct=sum(f.failed_before and not f.failed_after for f in kept),
                        failed_before=sum(f.failed_before for f in kept),
                        failed_after=sum(f.failed_after for f in kept),
                        excluded=len(flips) - len(kept), excluded_by=by)


# -- cost ---------------------------------------------------------------------------------------------------------


def editing_charge(inv: Investigation, images: list[np.ndarray]) -> int:
    """Images' worth that editing ``images`` (each once) costs: every distinct image inverted, every one edited."""
    cost = edit_cost(inv.backends.editor)
    distinct = len({hashlib.sha256(np.ascontiguousarray(im).tobytes()).digest() + repr(np.shape(im)).encode()
                    for im in images})
    return math.ceil(cost.inversion * distinct + cost.edit * len(images))


def counterfactual_size(inv: Investigation, asked: int) -> tuple[int, list[str]]:
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
    charge = math.ceil((1 + cost.inversion + cost.edit) * n)
    if charge > inv.budget.left:
        raise ToolError(f"image budget exhausted: {n} counterfactual pairs cost {charge} images' worth "
                        f"({n} generated, {charge - n} for editing), {inv.budget.left} of {inv.budget.images} left")
    return n, notes


# -- editing ------------------------------------------------------------------------------------------------------


def mcnemar_text(m: stats.McNemar) -> str:
    return f"McNemar: {m.b} flipped to failure, {m.c} back, p={pv(m.p_value)}"


def counterfactual_pairs(inv: Investigation, sample: Sample, source: str, target: str) -> tuple[list[Flip], list[bool]]:
    """Edit every valid image of ``sample`` from ``source`` to ``target`` and classify the edits."""
    idx = [i for i, ok in enumerate(sample.valid) if ok]
    gens = sample.images(idx)
    return edit_and_classify(inv, gens, source, target, before=[sample.topk[i] for i in idx],
                             failed_before=[bool(sample.failed[i]) for i in idx])


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
                      failed_before: list[bool] | None = None) -> tuple[list[Flip], list[bool]]:
    """Edit ``gens`` (paid for first, at the editor's declared cost) and classify before and after."""
    inv.budget.spend_editing(editing_charge(inv, [g.image for g in gens]))
    outcomes = []
    for i, g in enumerate(gens):
        outcomes.append(_edit(inv, g, source, target))
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
    flips = []
    for g, o, b, a, fb, fa in zip(gens, outcomes, before, after, failed_before, failed_after):
        original = inv.put_image(g)
        edited = inv.put_image(Generation(image=o.image, prompt=target, seed=g.seed, meta=o.meta))
        flips.append(Flip(original=original, edited=edited, before=b, after=a, failed_before=fb,
                          failed_after=fa, passed=o.passed, counted=all(o.passed.values())))
    return flips, failed_after
