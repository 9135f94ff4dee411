"""Unattended audits: many classes, one investigation each, under budgets, resumable after any crash.

A run directory holds ``audit.json`` (the config, class list and executor, written once), one directory per class
with its transcript, artifacts, ``summary.json`` and ``clock.json`` (its active seconds), and, at the end,
``summary.json`` for the whole audit. Every class goes through ``Audit.run_class`` and ``agent.resume.continue_run``,
whether it starts fresh or continues a transcript a crash cut, and whether the audit runs its classes one after the
other here or on Ray workers (``agent.audit.on_ray``): one code path, so resuming is exercised by every run.

Resuming skips classes whose summary is written, finishes a class whose transcript ended but whose summary was not
written (by rebuilding its state), and continues a cut transcript where it stopped. Budgets that depend on earlier
classes (the audit's image total) are recorded in each class's ``run_started``, so a resumed class keeps the budget
it started with.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sleuth.agent.audit.budget import BudgetedPlanner, Clock
from sleuth.agent.audit.config import AuditConfig, ExecutorConfig
from sleuth.agent.audit.summary import audit_summary, class_summary, skipped_summary
from sleuth.agent.config import RunConfig
from sleuth.agent.errors import AuditError, RebuildError, UsageError
from sleuth.agent.events import Event, RunStarted, parse_event
from sleuth.agent.planners import baseline_images
from sleuth.agent.replay.rebuild import session_for
from sleuth.agent.replay.resume import continue_run
from sleuth.agent.session import Session
from sleuth.agent.transcript import read_transcript
from sleuth.tools.backends.base import Backends

STATE_VERSION = 1
Progress = Callable[[str, int, int], None]


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-") or "class"


def write_json(path: Path, obj: Any) -> None:
    """Write then rename, synced: a reader (or a resumed audit) sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(obj, indent=2, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def resolve_classes(config: AuditConfig, backends: Backends) -> list[str]:
    """The configured classes in order ('all': every class of the classifier); unknown names are refused."""
    labels = backends.classifier.labels
    if config.classes == "all":
        return list(labels.labels)
    unknown = [c for c in config.classes if c not in labels.labels]
    if unknown:
        raise UsageError("classes: " + " ".join(labels.unknown_message(c) for c in unknown))
    return list(config.classes)


def check_run_dir(path: str) -> Path:
    """A run directory must be a path: transcripts are appended and synced line by line, which object stores behind
    URLs (s3://, gs://, ...) cannot do. Shared storage is mounted (NFS, a cluster file system) and given as a path."""
    if "://" in path:
        raise AuditError(f"{path}: run directories are paths, not URLs; transcripts are appended and synced line by "
                         "line, which object stores cannot do. Mount shared storage (NFS, a cluster file system) at "
                         "the same path on every machine and give that path")
    return Path(path)


def start(run_dir: Path, config: AuditConfig, classes: list[str]) -> None:
    """Create the run directory and record what the audit is to do (and how it runs, to resume it the same way)."""
    if run_dir.exists() and any(run_dir.iterdir()):
        raise AuditError(f"{run_dir} is not empty; resume it with --resume, or choose a new directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    dirs = {c: slug(c) for c in classes}
    if len(set(dirs.values())) != len(dirs):
        raise AuditError("two classes map to the same directory name: " + ", ".join(classes))
    write_json(run_dir / "audit.json", {"version": STATE_VERSION, "config": config.model_dump(mode="json"),
                                        "classes": classes, "dirs": dirs,
                                        "executor": config.executor.model_dump(mode="json")})


def load(run_dir: Path) -> tuple[AuditConfig, list[str]]:
    state = run_dir / "audit.json"
    if not state.is_file():
        raise AuditError(f"{run_dir} holds no audit (no audit.json); start one with: sleuth audit CONFIG")
    data = json.loads(state.read_text())
    if data.get("version") != STATE_VERSION:
        raise AuditError(f"{state} has state version {data.get('version')!r}; this sleuth reads {STATE_VERSION}")
    config = AuditConfig.model_validate(data["config"])
    # How the audit ran is not what it computes (it stays out of its config and summaries); a resume starts from it.
    config.executor = ExecutorConfig.model_validate(data.get("executor") or {})
    return config, list(data["classes"])


@contextmanager
def class_lock(cdir: Path) -> Iterator[None]:
    """Hold the class's lock while it runs: two processes never append to one transcript (a worker Ray took for
    dead while it still ran, or two ``--resume`` of one audit). The second waits, then finds the class done. The
    kernel releases the lock of a killed process."""
    cdir.mkdir(parents=True, exist_ok=True)
    with open(cdir / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _recorded_start(transcript: Path) -> RunStarted | None:
    """The run_started of a transcript if its first line was written whole."""
    if not transcript.is_file():
        return None
    with open(transcript, "rb") as f:
        first = f.readline()
    if not first.endswith(b"\n"):
        return None
    event = parse_event(json.loads(first))
    return event if isinstance(event, RunStarted) else None


@dataclass
class Audit:
    """Runs (or resumes) the audit in ``run_dir``; the command line renders what it reports."""

    run_dir: Path
    backends: Backends
    progress: Progress | None = None
    on_event: Callable[[Event], None] | None = None
    on_class: Callable[[dict[str, Any]], None] | None = None
    """Called with each class summary as the class ends (or is found finished)."""
    config: AuditConfig = field(init=False)
    classes: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.config, self.classes = load(self.run_dir)
        self.clock = Clock(self.run_dir)

    def run(self) -> dict[str, Any]:
        """The classes one after the other, in order (each may use what earlier classes left of the totals)."""
        summaries: list[dict[str, Any]] = []
        n = len(self.classes)
        for i, label in enumerate(self.classes):
            self._progress("audit: classes", i, n)
            summary = self.run_class(label, summaries)
            summaries.append(summary)
            if self.on_class is not None:
                self.on_class(summary)
        self._progress("audit: classes", n, n)
        return finish(self.run_dir, self.config, summaries)

    def _progress(self, task: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(task, done, total)

    # -- one class ----------------------------------------------------------------------------------------

    def _left(self, spent: list[dict[str, Any]]) -> tuple[int, str | None]:
        """Images this class may use, or a reason the audit's total budget leaves it nothing."""
        total = self.config.budget.total
        images = self.config.per_class_images
        if total.images is not None:
            images = min(images, total.images - sum(s["images"] for s in spent))
            if images <= 0:
                return 0, f"the audit's image budget ({total.images}) is spent"
            baseline = baseline_images(self.config.planner)
            if images < baseline:  # not even the class's baseline fits: the class would end before it starts
                return 0, (f"the audit's image budget ({total.images}) is spent: {images} images left, fewer than "
                           f"one baseline ({baseline})")
        if total.seconds is not None and self.clock.total() >= total.seconds:
            return 0, f"the audit's wall-time budget ({total.seconds:g} s) is spent"
        if total.cost_usd is not None and sum(s["cost_usd"] for s in spent) >= total.cost_usd:
            return 0, f"the audit's LLM cost budget (${total.cost_usd:g}) is spent"
        return images, None

    def _session(self, label: str, cdir: Path, images: int, recorded: RunStarted | None) -> Session:
        if recorded is not None:
            # A class that began keeps the settings it recorded (its image budget came from earlier classes).
            return session_for(recorded, cdir, backends=self.backends, progress=self.progress, command="audit")
        c = self.config
        config = RunConfig(label=label, budget=images, audit=self.run_dir.name, seed=c.seed,
                           confirmation_draw=c.confirmation_draw, criterion=c.criterion,
                           alpha=c.alpha, confirmations=c.confirmations, backends=c.backends, planner=c.planner,
                           limits={"per_class": c.budget.per_class, "total": c.budget.total})
        return Session(backends=self.backends, config=config, run_dir=cdir, progress=self.progress, command="audit")

    def _planner(self, session: Session, key: str, spent: list[dict[str, Any]]) -> BudgetedPlanner:
        per, total = self.config.budget.per_class, self.config.budget.total

        def seconds_left() -> float | None:
            lefts = [lim - used for lim, used in ((per.seconds, self.clock.of(key)),
                                                  (total.seconds, self.clock.total())) if lim is not None]
            return min(lefts) if lefts else None

        costs = [x for x in (per.cost_usd, None if total.cost_usd is None else
                             total.cost_usd - sum(s["cost_usd"] for s in spent)) if x is not None]
        return BudgetedPlanner(session.planner(), seconds_left=seconds_left, cost_limit=min(costs) if costs else None)

    def run_class(self, label: str, spent: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
        """Run (or resume, or read) one class and return its summary; ``spent``: the summaries of the classes before
        it, whose spending the audit's totals subtract. The one path of every class, on every executor."""
        key = slug(label)
        cdir = self.run_dir / key
        done = cdir / "summary.json"
        if done.is_file():
            return json.loads(done.read_text())
        with class_lock(cdir):
            if done.is_file():  # finished by another process while this one waited
                return json.loads(done.read_text())
            return self._class(label, key, cdir, list(spent))

    def _class(self, label: str, key: str, cdir: Path, spent: list[dict[str, Any]]) -> dict[str, Any]:
        done = cdir / "summary.json"
        recorded = _recorded_start(cdir / "transcript.jsonl")
        images = 0
        if recorded is None:
            images, reason = self._left(spent)
            if reason is not None:
                cdir.mkdir(parents=True, exist_ok=True)
                summary = skipped_summary(label, key, reason)
                write_json(done, summary)
                return summary
        session = self._session(label, cdir, images, recorded)
        planner = self._planner(session, key, spent)
        inv = session.investigation

        def on_event(event: Event) -> None:
            self.clock.tick()
            self._progress(f"{label}: images", inv.budget.used, inv.budget.images)
            if self.on_event is not None:
                self.on_event(event)

        session.subscribers.append(on_event)
        self.clock.start(key)
        try:
            cont = continue_run(session, planner, progress=self.progress)
        finally:
            self.clock.stop()
        events = read_transcript(session.transcript)
        summary = class_summary(label, key, inv, events, cont, self.clock.of(key))
        summary["transcript"] = str(session.transcript.relative_to(self.run_dir))
        summary["confirmation_draw"] = inv.draw
        if session.reaudit:
            summary["reaudit"] = session.reaudit
        write_json(done, summary)
        return summary


def finish(run_dir: Path, config: AuditConfig, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Write and return the audit's summary: the classes' summaries, in the audit's class order."""
    out = audit_summary(str(run_dir), config.model_dump(mode="json"), summaries, Clock(run_dir).total())
    write_json(run_dir / "summary.json", out)
    return out


__all__ = ["Audit", "AuditError", "RebuildError", "check_run_dir", "finish", "load", "resolve_classes", "slug",
           "start", "write_json"]
