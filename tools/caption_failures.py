"""Turn a measurement's failed images into failure hypotheses (Wiles et al., section 3).

Failures are split by the label the classifier predicted, each group is clustered on embedder features, every image
is captioned conditioned on the class prompt, and one caption per cluster is built by greedy sentence selection: the
sentence with the highest mean log-likelihood over the cluster's images is taken first, then the next best sentence
that says something new, up to `max_sentences`. Each caption is a hypothesis to test with measure_rate.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, Field
from scipy.cluster.vq import kmeans2

from sleuth.tools.common import investigation
from sleuth.tools.context import ToolContext
from sleuth.tools.investigation import join_sentences, normalise_caption
from sleuth.tools.registry import ToolError
from sleuth.tools.text import MAX_ITEMS, Line, cut, quote

NAME = "caption_failures"


class Args(BaseModel):
    measurement_id: str = Field(description="Id returned by generate_and_classify.")
    max_clusters: int = Field(3, ge=1, le=10, description="Most clusters per predicted label.")
    max_sentences: int = Field(2, ge=1, le=5, description="Most sentences per caption after the class prompt.")
    min_cluster_size: int = Field(3, ge=1, description="Smaller clusters are dropped as noise.")


class Hypothesis(BaseModel):
    caption: str = Field(description="Class prompt plus the selected sentences: a hypothesis to measure.")
    predicted_label: str = Field(description="What the classifier said for these images.")
    n_images: int
    sentences: list[str]
    mean_loglik: list[float] = Field(description="Mean log-likelihood of each selected sentence over the cluster.")
    images: list[str] = Field(description="Refs of up to 6 member images.")


class Result(BaseModel):
    measurement_id: str
    n_failures: int
    hypotheses: list[Hypothesis] = Field(description="Largest clusters first.")


def cluster(features: np.ndarray, max_clusters: int, seed: int = 0) -> np.ndarray:
    """k-means with k growing with the group size (about one cluster per 8 images), seeded."""
    n = len(features)
    k = max(1, min(max_clusters, math.ceil(n / 8)))
    if k == 1:
        return np.zeros(n, dtype=int)
    _, assign = kmeans2(features.astype(np.float64), k, minit="++", seed=seed)
    return assign


def select_sentences(candidates: list[str], scores: np.ndarray, max_sentences: int) -> list[int]:
    """Greedy selection: best mean log-likelihood first, skipping sentences that repeat a chosen one."""
    chosen: list[int] = []
    seen: set[str] = set()
    for i in np.argsort(-scores, kind="stable"):
        key = normalise_caption(candidates[i])
        if key in seen:
            continue
        chosen.append(int(i))
        seen.add(key)
        if len(chosen) == max_sentences:
            break
    return chosen


def summary(r: Result) -> str:
    hyps = "; ".join(f"{quote(h.caption)} ({h.n_images} images, predicted {h.predicted_label})"
                     for h in r.hypotheses[:5])
    return f"{r.measurement_id}: {r.n_failures} failures captioned; hypotheses: {hyps or 'none'}"


def render(r: Result) -> list[Line]:
    lines: list[Line] = [[(f"{len(r.hypotheses)} hypotheses from {r.n_failures} failures of {r.measurement_id}",
                           "bold")]]
    for h in r.hypotheses[:MAX_ITEMS]:
        lines.append([(f"• {cut(h.caption, 90)} ", ""), (f"({h.n_images} images, predicted {h.predicted_label})",
                                                         "dim")])
    if len(r.hypotheses) > MAX_ITEMS:
        lines.append([(f"… +{len(r.hypotheses) - MAX_ITEMS}", "dim")])
    return lines


def run(args: Args, ctx: ToolContext) -> Result:
    inv = investigation(ctx)
    m = inv.measurement(args.measurement_id)
    s = m.sample
    idx = [i for i in range(len(s.seeds)) if s.failed[i] and s.valid[i]]
    if not idx:
        raise ToolError(f"measurement {m.id} has no failures to caption ({s.k}/{s.n})")
    backends = inv.backends
    class_prompt = inv.class_prompt
    hypotheses: list[Hypothesis] = []
    by_label: dict[str, list[int]] = {}
    for i in idx:
        by_label.setdefault(s.labels[i], []).append(i)
    for label, members in sorted(by_label.items(), key=lambda kv: -len(kv[1])):
        images = [g.image for g in s.images(members)]
        feats = np.asarray(backends.embedder.embed(images))
        assign = cluster(feats, args.max_clusters)
        captions = backends.captioner.captions(images, class_prompt)
        for c in np.unique(assign):
            local = [j for j in range(len(members)) if assign[j] == c]
            if len(local) < args.min_cluster_size:
                continue
            pool: list[str] = []
            for j in local:
                for sent in captions[j]:
                    if normalise_caption(sent) not in {normalise_caption(p) for p in pool}:
                        pool.append(sent)
            if not pool:
                continue
            cl_images = [images[j] for j in local]
            scores = np.array([float(np.mean(backends.captioner.sentence_loglik(cl_images, sent, class_prompt)))
                               for sent in pool])
            chosen = select_sentences(pool, scores, args.max_sentences)
            sentences = [pool[i].strip().rstrip(".") for i in chosen]
            refs = [m.image_refs[members[j]] for j in local]
            hypotheses.append(Hypothesis(
                caption=join_sentences([class_prompt, *sentences]),
                predicted_label=label,
                n_images=len(local),
                sentences=sentences,
                mean_loglik=[float(scores[i]) for i in chosen],
                images=[r for r in refs if r][:6],
            ))
    hypotheses.sort(key=lambda h: -h.n_images)
    inv.propose(h.caption for h in hypotheses)
    return Result(measurement_id=m.id, n_failures=len(idx), hypotheses=hypotheses)
