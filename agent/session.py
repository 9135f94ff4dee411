"""Set up one investigation session: backends, run directory, transcript, tools and planner, then run it.

Shared by `sleuth investigate`, `sleuth chat` and `sleuth audit`, so every entry point writes the same transcript.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sleuth.agent.events import Finding, RunStarted
from sleuth.agent.loop import Planner, RunResult, run_loop
from sleuth.agent.transcript import TranscriptWriter
from sleuth.tools import (
    caption_failures,
    edit_image,
    finish,
    generate_and_classify,
    measure_rate,
    perturb_caption,
    record_finding,
)
from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.backends.base import Backends
from sleuth.tools.cache import PredictionCache, default_path
from sleuth.tools.context import ToolContext
from sleuth.tools.investigation import Budget, Investigation
from sleuth.tools.registry import Registry, tool_from_module

TOOL_MODULES = (generate_and_classify, caption_failures, perturb_caption, edit_image, measure_rate, record_finding,
                finish)


def registry() -> Registry:
    return Registry([tool_from_module(m) for m in TOOL_MODULES])


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("sleuth", "torch", "torchvision", "numpy", "scipy", "pydantic", "diffusers", "transformers",
                 "open_clip_torch", "timm", "litellm"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def new_run_dir(root: Path, label: str, seed: int) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    slug = "".join(c if c.isalnum() else "-" for c in label.lower()).strip("-")
    tag = hashlib.sha256(f"{stamp}|{label}|{seed}|{time.time_ns()}".encode()).hexdigest()[:6]
    path = root / f"{stamp}-{slug}-s{seed}-{tag}"
    path.mkdir(parents=True, exist_ok=False)
    return path


_SHARED: dict[str, PredictionCache] = {}


def shared_cache() -> PredictionCache:
    """One prediction cache per process and path: on disk under $SLEUTH_CACHE unless SLEUTH_NO_CACHE=1."""
    if os.environ.get("SLEUTH_NO_CACHE", "") not in ("", "0"):
        return PredictionCache()
    path = default_path()
    if str(path) not in _SHARED:
        _SHARED[str(path)] = PredictionCache(path)
    return _SHARED[str(path)]


@dataclass
class Session:
    """One investigation of one class, wired to its transcript."""

    backends: Backends
    label: str
    run_dir: Path
    config: dict[str, Any]
    seed: int = 0
    budget: int = 20_000
    criterion: str = "top1"
    alpha: float = 0.05
    progress: Callable[[str, int, int], None] | None = None
    subscribers: list[Callable[[Any], None]] = field(default_factory=list)
    cache: PredictionCache | None = None
    """Prediction cache; default: the shared one under $SLEUTH_CACHE (in memory only if SLEUTH_NO_CACHE=1)."""
    command: str = "investigate"
    """The entry point recorded in ``run_started`` (investigate, audit, chat, ...)."""
    investigation: Investigation = field(init=False)
    ctx: ToolContext = field(init=False)

    def __post_init__(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.artifacts = ArtifactStore(self.run_dir / "artifacts")
        if self.cache is None:
            self.cache = shared_cache()
        self.investigation = Investigation(
            backends=self.backends, label=self.label, criterion=self.criterion,  # type: ignore[arg-type]
            alpha=self.alpha, budget=Budget(images=self.budget), artifacts=self.artifacts,
            progress=self.progress, seed=self.seed, cache=self.cache,
        )
        self.ctx = ToolContext(artifacts=self.artifacts)
        self.ctx.investigation = self.investigation  # type: ignore[attr-defined]
        self.transcript = self.run_dir / "transcript.jsonl"

    def started_event(self, planner_name: str) -> RunStarted:
        """The ``run_started`` event of this session's transcript."""
        return RunStarted(
            run_id=self.run_dir.name, command=self.command, config=self.config, versions=versions(),
            seeds={"seed": self.seed, **self.investigation.seed_bases()}, planner=planner_name,
            backends=self.backends.ids,
        )

    def finding_emitter(self, writer: TranscriptWriter) -> Callable[[Any], None]:
        """What tools call to report a finding: it becomes a ``finding`` event of the transcript."""
        return lambda item: writer.append(Finding(finding_id=item["finding_id"], finding=item["finding"]))

    def run(self, planner: Planner, *, max_turns: int = 100) -> RunResult:
        with TranscriptWriter(self.transcript) as writer:
            for callback in self.subscribers:
                writer.subscribe(callback)
            self.ctx.emit = self.finding_emitter(writer)
            return run_loop(planner, registry(), self.ctx, writer, max_turns=max_turns,
                            run_started=self.started_event(planner.name))
