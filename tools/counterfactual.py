"""Counterfactual pairs: the same image before and after an edit, both classified."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, Field

from sleuth.tools import stats
from sleuth.tools.backends.base import BackendError, Generation
from sleuth.tools.backends.criteria import failed as failed_by_criterion
from sleuth.tools.investigation import Investigation, Sample
from sleuth.tools.registry import ToolError
from sleuth.tools.text import pv


class Flip(BaseModel):
    original: str = Field(description="Ref of the original image.")
    edited: str = Field(description="Ref of the edited image.")
    before: list[str] = Field(description="Top predictions before the edit.")
    after: list[str] = Field(description="Top predictions after the edit.")
    failed_before: bool
    failed_after: bool
    passed: dict[str, bool] = Field(default_factory=dict, description="Edit-quality filters passed, by name.")


def mcnemar_text(m: stats.McNemar) -> str:
    return f"McNemar: {m.b} flipped to failure, {m.c} back, p={pv(m.p_value)}"


def counterfactual_pairs(inv: Investigation, sample: Sample, source: str, target: str) -> tuple[list[Flip], list[bool]]:
    """Edit every valid image of ``sample`` from ``source`` to ``target`` and classify the edits."""
    idx = [i for i, ok in enumerate(sample.valid) if ok]
    gens = sample.images(idx)
    return edit_and_classify(inv, gens, source, target, before=[sample.topk[i] for i in idx],
                             failed_before=[bool(sample.failed[i]) for i in idx])


def edit_and_classify(inv: Investigation, gens: list[Generation], source: str, target: str, *,
                      before: list[list[str]] | None = None,
                      failed_before: list[bool] | None = None) -> tuple[list[Flip], list[bool]]:
    editor = inv.backends.editor
    outcomes = []
    for i, g in enumerate(gens):
        try:
            outcomes.append(editor.edit(g, source, target))
        except BackendError as e:
            raise ToolError(f"edit failed: {e}") from None
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
                          failed_after=fa, passed=o.passed))
    return flips, failed_after
