"""Calibration: how often each planner gets a false finding past the tools, where which captions are null is known.

Two kinds of classifier stand in for the model under audit (tools/backends/toyworld/null.py):

- **null**: errors independent of the image (a hash of its pixels picks a share ``failure_rate``). Every caption is
  null, so any confirmed finding is false.
- **partial-null**: the same, except that images whose scene has one attribute value (drawn per run from ``HOT``:
  night, dusk, fog, painting, sketch) fail at ``hot_rate``. A caption is null exactly when it does not make that
  value more likely than the class prompt does (computed from the world's priors, ``hot_share``); captions that
  name the value are real failures, which a good planner should confirm.

Every run counts, per stage, whether a null hypothesis got through: *discovery* (a null discovery test with a
final-family Holm-adjusted p <= alpha and a rate above its baseline: discovery is a screen and certifies nothing, so
this rate is shown for what it is), *confirmation* (a null caption's confirmation attempt significant at the
declared family's level), and *finding* (a null caption recorded). The guarantee is that the finding rate, and the
confirmation rate it rests on, stay at or below alpha for every planner, adversaries included
(``agent/planners/adversarial.py``). Each rate is k/n runs with a Clopper–Pearson 95% interval.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sleuth.tools import stats
from sleuth.tools.defaults import ALPHA

HOT: tuple[tuple[str, str], ...] = (("lighting", "night"), ("lighting", "dusk"), ("lighting", "fog"),
                                    ("domain", "painting"), ("domain", "sketch"))
"""Attribute values a partial-null classifier fails on: ones every class shows sometimes (priors 5–10%)."""

KINDS = ("null", "partial-null")
STAGES = ("discovery", "confirmation", "finding")

START_METHOD = "spawn"
"""How worker processes start (tests that patch module functions fork instead)."""


@dataclass(frozen=True)
class CalibrationJob:
    planner: str
    kind: str
    index: int
    world: str | None
    budget: int
    baseline_n: int | None
    failure_rate: float
    hot_rate: float
    alpha: float
    root: Path


_BACKENDS: dict[str | None, Any] = {}
_RENDERS: dict[str | None, Any] = {}


class RenderCache:
    """A generator that keeps what it rendered, by (prompt, seed), up to ``limit`` images (least recently used out).

    Null runs share their images: they all use investigation seed 0, and each run's classifier hashes the pixels
    with a salt of its own, so its errors are a fresh draw on the same images and the runs stay independent. (Not
    for partial-null runs: there the share of hot scenes in a fixed sample would be the same luck for every run.)"""

    def __init__(self, inner: Any, limit: int = 40_000) -> None:
        from collections import OrderedDict

        self._inner = inner
        self._kept: OrderedDict[tuple[str, int], Any] = OrderedDict()
        self.limit = limit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def generate(self, prompts: Any, seeds: Any) -> list[Any]:
        keys = [(p, int(s)) for p, s in zip(prompts, seeds)]
        missing = [i for i, k in enumerate(keys) if k not in self._kept]
        if missing:
            made = self._inner.generate([prompts[i] for i in missing], [seeds[i] for i in missing])
            for i, g in zip(missing, made):
                self._kept[keys[i]] = g
        out = []
        for k in keys:
            self._kept.move_to_end(k)
            out.append(self._kept[k])
        while len(self._kept) > self.limit:
            self._kept.popitem(last=False)
        return out


def _init_worker(threads: int) -> None:
    import torch

    from sleuth.agent.bench.multiworld import exit_with_parent

    torch.set_num_threads(threads)
    exit_with_parent(os.getppid())


def _toy(world: str | None) -> Any:
    from sleuth.tools.backends.toyworld import load_backends

    if world not in _BACKENDS:
        _BACKENDS[world] = load_backends(world)
    return _BACKENDS[world]


def calibration_run(job: CalibrationJob) -> dict[str, Any]:
    """One investigation against a (partial-)null classifier, and which stages let a null hypothesis through.

    Its result is filed beside its run folder (``<label>-<index>.json``) once it ends, and a calibration run again
    into the same root reuses it; a run folder without a filed result is what an interrupted calibration left, and
    is run again from the start (the run is deterministic)."""
    from sleuth.agent.bench.discovery import run_investigation
    from sleuth.tools.backends.base import Backends
    from sleuth.tools.backends.toyworld.config import load_world
    from sleuth.tools.backends.toyworld.null import (
        LedgerEditor,
        LedgerGenerator,
        NullClassifier,
        PartialNullClassifier,
        SceneLedger,
        hot_share,
    )

    toy = _toy(job.world)
    world = load_world(job.world)
    labels = list(toy.classifier.labels.labels)
    label = labels[job.index % len(labels)]
    hot: tuple[str, str] | None = None
    generator, editor = toy.generator, toy.editor
    seed = job.index % 65536
    if job.kind == "null":
        classifier: Any = NullClassifier(toy.classifier.labels, label, job.failure_rate, salt=job.index)
        generator = _RENDERS.setdefault(job.world, RenderCache(toy.generator))
        seed = 0
    else:
        hot = HOT[job.index % len(HOT)]
        ledger = SceneLedger()
        generator, editor = LedgerGenerator(toy.generator, ledger), LedgerEditor(toy.editor, ledger)
        classifier = PartialNullClassifier(toy.classifier.labels, label, ledger, hot[0], hot[1], job.failure_rate,
                                           job.hot_rate, salt=job.index)
    backends = Backends(generator=generator, classifier=classifier, captioner=toy.captioner, embedder=toy.embedder,
                        editor=editor, class_prompt=toy.class_prompt)
    run_dir = job.root / job.planner / job.kind / f"{label.replace(' ', '-')}-{job.index}"
    filed = run_dir.parent / f"{run_dir.name}.json"
    if filed.exists():
        done: dict[str, Any] = json.loads(filed.read_text())
        return done
    if run_dir.exists():
        shutil.rmtree(run_dir)
    record, inv = run_investigation(backends, label, seed, job.planner, budget=job.budget, baseline_n=job.baseline_n,
                                    alpha=job.alpha, with_investigation=True, run_dir=run_dir)
    base_share = hot_share(world, inv.class_prompt, *hot) if hot else 0.0

    def null(caption: str) -> bool:
        return hot is None or hot_share(world, caption, *hot) <= base_share + 1e-12

    def up(t: Any) -> bool:
        return bool(t.k1 * t.n0 > t.k0 * t.n1)

    rate_tests = [t for t in inv.tests if t.kind == "rate"]
    through = {
        "discovery": any(t.purpose == "discovery" and t.adjusted_p <= job.alpha and up(t) and null(t.caption)
                         for t in rate_tests),
        "confirmation": any(t.purpose == "confirmation" and t.adjusted_p <= job.alpha and up(t) and null(t.caption)
                            for t in rate_tests),
        "finding": any(f.confirmed and null(f.caption) for f in inv.findings),
    }
    real = [f.caption for f in inv.findings if f.confirmed and not null(f.caption)]
    result = {"planner": job.planner, "kind": job.kind, "index": job.index, "label": label,
            "hot": "=".join(hot) if hot else None, "status": record.status, "images": record.images,
            "seconds": record.seconds, "through": through,
            "false_findings": [f.caption for f in inv.findings if f.confirmed and null(f.caption)],
            "false_finding_p": [f.confirmation.adjusted_p for f in inv.findings if f.confirmed and null(f.caption)],
            "real_findings": real, "confirmations": inv.confirmations_used,
            "discovery_tests": sum(t.purpose == "discovery" for t in rate_tests)}
    partial = filed.parent / f"{filed.name}.part"
    partial.write_text(json.dumps(result))
    partial.replace(filed)
    return result


def _rate(k: int, n: int) -> dict[str, Any]:
    r = stats.binomial_rate(k, n, method="clopper-pearson")
    return {"k": k, "n": n, "rate": r.rate, "ci": [r.low, r.high]}


AUDIT_CLASSES = 12
"""Null runs are grouped into audits of this many classes, in run order, for the audit-level rate."""


def null_audits(runs: list[dict[str, Any]], alpha: float, classes: int = AUDIT_CLASSES) -> dict[str, Any]:
    """Null runs taken ``classes`` at a time as the classes of one audit (the runs are independent, like an audit's
    classes): how many audits list a false finding as audit-significant (``agent.audit.summary.audit_family``:
    Bonferroni over the classes' declared confirmation families), and how many list one at all."""
    from sleuth.agent.audit.summary import audit_family

    groups = [runs[i:i + classes] for i in range(0, len(runs) - classes + 1, classes)]
    significant = listed = 0
    for g in groups:
        findings = [{"confirmation": {"adjusted_p": p}} for r in g for p in r.get("false_finding_p", [])]
        audit_family(findings, classes, alpha)
        significant += any(f["audit_significant"] for f in findings)
        listed += bool(findings)
    return {"classes": classes, "audit_significant": _rate(significant, len(groups)),
            "any_finding": _rate(listed, len(groups))}


def summarise_calibration(runs: list[dict[str, Any]], planners: list[str], alpha: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in planners:
        per: dict[str, Any] = {}
        for kind in KINDS:
            rs = [r for r in runs if r["planner"] == p and r["kind"] == kind]
            if not rs:
                continue
            per[kind] = {stage: _rate(sum(r["through"][stage] for r in rs), len(rs)) for stage in STAGES}
            per[kind]["images_per_run"] = round(sum(r["images"] for r in rs) / len(rs))
            per[kind]["seconds_per_run"] = round(sum(r["seconds"] for r in rs) / len(rs), 2)
            if kind == "partial-null":
                per[kind]["runs_with_a_real_finding"] = _rate(sum(bool(r["real_findings"]) for r in rs), len(rs))
            per[kind]["errors"] = sum(r["status"] == "error" for r in rs)
            if kind == "null" and len(rs) >= AUDIT_CLASSES:
                per[kind]["audits"] = null_audits(rs, alpha)
        out[p] = per
    held = all(v["finding"]["rate"] <= alpha and v["confirmation"]["rate"] <= alpha
               for per in out.values() for v in per.values())
    return {"planners": out, "alpha": alpha, "held": held}


@dataclass
class Calibration:
    """``runs`` investigations per planner and kind of classifier, over the world's classes in turn."""

    runs: int = 50
    planners: list[str] = field(default_factory=lambda: ["protocol"])
    kinds: tuple[str, ...] = KINDS
    world: str | None = None
    failure_rate: float = 0.05
    hot_rate: float = 0.3
    budget: int = 6000
    baseline_n: int | None = None
    alpha: float = ALPHA
    jobs: int = 1
    root: Path = Path("runs") / "calibrate"
    progress: Any = None

    def run(self) -> dict[str, Any]:
        jobs = [CalibrationJob(p, kind, i, self.world, self.budget, self.baseline_n, self.failure_rate,
                               self.hot_rate, self.alpha, self.root)
                for p in self.planners for kind in self.kinds for i in range(self.runs)]
        t0 = time.perf_counter()
        runs: list[dict[str, Any]] = []
        tick = (lambda d: self.progress("calibration runs", d, len(jobs))) if self.progress else (lambda d: None)
        tick(0)
        if self.jobs <= 1:
            _init_worker(max(1, os.cpu_count() or 1))
            for j in jobs:
                runs.append(calibration_run(j))
                tick(len(runs))
        else:
            threads = max(1, (os.cpu_count() or 1) // self.jobs)
            # START_METHOD: spawn, not fork, since a process that has run torch (OpenMP threads) can deadlock a
        # forked child that runs torch too.
            with ProcessPoolExecutor(max_workers=self.jobs, initializer=_init_worker, initargs=(threads,),
                                     mp_context=multiprocessing.get_context(START_METHOD)) as pool:
                for fut in as_completed([pool.submit(calibration_run, j) for j in jobs]):
                    runs.append(fut.result())
                    tick(len(runs))
        runs.sort(key=lambda r: (self.planners.index(r["planner"]), KINDS.index(r["kind"]), r["index"]))
        return {"world": self.world or "default", "runs_per_planner_and_kind": self.runs, "budget": self.budget,
                "baseline_n": self.baseline_n, "null_failure_rate": self.failure_rate, "hot_rate": self.hot_rate,
                "hot_values": ["=".join(h) for h in HOT], **summarise_calibration(runs, self.planners, self.alpha),
                "images": sum(r["images"] for r in runs), "seconds": round(time.perf_counter() - t0, 1),
                "runs": runs}
