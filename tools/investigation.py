"""The state one investigation's tools share: backends, seeds, cached predictions, the hypothesis family.

Tools read and extend this state; the agent owns its lifetime. Nothing here prints or plans.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from sleuth.tools import stats
from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.backends.base import Backends, Generation, LabelSpace
from sleuth.tools.backends.criteria import failed as failed_by_criterion
from sleuth.tools.cache import Prediction, PredictionCache
from sleuth.tools.defaults import ALPHA, BUDGET, BUDGET_EXHAUSTED, CONFIRMATION_DRAWS, MAX_CONFIRMATIONS
from sleuth.tools.designs import ConfirmationDesign, Spending
from sleuth.tools.findings import Finding
from sleuth.tools.registry import ToolError

Criterion = Literal["top1", "topk", "parent"]
Purpose = Literal["discovery", "confirmation"]

# Seed spaces: discovery and confirmation draw from disjoint ranges, so no image is ever used for both; each
# investigation seed owns 2**24 seeds of each range. Confirmation seeds come in draws: draw d of every investigation
# seed lies in [2**40 (1 + d), 2**40 (2 + d)), so a re-audit with the same seed can confirm on images no earlier run
# saw (agent/session.py claims the draws); the 255 draws end below the mitigation's seeds (2**48).
CONFIRMATION_OFFSET = 1 << 40
SEEDS_PER_INVESTIGATION = 1 << 24

MAX_IMAGES_PER_CALL = 5000


@dataclass
class Budget:
    images: int = BUDGET
    used: int = 0
    editing: int = 0
    """Of ``used``: images' worth charged for counterfactual editing (inversions and edits, at the editor's declared
    cost, see ``tools.counterfactual``)."""

    @property
    def left(self) -> int:
        return max(0, self.images - self.used)

    def spend(self, n: int) -> None:
        if n > self.left:
            raise ToolError(f"{BUDGET_EXHAUSTED}: {n} images asked, {self.left} of {self.images} left")
        self.used += n

    def spend_editing(self, n: int) -> None:
        if n > self.left:
            raise ToolError(f"{BUDGET_EXHAUSTED}: editing costs {n} images' worth, {self.left} of {self.images} "
                            "left")
        self.used += n
        self.editing += n


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
    generations: list[Generation | None]
    """Images that were generated in this process; None where the prediction came from the cache."""
    generator: Any = field(default=None, repr=False)

    def images(self, indices: Sequence[int], batch: int = 64) -> list[Generation]:
        """The generations at ``indices``, generating again (same prompt and seed) those not held in memory."""
        missing = [i for i in indices if self.generations[i] is None]
        for start in range(0, len(missing), batch):
            chunk = missing[start:start + batch]
            out = self.generator.generate([self.prompt] * len(chunk), [self.seeds[i] for i in chunk])
            for i, g in zip(chunk, out):
                self.generations[i] = g
        return [self.generations[i] for i in indices]  # type: ignore[misc]

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
    design: tuple[int, int] | None = None
    """A confirmation attempt's (first look, most images), as fixed before the confirmation baseline was drawn."""
    effect: stats.RatioCI | None = None
    """A supported confirmation's rate ratio corrected for its selection and early stop (stats.selection)."""
    bound: float | None = None
    """A supported confirmation's headline: the least rate ratio its own test still rejects (stats.bound), >= 1."""


