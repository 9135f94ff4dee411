"""Run an audit's classes at once on Ray (``sleuth audit CONFIG --executor ray``).

Each worker is a Ray actor that loads the audit's backends once and then investigates one class at a time through
``Audit.run_class``, the path the local executor takes, so a class's transcript and summary are the ones a local
audit writes. Workers read the audit from, and write transcripts, artifacts, clocks and class summaries into, the
run directory, which every node must see at the same path: a local disk for one machine; NFS or a cluster file
system for several. The driver only dispatches classes, shows their progress and writes the audit's summary.

Faults: a worker that dies (killed, out of memory, its node lost) is restarted by Ray (``max_restarts``), possibly on
another node, and the class it was running is called again on it (``max_task_retries``): the class resumes from its
transcript (``continue_run``), as after any crash. The driver itself can be killed and restarted with ``--resume``.

Identical results: a class's work depends on the config, its label and its seed, never on the other classes, save
through the audit's ``total`` budgets, which the local executor shares among classes in order (a class gets what
the classes before it left). Classes running at once cannot reproduce that order-dependent split, so a Ray audit
refuses ``total`` budgets: ``budget.per_class`` binds each class alone, the same way on both executors.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sleuth.agent.audit import Audit, AuditError, finish, load, slug
from sleuth.agent.audit.config import AuditConfig, ExecutorConfig
from sleuth.agent.errors import UsageError

INSTALL = "pip install 'sleuth[ray]'"
POLL_S = 0.25
"""How often the driver reads the workers' progress."""
REPORT_S = 0.5
"""Least time between two progress reports of a worker."""
LOCAL_OBJECT_STORE = 256 * 1024**2
"""Object store of a local cluster: classes return small summaries, never images."""

Progress = Callable[[str, int, int], None]


def on_loopback(address: str | None) -> bool:
    """Whether a cluster address is this machine's loopback (or none: a local cluster sleuth starts)."""
    if address is None:
        return True
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def import_ray(executor: ExecutorConfig | None = None) -> Any:
    """Ray, set up to reach nothing it is not told to: no usage reports, and a cluster on the loopback address (the
    local one sleuth starts, or one given as 127.0.0.1:PORT) kept on it, where Ray would otherwise swap the machine's
    network address in. Ray reads both settings when it is first imported."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if executor is not None and on_loopback(executor.address):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError:
        raise UsageError(f"--executor ray needs Ray, which is not installed: {INSTALL}") from None
    return ray


def gpus_per_worker(config: AuditConfig) -> float:
    """Declared, or 1 when the backends run on CUDA (Ray then gives each worker its own GPU), else 0."""
    if config.executor.num_gpus is not None:
        return config.executor.num_gpus
    return 1.0 if config.backends.device.startswith("cuda") else 0.0


def check(config: AuditConfig, classes: list[str]) -> None:
    """Refuse what a Ray audit cannot do the way a local one does; each problem is one line naming the setting."""
    total = config.budget.total
    shared = [k for k in ("images", "seconds", "cost_usd") if getattr(total, k) is not None]
    if shared:
        hint = (f" (e.g. per_class.images: {max(1, total.images // len(classes))} for {total.images} over "
                f"{len(classes)} classes)" if total.images is not None else "")
        raise UsageError(
            f"budget.total.{', budget.total.'.join(shared)}: an audit's totals are shared by its classes in order "
            "(each gets what the classes before it left), which classes running at once on Ray cannot reproduce; "
            f"set budget.per_class instead{hint}, or run with --executor local")
    device = config.backends.device
    if device.startswith("cuda:") and gpus_per_worker(config) > 0:
        raise UsageError(f"backends.device {device}: each Ray worker sees only the GPU Ray gives it; say cuda")


@dataclass
class Options:
    """The Ray options of one run, resolved against the cluster."""

    num_cpus: float
    num_gpus: float
    memory: int | None
    max_retries: int

    def actor(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus,
                               "max_restarts": self.max_retries, "max_task_retries": self.max_retries}
        if self.memory is not None:
            out["memory"] = self.memory
        return out

    def needs(self) -> dict[str, float]:
        out = {"CPU": self.num_cpus, "GPU": self.num_gpus, "memory": float(self.memory or 0)}
        return {k: v for k, v in out.items() if v > 0}


def connect(ray: Any, executor: ExecutorConfig) -> bool:
    """Join the cluster ``executor.address`` names, or start a local one; True when this call started Ray (so the
    caller shuts it down). A Ray already initialised in this process (a test's, an embedding program's) is used."""
    if ray.is_initialized():
        return False
    quiet: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
    if executor.address is not None:
        try:
            ray.init(address=executor.address, **quiet)
        except (ConnectionError, RuntimeError) as e:
            raise UsageError(f"cannot join the Ray cluster at {executor.address}: {reason(e)} (a cluster with token "
                             "authentication needs RAY_AUTH_MODE=token and its token here)") from None
        return True
    cpus = math.ceil(executor.workers * executor.num_cpus) if executor.workers else None
    # Ray lowers its workers' priority (nice 15) by default; a class runs at the priority a local audit's classes
    # run at, or other work on the machine would take the cores the workers were given.
    os.environ.setdefault("RAY_worker_niceness", "0")
    # "local": a new cluster of this process's own, even where `ray start` runs one (or left its address file).
    ray.init(address="local", num_cpus=cpus, object_store_memory=LOCAL_OBJECT_STORE, **quiet)
    return True


def reason(error: BaseException) -> str:
    """The last line of an error Ray reports (the exception that ended a remote call), shortened."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines[-1] if lines else type(error).__name__)[:300]


