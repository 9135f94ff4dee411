"""Set up one investigation session: backends, run directory, transcript, tools and planner, then run it.

Shared by `sleuth investigate`, `sleuth chat` and `sleuth audit`, so every entry point writes the same transcript.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sleuth.agent.config import PlannerConfig, RunConfig
from sleuth.agent.events import Event, RunStarted
from sleuth.agent.llm import LLMClient, tool_llm
from sleuth.agent.planners import Mode, PlanFor, build_planner, declared_confirmations
from sleuth.agent.planners import max_turns as planner_max_turns
from sleuth.agent.planners.llm import LLMPlanner
from sleuth.agent.runner import Planner, Runner, RunResult
from sleuth.agent.transcript import TranscriptWriter
from sleuth.tools import investigation_tools
from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.backends.base import Backends
from sleuth.tools.cache import PredictionCache, default_path
from sleuth.tools.context import ToolContext
from sleuth.tools.defaults import CONFIRMATION_DRAWS, MAX_CONFIRMATIONS
from sleuth.tools.investigation import Budget, Investigation
from sleuth.tools.registry import ToolError

Progress = Callable[[str, int, int], None]


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
    config: RunConfig
    run_dir: Path
    command: str = "investigate"
    """The entry point recorded in ``run_started`` (investigate, audit, chat, ...)."""
    progress: Progress | None = None
    cache: PredictionCache | None = None
    """Prediction cache; default: the shared one under $SLEUTH_CACHE (in memory only if SLEUTH_NO_CACHE=1)."""
    subscribers: list[Callable[[Event], None]] = field(default_factory=list)
    fresh: bool = True
    """A new run (it claims its confirmation draw); False: a fork, resume or replay of a recorded one, which keeps
    the draw its config recorded."""
    earlier: list[str] = field(init=False, default_factory=list)
    """Fresh runs (run directories) that claimed this seed before, in order: of any draw when the draw was left to
    the claim, of the same draw when the config named one."""
    _named_draw: bool = field(init=False, default=False)
    investigation: Investigation = field(init=False)
    ctx: ToolContext = field(init=False)
    artifacts: ArtifactStore = field(init=False)
    transcript: Path = field(init=False)

    def __post_init__(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.artifacts = ArtifactStore(self.run_dir / "artifacts")
        if self.config.confirmations is None:  # the planner's own family, recorded as declared
            self.config = self.config.model_copy(update={
                "confirmations": declared_confirmations(self.config.planner.name, self.config.budget)})
        if self.config.confirmation_designs is not None:
            self.config = self.config.model_copy(update={
                "confirmations": sum(d.attempts for d in self.config.confirmation_designs)})
        cache = self.cache if self.cache is not None else shared_cache()
        if self.fresh:
            self._claim_draw(cache)
        c = self.config
        self.investigation = Investigation(
            backends=self.backends, label=c.label, criterion=c.criterion, alpha=c.alpha,
            max_confirmations=c.confirmations or MAX_CONFIRMATIONS,
            confirmation_designs=list(c.confirmation_designs) if c.confirmation_designs is not None else None,
            legacy_confirmations=c.confirmation_sizes == "legacy",
            budget=Budget(images=c.budget), artifacts=self.artifacts, progress=self.progress, seed=c.seed,
            draw=c.confirmation_draw or 0, cache=cache,
        )
        self.ctx = ToolContext(investigation=self.investigation, artifacts=self.artifacts)
        self.transcript = self.run_dir / "transcript.jsonl"

    def _claim_draw(self, cache: PredictionCache) -> None:
        """Claim the confirmation draw in the cache's ledger of seed claims: the config's, or the first no earlier
        fresh run of this class, seed and backends holds (a run directory keeps its own, so a class an audit
        restarts gets the draw it claimed)."""
        self._named_draw = self.config.confirmation_draw is not None
        try:
            draw, self.earlier = cache.claim_draw(self._claim_key(), str(self.run_dir.resolve()),
                                                  self.config.confirmation_draw, CONFIRMATION_DRAWS)
        except ValueError as e:
            raise ToolError(f"{self.config.label}, seed {self.config.seed}: {e}") from None
        self.config = self.config.model_copy(update={"confirmation_draw": draw})

    @property
    def reaudit(self) -> str | None:
        """What a user re-auditing a seed should know, or None for a seed's first run."""
        if not self.earlier:
            return None
        c = self.config
        names = ", ".join(Path(r).name for r in self.earlier[-2:])
        runs = f"{len(self.earlier)} earlier runs" if len(self.earlier) > 1 else "an earlier run"
        if c.confirmation_draw is not None and self._named_draw:
            return (f"{c.label}, seed {c.seed}: confirmation draw {c.confirmation_draw} was used by {runs} ({names}); "
                    "this run confirms on the same images, so it repeats their findings, false ones included: it is "
                    "not fresh evidence.")
        return (f"{c.label}, seed {c.seed} was audited by {runs} ({names}): this run sees the same discovery images "
                f"and confirms on fresh ones (confirmation draw {c.confirmation_draw}). Its findings are a family of "
                "their own: auditing again until something confirms is not covered by alpha.")

    def _claim_key(self) -> str:
        ids = self.backends.ids
        return json.dumps([ids.get("generator"), ids.get("classifier"), self.config.label, self.config.seed])

    def discard(self) -> None:
        """Remove the run directory of a run that never started (nothing generated, nothing found), and give back
        the confirmation draw it claimed."""
        if self.fresh:
            (self.cache if self.cache is not None else shared_cache()).release_claim(
                self._claim_key(), str(self.run_dir.resolve()))
        shutil.rmtree(self.run_dir, ignore_errors=True)

    @property
    def label(self) -> str:
        return self.config.label

    def started_event(self, planner_name: str) -> RunStarted:
        """The ``run_started`` event of this session's transcript."""
        return RunStarted(
            run_id=self.run_dir.name, command=self.command, config=self.config.record(), versions=versions(),
            seeds={"seed": self.config.seed, **self.investigation.seed_bases()}, planner=planner_name,
            backends=self.backends.ids, class_prompt=self.investigation.class_prompt,
        )

    def planner(self, mode: Mode = "investigate", config: PlannerConfig | None = None) -> Planner:
        """The planner the config names (or ``config``), built for this session."""
        inv = self.investigation
        planner = build_planner(config or self.config.planner, PlanFor(
            label=self.label, class_prompt=inv.class_prompt, labels=inv.labels.labels, budget=inv.budget.images,
            seed=self.config.seed, alpha=self.config.alpha, mode=mode, confirmations=inv.max_confirmations,
            designs=tuple(c) if (c := self.config.confirmation_designs) is not None else None))
        if isinstance(planner, LLMPlanner):  # it reads this run's images, and its model serves the tools too
            planner.artifacts = self.artifacts
            self.ctx.llm = tool_llm(planner.client)
        elif (config or self.config.planner).proposer == "llm":  # the model proposes perturbations in the tools
            llm = (config or self.config.planner).llm
            assert llm is not None  # PlannerConfig refuses the llm proposer without a model
            self.ctx.llm = tool_llm(LLMClient(llm))
        return planner

    def join_transcript(self, started: RunStarted) -> None:
        """Count this session's confirmation attempts with every run of the transcript ``started`` begins (its
        forks and resumes share that line, and with it the confirmation baseline)."""
        if self.config.confirmation_sizes == "fixed":
            self.investigation.family = started.hash

    def runner(self, writer: TranscriptWriter, **hooks: Any) -> Runner:
        """A runner writing this session's events to ``writer`` (``hooks``: see ``Runner``)."""
        if writer.events and isinstance(writer.events[0], RunStarted):
            self.join_transcript(writer.events[0])
        writer.subscribe(lambda e: self.join_transcript(e) if isinstance(e, RunStarted) else None)
        for callback in self.subscribers:
            writer.subscribe(callback)
        return Runner(investigation_tools(), self.ctx, writer, **hooks)

    def run(self, planner: Planner, *, max_turns: int | None = None) -> RunResult:
        with TranscriptWriter(self.transcript) as writer:
            return self.runner(writer).run(planner, max_turns=max_turns or planner_max_turns(self.config.planner),
                                           max_seconds=self.config.planner.max_seconds,
                                           run_started=self.started_event(planner.name))
