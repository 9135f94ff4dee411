"""The state one investigation's tools share: backends, seeds, cached predictions, the hypothesis family.

Tools read and extend this state; the agent owns its lifetime. Nothing here prints or plans.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from tools import stats
from tools.artifacts import ArtifactStore
from tools.backends.base import Backends, Generation, LabelSpace
from tools.backends.criteria import failed as failed_by_criterion
from tools.registry import ToolError

Criterion = Literal["top1", "topk", "parent"]
Purpose = Literal["discovery", "confirmation"]

# Seed spaces: discovery and confirmation draw from disjoint ranges, so no image is ever used for both; each
# investigation seed owns 2**24 seeds of each range.
CONFIRMATION_OFFSET = 1 << 40
SEEDS_PER_INVESTIGATION = 1 << 24

MAX_IMAGES_PER_CALL = 5000


@dataclass
class Budget:
    images: int = 20_000
    used: int = 0

    @property
    def left(self) -> int:
        return max(0, self.images - self.used)

    def spend(self, n: int) -> None:
        if n > self.left:
            raise ToolError(f"image budget exhausted: {n} images asked, {self.left} of {self.images} left")
        self.used += n


@dataclass
class Sample:
    """Images of one prompt on a run of seeds, with what the classifier made of them."""

    prompt: str
    seeds: list[int]
    labels: list[str]
    """Top-1 prediction per image."""
    topk: list[list[str]]
    failed: np.ndarray
    valid: np.ndarray
    target_hits: np.ndarray
    unrendered: list[str]
    generations: list[Generation]

    @property
    def n(self) -> int:
        return int(self.valid.sum())

    @property
    def k(self) -> int:
        return int((self.failed & self.valid).sum())

    def confusions(self, top: int = 5) -> list[tuple[str, int]]:
        counts: dict[str, int] = {}
        for label, bad, ok in zip(self.labels, self.failed, self.valid):
            if bad and ok:
                counts[label] = counts.get(label, 0) + 1
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]


@dataclass
class Measurement:
    """A stored sample the planner can refer to by id (e.g. to caption its failures)."""

    id: str
    sample: Sample
    image_refs: list[str | None]
    """Artifact ref per image; only failures and a few successes are stored, the rest re-render from seeds."""


@dataclass
class Test:
    """One hypothesis test in the investigation's family."""

    id: str
    caption: str
    purpose: Purpose
    p_value: float
    k1: int
    n1: int
    k0: int
    n0: int
    kind: str = "rate"
    adjusted_p: float = float("nan")
    verdict: str = ""


