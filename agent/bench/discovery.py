"""The planted-bug benchmark's pieces: one investigation, whether a caption names a planted bug, and calibration.

A finding *finds* a planted bug when its caption names the bug's attribute (read with the world's own parser, so "the
background is white" names snow as well as "in the snow") and the oracle measures the effect real (``judge``);
``multiworld`` runs and scores investigations over many worlds. Calibration runs investigations against a null
classifier, whose errors do not depend on the image: any confirmed finding there is false, so the share of runs
with one estimates the procedure's family-wise error rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sleuth.agent.config import PlannerConfig, RunConfig
from sleuth.agent.session import Session
from sleuth.tools import stats
from sleuth.tools.backends.base import Backends
from sleuth.tools.backends.toyworld import load_backends
from sleuth.tools.backends.toyworld.config import World
from sleuth.tools.backends.toyworld.null import NullClassifier
from sleuth.tools.backends.toyworld.parser import parse
from sleuth.tools.cache import PredictionCache
from sleuth.tools.defaults import ALPHA, BASELINE_N, BUDGET
from sleuth.tools.findings import FindingSummary

Progress = Callable[[str, int, int], None]


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
    # ``planner`` may be "llm:MODEL": PlannerConfig reads the model from the name.
    planner_config = PlannerConfig.model_validate({"name": planner, "baseline_n": baseline_n})
    config = RunConfig.model_validate({"class": label, "seed": seed, "budget": budget, "criterion": criterion,
                                       "alpha": alpha, "planner": planner_config})
    session = Session(backends=backends, config=config, run_dir=run_dir, cache=PredictionCache())
    t0 = time.perf_counter()
    result = session.run(session.planner())
    seconds = time.perf_counter() - t0
    inv = session.investigation
    findings = [FindingSummary.of(label, f).model_dump(mode="json") for f in inv.findings if f.confirmed]
    return RunRecord(planner, label, seed, result.status, inv.budget.used, round(seconds, 2),
                     str(session.transcript), findings)


def names_bug(caption: str, bug: Any, world: World) -> bool:
    """Does ``caption`` ask for the bug's attribute values (as the world's parser reads it)?"""
    constraints = parse(caption, world).scene_constraints
    return all(value in constraints.get(attr, []) for attr, value in bug.attributes.items())


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
                                embedder=toy.embedder, editor=toy.editor, class_prompt=toy.class_prompt)
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
