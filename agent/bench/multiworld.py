"""The discovery benchmark over many worlds: each (world, class) investigated by every planner in worker processes,
judged by the world's oracle, filed as it finishes, and summarised per planner (``metrics.planner_summary``).

Work runs in ``jobs`` processes. A world whose networks are neither shipped nor cached trains first, once, in one
worker; its classes are queued when it is ready. Each worker loads a world once and keeps it (with its oracle's
cached verdicts) for every class of that world it is given. Every (world, class, planner, seed) result is written
to ``<root>/<world>/results/<class>/<planner>-s<seed>.json`` when it finishes; a later run with the same ``root``
and the same settings reuses those files, so an interrupted benchmark loses nothing it had finished.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from sleuth.agent.bench.judge import OracleJudge
from sleuth.agent.bench.metrics import BANDS, REAL_RATIO, BugOutcome, planner_summary
from sleuth.agent.bench.worlds import WorldSpec, bench_classes
from sleuth.agent.transcript import TranscriptError
from sleuth.agent.view import InvestigationView
from sleuth.tools.backends.toyworld.config import World

Progress = Callable[[str, int, int], None]
RESULT_VERSION = 1

START_METHOD = "spawn"
"""How worker processes start (tests that patch module functions fork instead)."""


@dataclass(frozen=True)
class Settings:
    """What a result depends on besides the world, planner, class and seed (a stored result is reused only if equal)."""

    budget: int
    baseline_n: int | None
    oracle_n: int
    criterion: str = "top1"


@dataclass(frozen=True)
class ClassJob:
    key: str
    world: World
    label: str
    bug_free: bool
    planners: tuple[str, ...]
    seeds: tuple[int, ...]
    settings: Settings
    root: Path
    llm: tuple[tuple[str, Any], ...] = ()
    """Settings of the language model behind llm: and protocol+llm: planners (server, call mode), as pairs."""


def slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)


def result_path(root: Path, key: str, label: str, planner: str, seed: int) -> Path:
    return root / key / "results" / slug(label) / f"{slug(planner)}-s{seed}.json"


def _stored(path: Path, world_hash: str, settings: Settings) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = (data.get("version") == RESULT_VERSION and data.get("world_hash") == world_hash
          and data.get("settings") == asdict(settings))
    return data if ok else None


# -- worker side -------------------------------------------------------------------------------------------------
# One loaded world per process and world key, reused by every class of that world the process is given: loading
# backends and the oracle's class baselines once per world is the point of running classes in long-lived workers.
_LOADED: dict[str, tuple[Any, Any, OracleJudge]] = {}


def exit_with_parent(parent: int, interval: float = 2.0, stop: Callable[[int], Any] = os._exit) -> threading.Thread:
    """Ends this worker once its parent, the benchmark process, is gone: a parent killed without the chance to shut
    its pool down (SIGTERM, SIGKILL) would otherwise leave workers spending images and model requests for nobody."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        stop(1)

    t = threading.Thread(target=watch, name="exit-with-parent", daemon=True)
    t.start()
    return t


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    exit_with_parent(os.getppid())


def prepare_world(key: str, world: World) -> dict[str, Any]:
    """Train and cache the world's networks unless shipped or cached; seconds spent."""
    from sleuth.tools.backends.toyworld.train import find_weights, state_dicts

    t0 = time.perf_counter()
    trained = find_weights(world) is None
    if trained:
        state_dicts(world)
    return {"world": key, "trained": trained, "seconds": round(time.perf_counter() - t0, 1)}


def _loaded(key: str, world: World, oracle_n: int, criterion: str) -> tuple[Any, Any, OracleJudge]:
    from sleuth.tools.backends.toyworld import Oracle, load_backends

    if key not in _LOADED or _LOADED[key][2].n != oracle_n:
        backends = load_backends(world)
        oracle = Oracle(world)
        _LOADED[key] = (backends, oracle, OracleJudge(oracle, oracle_n, criterion))
    return _LOADED[key]


