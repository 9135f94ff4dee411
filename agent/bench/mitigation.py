"""`sleuth bench mitigation`: what a mitigated toyworld classifier did to the world's planted bugs, by its oracle.

The oracle knows the planted bugs (planners and `sleuth mitigate` never see them). Each bug's caption and each
decoy's is rendered on the same fresh seeds for the original and the mitigated classifier, so the comparison is
paired: before and after failure rates with intervals, their ratio (matched-pairs interval), the exact one-sided
McNemar p that the rate went down, Holm-adjusted over the bugs; and top-1 accuracy, paired, on the classifier's own
(biased) training distribution and on the class prompts, with the Newcombe interval of the difference.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sleuth.tools import stats
from sleuth.tools.backends.criteria import failed
from sleuth.tools.backends.toyworld.classifier import ToyClassifier
from sleuth.tools.backends.toyworld.config import load_world
from sleuth.tools.backends.toyworld.oracle import CLASS_PROMPT, Oracle
from sleuth.tools.backends.toyworld.render import Renderer
from sleuth.tools.backends.toyworld.train import training_scenes

Progress = Callable[[str, int, int], None]
SEED = 90_000_000
"""Oracle seeds of this check: far from the oracle's own world check and from every investigation's block 0."""


def _paired(before: np.ndarray, after: np.ndarray) -> dict[str, Any]:
    """``before`` / ``after``: failures on the same images."""
    n = len(before)
    both, fixed, broken = (int(x.sum()) for x in (before & after, before & ~after, ~before & after))
    ratio = stats.paired_rate_ratio(both, broken, fixed, n)
    return {"before": {"k": int(before.sum()), "n": n}, "after": {"k": int(after.sum()), "n": n},
            "reduction": 1.0 - (int(after.sum()) / int(before.sum())) if before.any() else None,
            "ratio": ratio.ratio, "ratio_ci": [ratio.low, ratio.high],
            "p_lower": stats.mcnemar_exact(fixed, broken, "greater").p_value}


def _accuracy(ok_before: np.ndarray, ok_after: np.ndarray, margin: float) -> dict[str, Any]:
    ob, oa = ok_before, ok_after
    ni = stats.non_inferiority(int((ob & oa).sum()), int((ob & ~oa).sum()), int((~ob & oa).sum()), len(ob), margin)
    return {"before": float(ob.mean()), "after": float(oa.mean()), "n": len(ob),
            "difference": ni.interval.difference, "lower_bound_95": ni.interval.low, "non_inferior": ni.shown,
            "margin": margin}


def check(weights: str | Path, world: str | None = None, n: int = 3000, margin: float = 0.01,
          n_per_class: int = 1000, progress: Progress | None = None) -> dict[str, Any]:
    w = load_world(world)
    before_clf = ToyClassifier(w)
    after_clf = ToyClassifier(w, weights=weights)
    before, after = Oracle(w, before_clf), Oracle(w, after_clf)
    labels = w.labels.labels
    rows: list[dict[str, Any]] = []
    manifest = before.manifest()
    for i, b in enumerate(manifest):
        lb = before.predictions(b.caption, n, SEED)
        la = after.predictions(b.caption, n, SEED)
        row = {"name": b.name, "kind": b.kind, "class": b.class_, "caption": b.caption, "strength": b.strength,
               **_paired(failed(lb, b.class_, w.labels, "top1"), failed(la, b.class_, w.labels, "top1"))}
        rows.append(row)
        if progress is not None:
            progress("planted bugs and decoys", i + 1, len(manifest))
    bugs = [r for r in rows if r["kind"] == "bug"]
    for r, p in zip(bugs, stats.adjust_pvalues([r["p_lower"] for r in bugs], "holm")):
        r["adjusted_p_lower"] = p
    # accuracy: the biased training distribution (the classifier's own) and the class prompts (the generator's)
    scenes = training_scenes(w, n_per_class, SEED, "training")
    images = Renderer(w, before.generator.size).render(scenes)
    truth = np.asarray([labels.index(s.label) for s in scenes])
    train = _accuracy(np.argmax(before_clf.logits(images), 1) == truth,
                      np.argmax(after_clf.logits(images), 1) == truth, margin)
    ok_b, ok_a = [], []
    for j, label in enumerate(labels):
        prompt = CLASS_PROMPT.format(label=label)
        ok_b.append(np.argmax(before.predictions(prompt, n_per_class, SEED), 1) == j)
        ok_a.append(np.argmax(after.predictions(prompt, n_per_class, SEED), 1) == j)
    prompts = _accuracy(np.concatenate(ok_b), np.concatenate(ok_a), margin)
    return {"world": w.name, "weights": str(weights), "classifier_after": after_clf.id, "n": n, "seed": SEED,
            "bugs": bugs, "decoys": [r for r in rows if r["kind"] == "decoy"],
            "halved": sum(1 for r in bugs if r["reduction"] is not None and r["reduction"] >= 0.5),
            "accuracy_training_distribution": train, "accuracy_class_prompts": prompts}