def worker_count(ray: Any, executor: ExecutorConfig, options: Options, todo: int) -> int:
    """Workers to start: as asked, or as many as the cluster's free resources hold; at most one per class."""
    total = ray.cluster_resources()
    for name, need in options.needs().items():
        have = float(total.get(name, 0.0))
        if have < need:
            unit = " bytes of" if name == "memory" else ""
            raise UsageError(f"the Ray cluster has {have:g}{unit} {name} in all; each worker asks for {need:g}"
                             + (" (--num-gpus 0 for a CPU-only run)" if name == "GPU" else ""))
    if executor.workers is not None:
        return max(1, min(executor.workers, todo))
    free = ray.available_resources()
    fits = min(int(float(free.get(name, 0.0)) // need) for name, need in options.needs().items())
    return max(1, min(fits, todo))


class Board:
    """A Ray actor the workers report to and the driver reads: images used per class, and each start of a class."""

    def __init__(self) -> None:
        self.images: dict[str, tuple[int, int]] = {}
        self.starts: list[tuple[str, str, int]] = []

    def update(self, label: str, done: int, total: int) -> None:
        self.images[label] = (done, total)

    def started(self, label: str, host: str, pid: int) -> None:
        self.starts.append((label, host, pid))

    def read(self, since: int) -> tuple[dict[str, tuple[int, int]], list[tuple[str, str, int]]]:
        return dict(self.images), self.starts[since:]


class ClassWorker:
    """A Ray actor: loads the audit's backends on its first class, keeps them, and runs one class at a time through
    ``Audit.run_class`` (which resumes a class from its transcript when an earlier worker died in it)."""

    def __init__(self, run_dir: str, version: str, board: str, threads: int) -> None:
        import ray

        self.run_dir = Path(run_dir)
        self.version = version
        # Looked up by name: a restarted actor gets its constructor's arguments again, and Ray keeps only plain
        # values for that, not handles.
        self.board = ray.get_actor(board)
        self.threads = threads
        self.audit: Audit | None = None
        self.label = ""
        self._sent = 0.0

    def _load(self) -> Audit:
        from sleuth import __version__

        if self.version != __version__:
            raise AuditError(f"sleuth {__version__} on {socket.gethostname()} but {self.version} on the driver: "
                             "install the same sleuth on every node")
        if not (self.run_dir / "audit.json").is_file():
            raise AuditError(f"{socket.gethostname()} cannot see {self.run_dir / 'audit.json'}: the run directory "
                             "must be on storage every node mounts at the same path")
        import torch

        torch.set_num_threads(self.threads)
        config, _ = load(self.run_dir)
        return Audit(self.run_dir, config.backends.build(load=True), progress=self._progress)

    def _progress(self, task: str, done: int, total: int) -> None:
        if task != f"{self.label}: images":
            return
        now = time.monotonic()
        if done < total and now - self._sent < REPORT_S:
            return
        self._sent = now
        self.board.update.remote(self.label, done, total)

    def run(self, label: str) -> dict[str, Any]:
        self.label = label
        self.board.started.remote(label, socket.gethostname(), os.getpid())
        if self.audit is None:
            self.audit = self._load()
        return self.audit.run_class(label)


@dataclass
class RayAudit:
    """Runs (or resumes) the audit in ``run_dir`` on Ray; reports like ``Audit``, and writes the same summary."""

    run_dir: Path
    progress: Progress | None = None
    on_class: Callable[[dict[str, Any]], None] | None = None
    """Called with each class summary as the class ends (or is found finished)."""
    on_note: Callable[[str], None] | None = None
    """Called with a line for the user: the workers started, and each worker that died with its class resumed."""
    runtime_env: Mapping[str, Any] | None = None
    """Ray runtime environment of the workers (environment variables, set-up hooks)."""
    placements: list[tuple[str, str, int]] = field(default_factory=list, init=False)
    """Each start of a class on a worker: (class, host, pid), in order; a class a worker died in starts again."""

    def run(self) -> dict[str, Any]:
        config, classes = load(self.run_dir)
        check(config, classes)
        summaries: dict[str, dict[str, Any]] = {}
        for label in classes:
            done = self.run_dir / slug(label) / "summary.json"
            if done.is_file():
                summaries[label] = self._ended(json.loads(done.read_text()))
        todo = [c for c in classes if c not in summaries]
        self._progress("audit: classes", len(summaries), len(classes))
        if todo:
            ray = import_ray(config.executor)
            started = connect(ray, config.executor)
            try:
                self._dispatch(ray, config, todo, summaries, len(classes))
            finally:
                if started:
                    ray.shutdown()
        return finish(self.run_dir, config, [summaries[c] for c in classes])

    def _progress(self, task: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(task, done, total)

    def _ended(self, summary: dict[str, Any]) -> dict[str, Any]:
        if self.on_class is not None:
            self.on_class(summary)
        return summary

    def _dispatch(self, ray: Any, config: AuditConfig, todo: list[str], summaries: dict[str, dict[str, Any]],
                  n: int) -> None:
        from sleuth import __version__

        e = config.executor
        options = Options(num_cpus=e.num_cpus, num_gpus=gpus_per_worker(config),
                          memory=int(e.memory) if e.memory is not None else None, max_retries=e.max_retries)
        n_workers = worker_count(ray, e, options, len(todo))
        if self.on_note is not None:
            total = ray.cluster_resources()
            self.on_note(f"Ray: {n_workers} worker{'s' * (n_workers != 1)}, each with {options.num_cpus:g} CPU and "
                         f"{options.num_gpus:g} GPU, on a cluster of {total.get('CPU', 0):g} CPUs and "
                         f"{total.get('GPU', 0):g} GPUs; {len(todo)} classes to run")
        name = f"sleuth-audit-board-{os.getpid()}-{time.time_ns()}"
        board = ray.remote(Board).options(num_cpus=0, name=name).remote()
        try:  # the first of sleuth's code to run on the cluster
            ray.get(board.read.remote(0))
        except ray.exceptions.RayActorError as err:
            raise AuditError(f"Ray cannot run sleuth on its workers ({reason(err)}); every node needs sleuth "
                             f"{__version__} installed, with Ray ({INSTALL})") from None
        worker = ray.remote(ClassWorker).options(**options.actor(), runtime_env=dict(self.runtime_env or {}))
        threads = max(1, round(options.num_cpus))
        idle = [worker.remote(str(self.run_dir.resolve()), __version__, name, threads) for _ in range(n_workers)]
        queue = deque(todo)
        running: dict[Any, tuple[str, Any]] = {}
        failure: BaseException | None = None
        while running or (queue and failure is None):
            while queue and idle and failure is None:
                actor = idle.pop()
                label = queue.popleft()
                running[actor.run.remote(label)] = (label, actor)
            ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL_S)
            self._report(ray, board, ended=summaries)
            for ref in ready:
                label, actor = running.pop(ref)
                try:
                    summary = ray.get(ref)
                except ray.exceptions.RayTaskError as err:  # the class raised: the error a local audit raises
                    failure = failure or (err.cause if isinstance(err.cause, Exception) else err)
                    idle.append(actor)
                    continue
                except ray.exceptions.RayActorError as err:  # its worker died more often than it may restart
                    failure = failure or AuditError(
                        f"{label}: its worker died after {e.max_retries} restarts, the most max_retries allows "
                        f"({reason(err)}); what it wrote is kept: continue with "
                        f"sleuth audit --resume {self.run_dir}")
                    continue
                images = (summary["images"], summary["image_budget"])
                self._progress(f"{label}: images", max(images), max(images))  # the class's bar ends
                summaries[label] = self._ended(summary)
                self._progress("audit: classes", len(summaries), n)
                idle.append(actor)
        self._report(ray, board, ended=summaries)
        if failure is not None:
            raise failure

    def _report(self, ray: Any, board: Any, ended: Mapping[str, Any]) -> None:
        images, new = ray.get(board.read.remote(len(self.placements)))
        for label, host, pid in new:
            self.placements.append((label, host, pid))
            attempt = sum(p[0] == label for p in self.placements)
            if attempt > 1 and self.on_note is not None:
                self.on_note(f"{label}: its worker died; the class resumes from its transcript on {host} "
                             f"(pid {pid}, attempt {attempt})")
        for label, (done, total) in images.items():
            if label not in ended:
                self._progress(f"{label}: images", done, total)


__all__ = ["INSTALL", "RayAudit", "check", "gpus_per_worker", "import_ray"]