def _names(caption: str, bug: Any, world: World) -> bool:
    from sleuth.agent.bench.discovery import names_bug

    return names_bug(caption, bug, world)


def fill_outcomes(data: dict[str, Any], world: World) -> bool:
    """Each planted bug's ``outcome`` in a run (its stage, see ``misses``) and the run's failure modes scored against
    the world (``modes.run_modes``), read from the run's transcript; False if the transcript is gone (the bugs keep no
    outcome)."""
    from sleuth.agent.bench.misses import stage_of
    from sleuth.agent.bench.modes import run_modes

    try:
        view = InvestigationView.from_transcript(data["transcript"])
    except (OSError, ValueError, TranscriptError):
        return False
    data["modes"] = run_modes(view, world)
    found = {f.get("bug") for f in data["findings"] if f.get("bug")}
    for b in data["bugs"]:
        bug = next((x for x in world.bugs if x.name == b["name"]), None)
        if bug is None:
            continue
        b["outcome"] = stage_of(view, partial(_names, bug=bug, world=world), b["name"] in found)
    return True


def run_class(job: ClassJob) -> list[dict[str, Any]]:
    """Every planner and seed on one class of one world: stored results reused, new ones run, judged and filed."""
    from sleuth.agent.bench.discovery import run_investigation

    world_hash = job.world.config_hash()
    s = job.settings
    out = []
    for planner in job.planners:
        for seed in job.seeds:
            path = result_path(job.root, job.key, job.label, planner, seed)
            stored = _stored(path, world_hash, s)
            if stored is not None:
                if (any("outcome" not in b for b in stored["bugs"]) or "modes" not in stored) and \
                        fill_outcomes(stored, job.world):
                    _write(path, stored)
                out.append(stored)
                continue
            backends, oracle, judge = _loaded(job.key, job.world, s.oracle_n, s.criterion)
            bugs = [b for b in oracle.bugs() if b.class_ == job.label]
            run_dir = job.root / job.key / "transcripts" / slug(planner) / f"{slug(job.label)}-s{seed}"
            shutil.rmtree(run_dir, ignore_errors=True)  # a run cut short before its result was filed
            rec = run_investigation(backends, job.label, seed, planner, budget=s.budget, baseline_n=s.baseline_n,
                                    run_dir=run_dir, criterion=s.criterion, llm=dict(job.llm))
            at = InvestigationView.from_transcript(rec.transcript).images_at_findings
            for f in rec.findings:
                f["oracle"] = judge.judge(job.label, f["caption"])
                named = [b.name for b in bugs if _names(f["caption"], b, job.world)]
                f["bug"] = named[0] if named and f["oracle"]["real"] else None
                f["images_until"] = at.get(f["finding_id"])
            planted = [{"name": b.name, "caption": b.caption, "confuser": b.confuser,
                        "oracle": judge.judge(job.label, b.caption, full=True)} for b in bugs]
            data = {"version": RESULT_VERSION, "world": job.key, "world_hash": world_hash, "settings": asdict(s),
                    "bug_free": job.bug_free, "bugs": planted, **asdict(rec)}
            fill_outcomes(data, job.world)
            _write(path, data)
            out.append(data)
    return out


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


# -- parent side -------------------------------------------------------------------------------------------------


def outcomes(runs: Sequence[dict[str, Any]]) -> list[BugOutcome]:
    """One outcome per planted bug per run."""
    out = []
    for r in runs:
        for b in r["bugs"]:
            hits = [f["images_until"] for f in r["findings"] if f.get("bug") == b["name"]]
            times = [t for t in hits if t is not None]
            out.append(BugOutcome(f"{r['world']}: {b['name']}", b["oracle"]["ratio"], bool(hits),
                                  min(times) if times else None))
    return out


