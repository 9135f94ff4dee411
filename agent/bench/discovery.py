"""The planted-bug benchmark: investigations over a world's classes, scored against toyworld's oracle.

A finding *finds* a planted bug when its caption names the bug's attribute (read with the world's own parser, so "the
background is white" names snow as well as "in the snow") and the oracle confirms the effect. A confirmed finding is
*false* when the oracle, measuring the caption against the class baseline on ``oracle_n`` fresh images each, finds no
significant increase (one-sided exact test at 0.05). Calibration runs investigations against a null classifier,
whose errors do not depend on the image: any confirmed finding there is false, so the share of runs with one
estimates the procedure's family-wise error rate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sleuth.agent.config import PlannerConfig, RunConfig
from sleuth.agent.planners import OFFLINE_PLANNERS as PLANNERS
from sleuth.agent.session import Session
from sleuth.tools import stats
from sleuth.tools.backends.base import Backends
from sleuth.tools.backends.toyworld import CLASS_PROMPT, Oracle, load_backends
from sleuth.tools.backends.toyworld.config import World
from sleuth.tools.backends.toyworld.null import NullClassifier
from sleuth.tools.backends.toyworld.parser import parse
from sleuth.tools.cache import PredictionCache
from sleuth.tools.defaults import ALPHA, BASELINE_N, BUDGET
from sleuth.tools.findings import FindingSummary

ORACLE_SEED = 1 << 50
"""The oracle's seeds lie beyond every investigation's discovery and confirmation seeds."""

Progress = Callable[[str, int, int], None]


def _json_number(x: float | str | None) -> float | None:
    """Strict JSON has no infinity or nan: those become null."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


@dataclass
class RunRecord:
    planner: str
    label: str
    seed: int
    status: str
    images: int
    seconds: float
    transcript: str
    findings: list[dict[str, Any]] = field(default_factory=list)
    """Confirmed findings: caption, rate_ratio, and (after judging) oracle verdict and the bug it names."""


def run_investigation(backends: Backends, label: str, seed: int, planner: str, *, budget: int, baseline_n: int,
                      run_dir: Path, criterion: str = "top1", alpha: float = ALPHA) -> RunRecord:
    """One investigation with its own in-memory prediction cache, so planners are timed on equal terms."""
    config = RunConfig.model_validate({"class": label, "seed": seed, "budget": budget, "criterion": criterion,
                                       "alpha": alpha, "planner": PlannerConfig(name=planner, baseline_n=baseline_n)})
    session = Session(backends=backends, config=config, run_dir=run_dir, cache=PredictionCache())
    t0 = time.perf_counter()
    result = session.run(session.planner())
    seconds = time.perf_counter() - t0
    inv = session.investigation
    findings = [FindingSummary.of(label, f).model_dump(mode="json") for f in inv.findings if f.confirmed]
    return RunRecord(planner, label, seed, result.status, inv.budget.used, round(seconds, 2),
                     str(session.transcript), findings)


class OracleJudge:
    """Oracle verdicts on captions, cached: each (class, caption) is measured once on ``n`` fresh images."""

    def __init__(self, oracle: Oracle, n: int = 10_000, criterion: str = "top1") -> None:
        self.oracle = oracle
        self.n = n
        self.criterion = criterion
        self._base: dict[str, tuple[int, int]] = {}
        self._cache: dict[tuple[str, str], dict[str, Any]] = {}

    def baseline(self, label: str) -> tuple[int, int]:
        if label not in self._base:
            prompt = CLASS_PROMPT.format(label=label)
            self._base[label] = self.oracle.failure_rate(prompt, label, self.n, ORACLE_SEED, self.criterion)
        return self._base[label]

    def judge(self, label: str, caption: str) -> dict[str, Any]:
        key = (label, " ".join(caption.lower().split()))
        if key not in self._cache:
            k0, n0 = self.baseline(label)
            k1, n1 = self.oracle.failure_rate(caption, label, self.n, ORACLE_SEED, self.criterion)
            cmp = stats.compare_rates(k1, n1, k0, n0)
            self._cache[key] = {"k": k1, "n": n1, "baseline_k": k0, "baseline_n": n0,
                                "ratio": _json_number(stats.rate_ratio(k1, n1, k0, n0).ratio),
                                "p_value": cmp.p_value,
                                "real": bool(cmp.p_value <= 0.05 and k1 / n1 > k0 / n0)}
        return self._cache[key]


def names_bug(caption: str, bug: Any, world: World) -> bool:
    """Does ``caption`` ask for the bug's attribute values (as the world's parser reads it)?"""
    constraints = parse(caption, world).scene_constraints
    return all(value in constraints.get(attr, []) for attr, value in bug.attributes.items())


def judge_runs(records: Sequence[RunRecord], oracle: Oracle, judge: OracleJudge,
               progress: Progress | None = None) -> None:
    """Annotate each confirmed finding with the oracle's verdict and the planted bug it names (if any)."""
    bugs = oracle.bugs()
    todo = [(r, f) for r in records for f in r.findings]
    for i, (r, f) in enumerate(todo):
        f["oracle"] = judge.judge(r.label, f["caption"])
        named = [b.name for b in bugs if b.class_ == r.label and names_bug(f["caption"], b, oracle.world)]
        f["bug"] = named[0] if named and f["oracle"]["real"] else None
        if progress is not None:
            progress("oracle", i + 1, len(todo))


