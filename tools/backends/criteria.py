"""Failure criteria: when does a classifier's output count as a failure for a true label?

- ``top1``: the top prediction is not the label.
- ``topk``: the label is not among the top ``k``.
- ``parent``: no top-``k`` prediction is under the label's parent group (Wiles et al.); a label without a parent
  falls back to ``topk``.
"""

from __future__ import annotations

import numpy as np

from sleuth.tools.backends.base import BackendError, LabelSpace

CRITERIA = ("top1", "topk", "parent")


def failed(logits: np.ndarray, label: str, labels: LabelSpace, criterion: str, k: int = 3) -> np.ndarray:
    """Boolean array ``(N,)``: which rows of ``logits`` ``(N, len(labels))`` fail ``criterion`` for ``label``."""
    if criterion not in CRITERIA:
        raise BackendError(f"unknown failure criterion {criterion!r} (known: {', '.join(CRITERIA)})")
    logits = np.asarray(logits)
    if logits.ndim != 2 or logits.shape[1] != len(labels.labels):
        raise BackendError(f"logits must have shape (N, {len(labels.labels)}), got {logits.shape}")
    target = labels.index(label)
    if criterion == "top1":
        return np.argmax(logits, axis=1) != target
    k = max(1, min(k, logits.shape[1]))
    top = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    if criterion == "topk" or labels.parent(label) is None:
        return ~np.any(top == target, axis=1)
    ok = np.array([labels.same_parent(label, name) for name in labels.labels])
    return ~np.any(ok[top], axis=1)