def bug_stages(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every planted bug of ``runs`` with its oracle ratio and stage (runs whose transcripts were gone: none)."""
    return [{"bug": f"{r['world']}: {b['name']}", "ratio": b["oracle"]["ratio"], **b["outcome"]}
            for r in runs for b in r["bugs"] if "outcome" in b]


def summarise(runs: Sequence[dict[str, Any]], planners: Sequence[str], budget: int,
              edges: Sequence[float] = BANDS) -> dict[str, dict[str, Any]]:
    from sleuth.agent.bench.misses import miss_counts
    from sleuth.agent.bench.modes import mode_summary

    out = {}
    for p in planners:
        mine = [r for r in runs if r["planner"] == p]
        out[p] = {**planner_summary(mine, outcomes(mine), budget, edges), "misses": miss_counts(bug_stages(mine)),
                  "modes": mode_summary(mine)}
    return out


@dataclass
class MultiWorldBench:
    worlds: Sequence[WorldSpec]
    planners: Sequence[str]
    seeds: Sequence[int] = (0,)
    budget: int = 20_000
    baseline_n: int | None = None
    oracle_n: int = 10_000
    bug_free: int = 0
    classes: Sequence[str] | None = None
    jobs: int = field(default_factory=lambda: os.cpu_count() or 1)
    root: Path = Path("runs") / "bench"
    progress: Progress | None = None
    llm: dict[str, Any] = field(default_factory=dict)
    """Settings of the language model behind llm: and protocol+llm: planners (api_base, tool_choice, ...)."""

    def _tick(self, task: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(task, done, total)

    def run(self) -> dict[str, Any]:
        settings = Settings(self.budget, self.baseline_n, self.oracle_n)
        per_world = {w.key: bench_classes(w.world, self.bug_free, self.classes) for w in self.worlds}
        todo = {w.key: [ClassJob(w.key, w.world, label, free, tuple(self.planners), tuple(self.seeds), settings,
                                 self.root, tuple(sorted(self.llm.items()))) for label, free in per_world[w.key]]
                for w in self.worlds}
        total = sum(len(v) for v in todo.values())
        threads = max(1, (os.cpu_count() or 1) // max(1, self.jobs))
        runs: list[dict[str, Any]] = []
        prepared: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        # START_METHOD: spawn, not fork, since a process that has run torch (OpenMP threads) can deadlock a
        # forked child that runs torch too.
        with ProcessPoolExecutor(max_workers=self.jobs, initializer=_init_worker, initargs=(threads,),
                                 mp_context=multiprocessing.get_context(START_METHOD)) as pool:
            pending: dict[Future[Any], str] = {}
            for w in self.worlds:
                if todo[w.key]:
                    pending[pool.submit(prepare_world, w.key, w.world)] = "prepare"
            self._tick("class investigations", 0, total)
            done = 0
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    kind = pending.pop(fut)
                    result = fut.result()
                    if kind == "prepare":
                        prepared.append(result)
                        for job in todo[result["world"]]:
                            pending[pool.submit(run_class, job)] = "class"
                    else:
                        runs += result
                        done += 1
                        self._tick("class investigations", done, total)
        wall = time.perf_counter() - t0
        order = {(w.key, label): i for i, w in enumerate(self.worlds) for label, _ in per_world[w.key]}
        runs.sort(key=lambda r: (order[(r["world"], r["label"])], list(self.planners).index(r["planner"]), r["seed"]))
        return {
            "worlds": [{"name": w.key, "source": w.source, "config_hash": w.world.config_hash(),
                        "classes": [c for c, _ in per_world[w.key]],
                        "bug_free_classes": [c for c, free in per_world[w.key] if free],
                        "planted_bugs": len(w.world.bugs)} for w in self.worlds],
            "planners_run": list(self.planners), "seeds": list(self.seeds), "budget": self.budget,
            "baseline_n": self.baseline_n, "oracle_n": self.oracle_n, "jobs": self.jobs,
            "strength_bands": list(BANDS), "real_ratio": REAL_RATIO,
            "training": sorted(prepared, key=lambda p: str(p["world"])),
            "planners": summarise(runs, self.planners, self.budget),
            "wall_seconds": round(wall, 1), "runs": runs,
        }