def score(records: Sequence[RunRecord], oracle: Oracle) -> dict[str, dict[str, Any]]:
    """Recall, false findings, images and seconds per found bug, by planner."""
    out: dict[str, dict[str, Any]] = {}
    for planner in sorted({r.planner for r in records}, key=lambda p: PLANNERS.index(p) if p in PLANNERS else 99):
        runs = [r for r in records if r.planner == planner]
        planted = [(r, b) for r in runs for b in oracle.bugs() if b.class_ == r.label]
        found = [(r, b) for r, b in planted if any(f.get("bug") == b.name for f in r.findings)]
        confirmed = [f for r in runs for f in r.findings]
        false = [f for f in confirmed if not f["oracle"]["real"]]
        images = sum(r.images for r in runs)
        seconds = sum(r.seconds for r in runs)
        recall = stats.binomial_rate(len(found), len(planted)) if planted else None
        false_rate = stats.binomial_rate(len(false), len(confirmed)) if confirmed else None
        out[planner] = {
            "recall": recall.rate if recall else None,
            "recall_ci": [recall.low, recall.high] if recall else None,
            "bugs_found": len(found), "bugs_planted": len(planted),
            "found": sorted({b.name for _, b in found}),
            "false_findings": false_rate.rate if false_rate else 0.0,
            "false_findings_ci": [false_rate.low, false_rate.high] if false_rate else None,
            "confirmed_findings": len(confirmed), "false_confirmed": len(false),
            "images": images, "seconds": round(seconds, 1), "runs": len(runs),
            "images_per_bug": round(images / len(found)) if found else None,
            "seconds_per_bug": round(seconds / len(found), 1) if found else None,
        }
    return out


@dataclass
class DiscoveryBench:
    world: str | None = None
    classes: Sequence[str] | None = None
    planners: Sequence[str] = PLANNERS
    seeds: Sequence[int] = (0,)
    budget: int = BUDGET
    baseline_n: int = BASELINE_N
    oracle_n: int = 10_000
    root: Path = Path("runs") / "bench"
    progress: Progress | None = None

    def run(self) -> dict[str, Any]:
        backends = load_backends(self.world, progress=self.progress)
        oracle = Oracle(self.world)
        labels = list(self.classes or backends.classifier.labels.labels)
        for label in labels:
            if label not in backends.classifier.labels.labels:
                raise ValueError(backends.classifier.labels.unknown_message(label))
        jobs = [(p, label, s) for p in self.planners for s in self.seeds for label in labels]
        records = []
        for i, (p, label, s) in enumerate(jobs):
            if self.progress is not None:
                self.progress("investigations", i, len(jobs))
            slug = label.replace(" ", "-")
            records.append(run_investigation(backends, label, s, p, budget=self.budget, baseline_n=self.baseline_n,
                                             run_dir=self.root / p / f"{slug}-s{s}"))
        if self.progress is not None:
            self.progress("investigations", len(jobs), len(jobs))
        judge_runs(records, oracle, OracleJudge(oracle, self.oracle_n), self.progress)
        return {"world": oracle.world.name, "classes": labels, "seeds": list(self.seeds), "budget": self.budget,
                "oracle_n": self.oracle_n, "planners": score(records, oracle),
                "runs": [asdict(r) for r in records]}


@dataclass
class Calibration:
    """Investigations against the null classifier (no attribute changes its error rate): share with findings."""

    runs: int = 50
    planner: str = "protocol"
    world: str | None = None
    failure_rate: float = 0.05
    budget: int = BUDGET
    baseline_n: int = BASELINE_N
    root: Path = Path("runs") / "calibrate"
    progress: Progress | None = None

    def run(self) -> dict[str, Any]:
        toy = load_backends(self.world, progress=self.progress)
        labels = list(toy.classifier.labels.labels)
        records = []
        for i in range(self.runs):
            if self.progress is not None:
                self.progress("calibration runs", i, self.runs)
            label = labels[i % len(labels)]
            null = NullClassifier(toy.classifier.labels, label, self.failure_rate, salt=i)
            backends = Backends(generator=toy.generator, classifier=null, captioner=toy.captioner,
                                embedder=toy.embedder, editor=toy.editor, vocabulary=toy.vocabulary,
                                class_prompt=toy.class_prompt)
            records.append(run_investigation(backends, label, i, self.planner, budget=self.budget,
                                             baseline_n=self.baseline_n,
                                             run_dir=self.root / f"{label.replace(' ', '-')}-s{i}"))
        if self.progress is not None:
            self.progress("calibration runs", self.runs, self.runs)
        with_findings = sum(1 for r in records if r.findings)
        share = stats.binomial_rate(with_findings, len(records), method="clopper-pearson")
        return {"planner": self.planner, "null_failure_rate": self.failure_rate, "runs": len(records),
                "runs_with_findings": with_findings, "share_with_findings": share.rate,
                "share_ci": [share.low, share.high], "target": 0.05,
                "images": sum(r.images for r in records), "seconds": round(sum(r.seconds for r in records), 1),
                "findings": [{"class": r.label, "seed": r.seed, **f} for r in records for f in r.findings]}
