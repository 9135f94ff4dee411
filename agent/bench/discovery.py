"""The planted-bug benchmark's pieces: one investigation, and whether a caption names a planted bug.

A finding *finds* a planted bug when its caption names the bug's attribute (read with the world's own parser, so "the
background is white" names snow as well as "in the snow") and the oracle measures the effect real (``judge``);
``multiworld`` runs and scores investigations over many worlds; ``calibrate`` runs them against null and partial-null
classifiers, where which captions are null is known.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

from sleuth.agent.config import PlannerConfig, RunConfig
from sleuth.agent.session import Session
from sleuth.tools.backends.base import Backends
from sleuth.tools.backends.toyworld.config import World
from sleuth.tools.backends.toyworld.parser import parse
from sleuth.tools.cache import PredictionCache
from sleuth.tools.defaults import ALPHA
from sleuth.tools.findings import FindingSummary
from sleuth.tools.investigation import Investigation

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


@overload
def run_investigation(backends: Backends, label: str, seed: int, planner: str, *, budget: int, baseline_n: int | None,
                      run_dir: Path, criterion: str = ..., alpha: float = ..., llm: dict[str, Any] | None = ...,
                      with_investigation: Literal[False] = ...) -> RunRecord: ...
@overload
def run_investigation(backends: Backends, label: str, seed: int, planner: str, *, budget: int, baseline_n: int | None,
                      run_dir: Path, criterion: str = ..., alpha: float = ..., llm: dict[str, Any] | None = ...,
                      with_investigation: Literal[True]) -> tuple[RunRecord, Investigation]: ...
def run_investigation(backends: Backends, label: str, seed: int, planner: str, *, budget: int, baseline_n: int | None,
                      run_dir: Path, criterion: str = "top1", alpha: float = ALPHA, llm: dict[str, Any] | None = None,
                      with_investigation: bool = False) -> RunRecord | tuple[RunRecord, Investigation]:
    """One investigation with its own in-memory prediction cache, so planners are timed on equal terms. ``llm``: the
    language model's settings (api_base, tool_choice, ...) for a planner that names a model."""
    # ``planner`` may be "llm:MODEL" or "protocol+llm:MODEL": PlannerConfig reads the model from the name.
    extra = dict(llm or {}) if uses_llm(planner) else {}
    planner_config = PlannerConfig.model_validate({"name": planner, "baseline_n": baseline_n, **extra})
    config = RunConfig.model_validate({"class": label, "seed": seed, "budget": budget, "criterion": criterion,
                                       "alpha": alpha, "planner": planner_config})
    session = Session(backends=backends, config=config, run_dir=run_dir, cache=PredictionCache())
    t0 = time.perf_counter()
    result = session.run(session.planner())
    seconds = time.perf_counter() - t0
    inv = session.investigation
    findings = [FindingSummary.of(label, f).model_dump(mode="json") for f in inv.findings if f.confirmed]
    record = RunRecord(planner, label, seed, result.status, inv.budget.used, round(seconds, 2),
                       str(session.transcript), findings)
    return (record, inv) if with_investigation else record


def uses_llm(planner: str) -> bool:
    """Whether a benchmark planner name carries a language model (llm:MODEL, protocol+llm:MODEL)."""
    return planner.startswith(("llm:", "protocol+llm:"))


def names_bug(caption: str, bug: Any, world: World) -> bool:
    """Does ``caption`` ask for the bug's attribute values (as the world's parser reads it)?"""
    constraints = parse(caption, world).scene_constraints
    return all(value in constraints.get(attr, []) for attr, value in bug.attributes.items())