@dataclass
class Investigation:
    """Everything the tools of one investigation share."""

    backends: Backends
    label: str
    criterion: Criterion = "top1"
    top_k: int = 3
    alpha: float = ALPHA
    adjust_method: str = "holm"
    max_confirmations: int = MAX_CONFIRMATIONS
    """The declared size of the confirmation family: every confirmation attempt spends one of these, and each is
    tested at alpha / max_confirmations (Bonferroni over the declared family, valid for any sequence of calls; see
    tools/stats/__init__.py). Its adjusted p-values are final when printed."""
    confirmation_designs: list[ConfirmationDesign] | None = None
    """The declared confirmation designs, each with its share of the family's attempts (their sum is
    ``max_confirmations``). None: the first confirmation attempt declares its sizes for all ``max_confirmations``
    attempts, before it draws the confirmation baseline. Either way no attempt's sizes can depend on that baseline."""
    legacy_confirmations: bool = False
    """Replays of runs recorded before designs were fixed: any sizes per attempt, as those runs had them."""
    family: str | None = None
    """The transcript this investigation belongs to (the hash of its first line, which forks copy and resumes keep).
    With it, every run of that transcript (forks, resumes, re-runs of its calls) counts its confirmation attempts
    in one ledger beside the prediction cache, against one declared family: they share the confirmation baseline
    and seeds, so one family bounds them all. None: this investigation's own attempts only."""
    budget: Budget = field(default_factory=Budget)
    artifacts: ArtifactStore | None = None
    store_successes: int = 4
    progress: Callable[[str, int, int], None] | None = None
    """Called as (task, done, total) during long work; the terminal UI draws bars from it."""
    seed: int = 0
    """Investigation seed: selects this investigation's block of image seeds."""
    draw: int = 0
    """Confirmation draw: which block of the seed's confirmation seeds this investigation confirms on."""
    cache: PredictionCache | None = None
    """Predictions by (backend ids, prompt, seed); None: a private in-memory cache."""
    _next_seed: dict[str, int] = field(default_factory=dict)
    measurements: dict[str, Measurement] = field(default_factory=dict)
    generations: dict[str, Generation] = field(default_factory=dict)
    tests: list[Test] = field(default_factory=list)
    baselines: dict[str, Sample] = field(default_factory=dict)
    screened: dict[str, Sample] = field(default_factory=dict)
    """Discovery images of each caption generate_and_classify made, pooled by normalised caption: where a screen of
    the caption starts."""
    proposed: dict[str, str] = field(default_factory=dict)
    """Captions caption_failures and perturb_caption proposed, by normalised caption, in order."""
    screen_taken: dict[float, set[str]] = field(default_factory=dict)
    """Normalised captions a screen (generate_and_classify with prompts) has decided, by the effect it screened for
    (singled out for a test, dropped, or unrendered; not one it left open)."""
    findings: list[Finding] = field(default_factory=list)
    _declared_by_first_attempt: bool = False

    def __post_init__(self) -> None:
        labels = self.backends.classifier.labels
        if self.label not in labels.labels:
            raise ToolError(labels.unknown_message(self.label))
        if not 0 <= self.seed < (1 << 16):
            raise ToolError(f"investigation seed must be in [0, 65535], got {self.seed}")
        if not 0 <= self.draw < CONFIRMATION_DRAWS:
            raise ToolError(f"confirmation draw must be in [0, {CONFIRMATION_DRAWS - 1}], got {self.draw}")
        self._next_seed = dict(self.seed_bases())
        if self.confirmation_designs is not None:
            if not self.confirmation_designs or len({d.key for d in self.confirmation_designs}) != \
                    len(self.confirmation_designs):
                raise ToolError("confirmation designs must be given, each sizes once")
            self.max_confirmations = sum(d.attempts for d in self.confirmation_designs)
        if self.cache is None:
            self.cache = PredictionCache()

    def propose(self, captions: Iterable[str]) -> None:
        """Keeps captions a tool proposed, for a screen of everything proposed (generate_and_classify)."""
        for c in captions:
            self.proposed.setdefault(normalise_caption(c), c)

    def seed_bases(self) -> dict[str, int]:
        start = self.seed * SEEDS_PER_INVESTIGATION
        return {"discovery": start, "confirmation": CONFIRMATION_OFFSET * (1 + self.draw) + start}

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
        gen, clf = self.backends.generator, self.backends.classifier
        cacheable = getattr(gen, "cacheable", True) and getattr(clf, "cacheable", True)
        n_labels = len(self.labels.labels)
        gens: list[Generation | None] = [None] * n
        preds: list[Prediction | None] = [None] * n
        if cacheable:
            assert self.cache is not None
            preds = self.cache.get_many(gen.id, clf.id, prompt, seeds)
        todo = [i for i, p in enumerate(preds) if p is None]
        done = n - len(todo)
        for start in range(0, len(todo), batch):
            chunk = todo[start:start + batch]
            out = gen.generate([prompt] * len(chunk), [seeds[i] for i in chunk])
            logits = np.asarray(clf.logits([g.image for g in out]))
            fresh: list[tuple[int, Prediction]] = []
            for i, g, row in zip(chunk, out, logits):
                gens[i] = g
                pred = Prediction.from_logits(row, g.valid, g.unrendered)
                preds[i] = pred
                fresh.append((seeds[i], pred))
            if cacheable:
                assert self.cache is not None
                self.cache.put_many(gen.id, clf.id, prompt, fresh)
            done += len(chunk)
            if self.progress is not None:
                self.progress(task, done, n)
        got = [p for p in preds if p is not None]
        assert len(got) == n, "every seed has a prediction by now"
        rows = np.stack([p.logits(n_labels) for p in got])
        bad = failed_by_criterion(rows, self.label, self.labels, self.criterion, k=self.top_k)
        k = max(self.top_k, 1)
        topk = [[self.labels.labels[j] for j in p.indices[:k]] for p in got]
        labels = [t[0] for t in topk]
        valid = np.array([p.valid for p in got], dtype=bool)
        failed = bad.astype(bool) & valid
        unrendered: list[str] = []
        for p in got:
            for w in p.unrendered:
                if w not in unrendered:
                    unrendered.append(w)
        hits = np.array([lab == target_label for lab in labels], dtype=bool) if target_label else np.zeros(n, bool)
        return Sample(prompt, seeds, labels, topk, failed, valid, hits & valid, unrendered, gens, gen)

    def store(self, sample: Sample) -> Measurement:
        """Keep a sample under a new id; failures (and a few successes) go to the artifact store."""
        mid = f"m{len(self.measurements) + 1}"
        keep: list[int] = []
        kept_ok = 0
        for i, bad in enumerate(sample.failed):
            if bad or kept_ok < self.store_successes:
                keep.append(i)
                kept_ok += not bad
        refs: list[str | None] = [None] * len(sample.seeds)
        for i, g in zip(keep, sample.images(keep)):
            refs[i] = self.put_image(g)
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
        # The confirmation baseline is drawn once, at the size first asked: topping it up after its rate has been
        # seen would let a planner stop it where it looks low (optional stopping), and every attempt compares to it.
        if have is not None and (have.n >= n_min or purpose == "confirmation"):
            return have
        more = n_min - (have.n if have else 0)
        fresh = self.sample(self.class_prompt, more, purpose=purpose, task=f"baseline ({purpose})")
        merged = fresh if have is None else merge(have, fresh)
        self.baselines[purpose] = merged
        return merged

    def confirmation_baseline(self, design: ConfirmationDesign, n_min: int) -> Sample:
        """The confirmation baseline an attempt of ``design`` compares with.

        A design that declares its baseline size compares with the first ``design.baseline_n`` images of the
        confirmation baseline, drawn up to that size when first needed: every size is fixed before any of it is
        drawn, so an attempt's baseline is a fixed-size sample whatever the planner has seen when it draws more
        (tools/stats/__init__.py). Without it, the baseline is drawn once at the size first asked (``n_min``)."""
        if design.baseline_n is None:
            return self.baseline("confirmation", n_min)
        want = design.baseline_n
        have = self.baselines.get("confirmation")
        drawn = len(have.seeds) if have is not None else 0
        if drawn < want:
            fresh = self.sample(self.class_prompt, want - drawn, purpose="confirmation", task="baseline (confirmation)")
            have = fresh if have is None else merge(have, fresh)
            self.baselines["confirmation"] = have
        assert have is not None
        return prefix(have, want)

    def add_test(self, test: Test) -> Test:
        self.tests.append(test)
        self.readjust()
        return test

    def readjust(self) -> None:
        """Recompute adjusted p-values: the discovery family (a screen) by Holm over the tests so far; every
        confirmation by Bonferroni over the declared confirmation family, which never changes afterwards."""
        discovery = [t for t in self.tests if t.purpose == "discovery"]
        if discovery:
            adjusted = stats.adjust_pvalues([t.p_value for t in discovery], method=self.adjust_method)
            for t, a in zip(discovery, adjusted):
                t.adjusted_p = float(a)
        for t in self.tests:
            if t.purpose == "confirmation":
                t.adjusted_p = min(1.0, t.p_value * self.max_confirmations)

    @property
    def confirmations_used(self) -> int:
        """Confirmation attempts made (sample tests on confirmation seeds; counterfactual tests confirm nothing)."""
        return sum(t.purpose == "confirmation" and t.kind == "rate" for t in self.tests)

    def confirmation_alpha(self) -> float:
        """The level each confirmation attempt is tested at, or a ToolError once the declared family is spent."""
        if self.confirmations_used >= self.max_confirmations:
            raise ToolError(f"the investigation's {self.max_confirmations} confirmation attempts are spent (each "
                            f"is tested at alpha/{self.max_confirmations}, so that any sequence of attempts keeps "
                            "the family-wise error at alpha); record what is confirmed, then finish")
        return self.alpha / self.max_confirmations

    def confirmation_design(self, first_n: int, max_n: int, *, caption: str = "", baseline_n: int = 0,
                            designs: Sequence[ConfirmationDesign] | None = None,
                            spending: Spending = "obrien-fleming") -> ConfirmationDesign:
        """The declared design an attempt of these sizes uses, or a ToolError naming the designs left.

        Called before the attempt draws anything. Without declared designs, the first attempt declares its sizes
        for the whole family: it is made before the confirmation baseline is drawn (that attempt draws it). With a
        ``family``, the attempt is also entered in the ledger its forks share (``caption`` and ``baseline_n`` name
        it: the same call in the same state draws the same images, so a re-run of it is not another attempt).
        ``designs``: the family's sizes, declared by the first attempt (before it draws the baseline); without them
        the first attempt's sizes and ``spending`` serve every attempt."""
        self.confirmation_alpha()
        key = (min(first_n, max_n), max_n)
        if self.legacy_confirmations:
            return ConfirmationDesign(first_n=key[0], max_n=max_n, attempts=self.max_confirmations)
        if designs is not None:
            designs = list(designs)
            if self.confirmation_designs is not None and designs != self.confirmation_designs:
                raise ToolError("the confirmation sizes were declared already (they are fixed before the "
                                "confirmation baseline is drawn): "
                                + "; ".join(d.text() + f" ({d.attempts} attempts)" for d in self.confirmation_designs))
            if sum(d.attempts for d in designs) != self.max_confirmations or \
                    len({d.key for d in designs}) != len(designs):
                raise ToolError(f"declared sizes must share out the {self.max_confirmations} declared confirmation "
                                "attempts, each sizes once")
            if len({d.baseline_n is None for d in designs}) > 1:
                raise ToolError("declared sizes either all give their baseline_n or none does (a design without "
                                "it would compare with however much of the baseline the run had drawn)")
            if self.confirmation_designs is None:
                self.confirmation_designs = designs
                self._declared_by_first_attempt = True
        if self.confirmation_designs is None:
            self.confirmation_designs = [ConfirmationDesign(first_n=key[0], max_n=max_n,
                                                            attempts=self.max_confirmations, spending=spending)]
            self._declared_by_first_attempt = True
        ledger = self._ledger_key()
        used: dict[tuple[int, int], int]
        if ledger is None:
            used = {d.key: self.design_attempts(d.key) for d in self.confirmation_designs}
            attempt = None
        else:
            self._adopt_family(ledger)
            assert self.cache is not None
            if "confirmation" not in self.baselines and all(d.baseline_n is None for d in self.confirmation_designs):
                # Designs without a baseline size compare with the baseline as first drawn: its size stands for
                # every fork, fixed before any branch has seen its count (a fork that chose it after reading
                # another branch's would stop the baseline where it looks low).
                stands = int(self.cache.declare_family(f"{ledger}:baseline", str(baseline_n)))
                if stands != baseline_n:
                    raise ToolError(f"this transcript's forks compare confirmations with a confirmation baseline of "
                                    f"{stands} images, its size fixed before any branch drew it; a fork uses the "
                                    f"same (baseline_n={stands})")
            done = self.cache.family_attempts(ledger)
            have = self.baselines.get("confirmation")
            if any(d.baseline_n is not None for d in self.confirmation_designs):
                drawn = f"drawn {len(have.seeds) if have is not None else 0}"
            else:
                drawn = "drawn" if have is not None else f"baseline {baseline_n}"
            # Keyed by the text the generator receives: a caption re-typed in another case or spacing draws other
            # images from a case-sensitive text encoder, so it is another attempt.
            attempt = f"{caption}|{self._next_seed['confirmation']}|{drawn}|{key[0]},{key[1]}"
            if attempt in done:  # this very attempt, made before by this transcript or a fork of it
                return next(d for d in self.confirmation_designs if d.key == key)
            used = {d.key: sum(a.rsplit("|", 1)[-1] == f"{d.key[0]},{d.key[1]}" for a in done)
                    for d in self.confirmation_designs}
            if len(done) >= self.max_confirmations:
                raise ToolError(f"the {self.max_confirmations} confirmation attempts of this transcript and its "
                                "forks are spent (they share one confirmation baseline, so one declared family); "
                                "record what is confirmed, then finish")
        left = {d.key: d.attempts - used[d.key] for d in self.confirmation_designs}
        offer = "; ".join(f"first_n={k[0]}, max_n={k[1]} ({n} left)" for k, n in left.items() if n > 0)
        for d in self.confirmation_designs:
            if d.key == key:
                if left[key] <= 0:
                    raise ToolError(f"the {d.attempts} confirmation attempts declared with first_n={key[0]}, "
                                    f"max_n={max_n} are spent; attempts left: {offer or 'none'}")
                if attempt is not None:
                    assert self.cache is not None and ledger is not None
                    self.cache.add_attempt(ledger, attempt)
                return d
        raise ToolError(f"a confirmation's sizes are fixed before the confirmation baseline is drawn (so that no "
                        f"attempt's sizes can follow that baseline's count); first_n={key[0]}, max_n={max_n} is not "
                        f"a declared design; attempts left: {offer or 'none'}")

    def _ledger_key(self) -> str | None:
        if self.family is None or self.legacy_confirmations:
            return None
        ids = (self.family, self.backends.generator.id, self.backends.classifier.id, self.label, self.criterion,
               str(self.top_k), str(self.seed), str(self.alpha))
        return hashlib.sha256("\x1f".join(ids).encode()).hexdigest()[:32]

    def _adopt_family(self, ledger: str) -> None:
        """The family the transcript declared first stands for every fork of it."""
        assert self.cache is not None and self.confirmation_designs is not None
        mine = json.dumps({"attempts": self.max_confirmations,
                           "designs": [d.model_dump() for d in self.confirmation_designs]}, sort_keys=True)
        stands = self.cache.declare_family(ledger, mine)
        if stands == mine:
            return
        theirs = json.loads(stands)
        if not self._declared_by_first_attempt or theirs["attempts"] != self.max_confirmations:
            raise ToolError("another run of this transcript declared other confirmation attempts "
                            f"({stands}); a fork keeps its source's family")
        # An earlier branch's first attempt fixed the sizes, before the baseline this branch shares was drawn.
        self.confirmation_designs = [ConfirmationDesign(**d) for d in theirs["designs"]]

    def design_attempts(self, key: tuple[int, int]) -> int:
        return sum(t.purpose == "confirmation" and t.kind == "rate" and t.design == key for t in self.tests)

    def test(self, tid: str) -> Test:
        for t in self.tests:
            if t.id == tid:
                return t
        raise ToolError(f"unknown test {tid!r} (known: {', '.join(t.id for t in self.tests) or 'none yet'})")


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
        a.generator if a.generator is not None else b.generator,
    )


def prefix(a: Sample, n: int) -> Sample:
    """The first ``n`` images of ``a``, in the order they were drawn."""
    if n >= len(a.seeds):
        return a
    return Sample(a.prompt, a.seeds[:n], a.labels[:n], a.topk[:n], a.failed[:n], a.valid[:n], a.target_hits[:n],
                  a.unrendered, a.generations[:n], a.generator)


def normalise_caption(caption: str) -> str:
    return " ".join(caption.lower().replace(".", " . ").split())


def split_sentences(caption: str) -> list[str]:
    return [s.strip() for s in caption.split(".") if s.strip()]


def join_sentences(sentences: Sequence[str]) -> str:
    return ". ".join(s.strip().rstrip(".") for s in sentences if s.strip()) + "."