@dataclass
class Investigation:
    """Everything the tools of one investigation share."""

    backends: Backends
    label: str
    criterion: Criterion = "top1"
    top_k: int = 3
    alpha: float = 0.05
    adjust_method: str = "holm"
    budget: Budget = field(default_factory=Budget)
    artifacts: ArtifactStore | None = None
    store_successes: int = 4
    progress: Callable[[str, int, int], None] | None = None
    """Called as (task, done, total) during long work; the terminal UI draws bars from it."""
    seed: int = 0
    """Investigation seed: selects this investigation's block of image seeds."""
    _next_seed: dict[str, int] = field(default_factory=dict)
    measurements: dict[str, Measurement] = field(default_factory=dict)
    generations: dict[str, Generation] = field(default_factory=dict)
    tests: list[Test] = field(default_factory=list)
    baselines: dict[str, Sample] = field(default_factory=dict)
    findings: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        labels = self.backends.classifier.labels
        if self.label not in labels.labels:
            raise ToolError(labels.unknown_message(self.label))
        if not 0 <= self.seed < (1 << 16):
            raise ToolError(f"investigation seed must be in [0, 65535], got {self.seed}")
        self._next_seed = dict(self.seed_bases())

    def seed_bases(self) -> dict[str, int]:
        start = self.seed * SEEDS_PER_INVESTIGATION
        return {"discovery": start, "confirmation": CONFIRMATION_OFFSET + start}

    @property
    def labels(self) -> LabelSpace:
        return self.backends.classifier.labels

    @property
    def class_prompt(self) -> str:
        return self.backends.prompt_for(self.label)

    def allocate_seeds(self, n: int, purpose: Purpose = "discovery") -> list[int]:
        start = self._next_seed[purpose]
        if start + n > self.seed_bases()[purpose] + SEEDS_PER_INVESTIGATION:
            raise ToolError(f"this investigation has used all its {purpose} seeds")
        self._next_seed[purpose] = start + n
        return list(range(start, start + n))

    # -- sampling ---------------------------------------------------------------------------------------

    def sample(self, prompt: str, n: int, *, purpose: Purpose = "discovery", target_label: str | None = None,
               batch: int = 256, task: str = "generating") -> Sample:
        """Generate and classify ``n`` images of ``prompt`` on fresh seeds of ``purpose``."""
        if n <= 0 or n > MAX_IMAGES_PER_CALL:
            raise ToolError(f"n must be between 1 and {MAX_IMAGES_PER_CALL}, got {n}")
        if target_label is not None and target_label not in self.labels.labels:
            raise ToolError(self.labels.unknown_message(target_label))
        self.budget.spend(n)
        seeds = self.allocate_seeds(n, purpose)
        gens: list[Generation] = []
        labels: list[str] = []
        topk: list[list[str]] = []
        failed = np.zeros(n, dtype=bool)
        valid = np.ones(n, dtype=bool)
        unrendered: list[str] = []
        for start in range(0, n, batch):
            chunk = seeds[start:start + batch]
            out = self.backends.generator.generate([prompt] * len(chunk), chunk)
            gens.extend(out)
            for g in out:
                for w in g.unrendered:
                    if w not in unrendered:
                        unrendered.append(w)
            images = [g.image for g in out]
            logits = np.asarray(self.backends.classifier.logits(images))
            order = np.argsort(-logits, axis=1)[:, : max(self.top_k, 1)]
            bad = failed_by_criterion(logits, self.label, self.labels, self.criterion, k=self.top_k)
            for i, g in enumerate(out):
                names = [self.labels.labels[j] for j in order[i]]
                idx = start + i
                labels.append(names[0])
                topk.append(names)
                failed[idx] = bool(bad[i]) and g.valid
                valid[idx] = g.valid
            if self.progress is not None:
                self.progress(task, min(start + batch, n), n)
        hits = np.array([lab == target_label for lab in labels], dtype=bool) if target_label else np.zeros(n, bool)
        return Sample(prompt, seeds, labels, topk, failed, valid, hits & valid, unrendered, gens)

    def store(self, sample: Sample) -> Measurement:
        """Keep a sample under a new id; failures (and a few successes) go to the artifact store."""
        mid = f"m{len(self.measurements) + 1}"
        refs: list[str | None] = []
        kept_ok = 0
        for g, bad in zip(sample.generations, sample.failed):
            keep = bool(bad) or kept_ok < self.store_successes
            if not bad:
                kept_ok += keep
            ref = self.put_image(g) if keep else None
            refs.append(ref)
        m = Measurement(mid, sample, refs)
        self.measurements[mid] = m
        return m

    def put_image(self, g: Generation) -> str:
        if self.artifacts is None:
            ref = f"mem:{len(self.generations)}"
        else:
            ref = self.artifacts.put_image(g.image)
        self.generations[ref] = g
        return ref

    def generation(self, ref: str) -> Generation:
        try:
            return self.generations[ref]
        except KeyError:
            raise ToolError(f"unknown image {ref!r}: use an image ref returned by an earlier tool") from None

    def measurement(self, mid: str) -> Measurement:
        try:
            return self.measurements[mid]
        except KeyError:
            known = ", ".join(self.measurements) or "none yet"
            raise ToolError(f"unknown measurement {mid!r} (known: {known})") from None

    # -- the baseline and the family ---------------------------------------------------------------------

    def baseline(self, purpose: Purpose, n_min: int) -> Sample:
        """The class prompt's failure rate on seeds of ``purpose``, topped up to at least ``n_min`` images."""
        have = self.baselines.get(purpose)
        if have is not None and have.n >= n_min:
            return have
        more = n_min - (have.n if have else 0)
        fresh = self.sample(self.class_prompt, more, purpose=purpose, task=f"baseline ({purpose})")
        merged = fresh if have is None else merge(have, fresh)
        self.baselines[purpose] = merged
        return merged

    def add_test(self, test: Test) -> Test:
        self.tests.append(test)
        self.readjust()
        return test

    def readjust(self) -> None:
        """Recompute adjusted p-values, separately for the discovery and the confirmation family."""
        for purpose in ("discovery", "confirmation"):
            family = [t for t in self.tests if t.purpose == purpose]
            if not family:
                continue
            adjusted = stats.adjust_pvalues([t.p_value for t in family], method=self.adjust_method)
            for t, a in zip(family, adjusted):
                t.adjusted_p = float(a)

    def test(self, tid: str) -> Test:
        for t in self.tests:
            if t.id == tid:
                return t
        raise ToolError(f"unknown test {tid!r} (known: {', '.join(t.id for t in self.tests) or 'none yet'})")

    def tests_of(self, caption: str, purpose: Purpose) -> list[Test]:
        key = normalise_caption(caption)
        return [t for t in self.tests if t.purpose == purpose and normalise_caption(t.caption) == key]


def merge(a: Sample, b: Sample) -> Sample:
    return Sample(
        a.prompt,
        a.seeds + b.seeds,
        a.labels + b.labels,
        a.topk + b.topk,
        np.concatenate([a.failed, b.failed]),
        np.concatenate([a.valid, b.valid]),
        np.concatenate([a.target_hits, b.target_hits]),
        a.unrendered + [w for w in b.unrendered if w not in a.unrendered],
        a.generations + b.generations,
    )


def normalise_caption(caption: str) -> str:
    return " ".join(caption.lower().replace(".", " . ").split())


def split_sentences(caption: str) -> list[str]:
    return [s.strip() for s in caption.split(".") if s.strip()]


def join_sentences(sentences: Sequence[str]) -> str:
    return ". ".join(s.strip().rstrip(".") for s in sentences if s.strip()) + "."
