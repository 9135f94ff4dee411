"""`sleuth audit --executor ray`: classes at once on a local Ray cluster (2 CPUs, on 127.0.0.1) give the findings and
summary of the local executor; a worker killed mid-class, or the driver killed mid-audit, still gives them."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from sleuth.agent.audit import Audit, resolve_classes, slug, start
from sleuth.agent.audit.config import parse_config
from sleuth.agent.cli import main
from sleuth.agent.transcript import read_transcript, verify_transcript
from tests.compare import assert_equivalent_runs

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ["cat", "fly", "crayfish", "dog"]
# protocol-v2 stops once nothing plausible at 3x is left, so 400 images a class give findings to compare.
SETTINGS: dict[str, Any] = {"classes": CLASSES, "planner": {"name": "protocol-v2", "baseline_n": 60},
                            "budget": {"per_class": {"images": 400}}}
# Ray must reach nothing but this machine: no usage reports, every process on the loopback address.
QUIET_RAY = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# Wall-clock fields, where a run was (run_dir, transcript paths) and how it recovered: everything else must be equal.
VOLATILE_CLASS = {"seconds", "recovery"}

# The cluster tests need Ray; the command-line checks below do not. Ray is imported by the fixture, after QUIET_RAY
# is set: it reads those settings once, on import.
HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="Ray is not installed (pip install 'sleuth[ray]')")


def stable(summary: dict[str, Any]) -> dict[str, Any]:
    """An audit summary without its wall-clock and location fields."""
    out = {k: v for k, v in summary.items() if k not in ("run_dir", "seconds", "classes")}
    out["classes"] = [{k: v for k, v in c.items() if k not in VOLATILE_CLASS} for c in summary["classes"]]
    return out


def new_audit(run_dir: Path, **executor: Any) -> None:
    config = parse_config({**SETTINGS, "executor": executor} if executor else SETTINGS)
    start(run_dir, config, CLASSES)


def worker_env(tmp_path: Path, **extra: str) -> dict[str, Any]:
    """The workers' environment: a prediction cache of their own (so nothing is read from the local run's), this
    checkout on the path (for the crash hook), one thread (as the cluster's CPUs say)."""
    cache = tmp_path / f"cache-{uuid.uuid4().hex[:8]}"
    return {"env_vars": {"SLEUTH_CACHE": str(cache), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}}


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The same audit on the local executor, in this process."""
    run = tmp_path_factory.mktemp("local") / "audit"
    new_audit(run)
    config = parse_config(SETTINGS)
    backends = config.backends.build(load=True)
    assert resolve_classes(config, backends) == CLASSES
    # One torch thread, as each worker has (one CPU each): floats summed in the same order, and a faster run.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run, Audit(run, backends).run()
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """A local Ray cluster of 2 CPUs on 127.0.0.1, shared by the tests of this module."""
    old = {k: os.environ.get(k) for k in QUIET_RAY}
    os.environ.update(QUIET_RAY)
    import ray

    # Every worker process runs the crash hook, which does nothing unless a test's SLEUTH_CRASH_AT is set.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=100 * 1024**2, logging_level="error",
             runtime_env={"worker_process_setup_hook": "tests.crash.install_from_env",
                          "env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
        yield
    finally:
        ray.shutdown()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def assert_same_audit(run: Path, got: dict[str, Any], reference: tuple[Path, dict[str, Any]]) -> None:
    ref_dir, expected = reference
    assert stable(got) == stable(expected)
    assert got["findings"] and got["findings"] == expected["findings"]
    assert json.loads((run / "summary.json").read_text()) == got
    for c in expected["classes"]:
        # Event for event the same transcript, timestamps and hashes aside, and a valid chain.
        assert_equivalent_runs(read_transcript(run / c["transcript"]), read_transcript(ref_dir / c["transcript"]))
        assert verify_transcript(run / c["transcript"]).ok


@pytest.mark.e2e
@needs_ray
def test_a_ray_audit_on_two_workers_equals_the_local_audit(tmp_path, cluster, local_reference):
    run = tmp_path / "audit"
    new_audit(run, name="ray")
    from sleuth.agent.audit.on_ray import RayAudit

    reports: list[tuple[str, int, int]] = []
    ended: list[str] = []
    notes: list[str] = []
    audit = RayAudit(run, progress=lambda task, done, total: reports.append((task, done, total)),
                     on_class=lambda s: ended.append(s["class"]), on_note=notes.append,
                     runtime_env=worker_env(tmp_path))
    got = audit.run()
    assert notes == ["Ray: 2 workers, each with 1 CPU and 0 GPU, on a cluster of 2 CPUs and 0 GPUs; 4 classes to run"]
    assert_same_audit(run, got, local_reference)
    # Each class ran once, in a worker process (never here), and two workers shared the four classes.
    assert sorted(label for label, _, _ in audit.placements) == sorted(CLASSES)
    pids = {pid for _, _, pid in audit.placements}
    assert len(pids) == 2 and os.getpid() not in pids
    assert sorted(ended) == sorted(CLASSES)
    assert all(not c["recovery"]["resumed"] for c in got["classes"])
    # The driver showed each class's images and the classes done, to the end.
    for c in got["classes"]:
        bar = [(d, t) for task, d, t in reports if task == f"{c['class']}: images"]
        assert bar and bar[-1][0] == bar[-1][1] >= c["images"] > 0
    assert reports[-1] == ("audit: classes", 4, 4)
    # Resuming the finished audit runs nothing and changes nothing.
    again = RayAudit(run).run()
    assert stable(again) == stable(got)


@pytest.mark.e2e
@needs_ray
def test_a_worker_killed_mid_class_is_restarted_and_its_class_resumes_to_the_same_result(tmp_path, cluster,
                                                                                        local_reference):
    run = tmp_path / "audit"
    new_audit(run, name="ray", max_retries=2)
    marker = tmp_path / "killed"
    # The first worker to write its 40th event is SIGKILLed halfway through writing it (a torn line).
    env = worker_env(tmp_path, SLEUTH_CRASH_AT="torn:any:40", SLEUTH_CRASH_ONCE=str(marker))
    from sleuth.agent.audit.on_ray import RayAudit

    notes: list[str] = []
    audit = RayAudit(run, runtime_env=env, on_note=notes.append)
    got = audit.run()
    assert marker.is_file()
    killed_pid = int(marker.read_text())
    assert_same_audit(run, got, local_reference)
    # One class was cut: Ray restarted its worker (a new process) and the class resumed from its transcript, the
    # torn line moved aside; the others ran once.
    resumed = [c for c in got["classes"] if c["recovery"]["resumed"]]
    assert len(resumed) == 1
    (cut,) = resumed
    starts = [(host, pid) for label, host, pid in audit.placements if label == cut["class"]]
    assert len(starts) == 2 and starts[0][1] == killed_pid and starts[1][1] != killed_pid
    assert 0 < cut["recovery"]["events_found"] < cut["events"]
    assert [t["file"] for t in cut["recovery"]["torn_lines"]] == ["transcript.jsonl.torn-1"]
    assert len(audit.placements) == len(CLASSES) + 1
    assert notes[1:] == [f"{cut['class']}: its worker died; the class resumes from its transcript on {starts[1][0]} "
                     f"(pid {starts[1][1]}, attempt 2)"]


@pytest.mark.e2e
@needs_ray
def test_a_worker_that_dies_more_often_than_allowed_stops_the_audit_and_resume_finishes_it(tmp_path, cluster,
                                                                                            local_reference):
    run = tmp_path / "audit"
    new_audit(run, name="ray", max_retries=0)
    marker = tmp_path / "killed"
    env = worker_env(tmp_path, SLEUTH_CRASH_AT="after:tool_returned:5", SLEUTH_CRASH_ONCE=str(marker))
    from sleuth.agent.audit import AuditError
    from sleuth.agent.audit.on_ray import RayAudit

    with pytest.raises(AuditError, match=r"its worker died after 0 restarts, the most max_retries allows .*"
                                         r"continue with sleuth audit --resume") as err:
        RayAudit(run, runtime_env=env).run()
    label = str(err.value).split(":")[0]
    assert label in CLASSES and not (run / "summary.json").exists()
    assert not (run / slug(label) / "summary.json").exists() and (run / slug(label) / "transcript.jsonl").is_file()
    # Resumed (the crash hook fires once): the cut class continues from its transcript, and the audit is the same.
    got = RayAudit(run, runtime_env=env).run()
    assert_same_audit(run, got, local_reference)
    assert [c["class"] for c in got["classes"] if c["recovery"]["resumed"]] == [label]


# -- the driver killed mid-audit, then --resume ------------------------------------------------------------------


def own_ray_processes(tag: str) -> list[int]:
    """Processes started for this test (they inherit its tag in their environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if f"SLEUTH_TEST_TAG={tag}".encode() in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.e2e
@needs_ray
def test_the_driver_killed_mid_audit_resumes_with_resume_to_the_same_result(tmp_path, local_reference):
    tag = uuid.uuid4().hex
    env = {**os.environ, **QUIET_RAY, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "SLEUTH_TEST_TAG": tag,
           "SLEUTH_CACHE": str(tmp_path / "cache")}
    config = tmp_path / "audit.yaml"
    config.write_text(json.dumps(SETTINGS))
    run = tmp_path / "audit"
    cmd = [sys.executable, "-m", "sleuth", "audit"]
    driver = subprocess.Popen([*cmd, str(config), "--out", str(run), "--executor", "ray", "--workers", "2", "--json"],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        # Killed once a class has written 30 events and before any class has ended.
        while time.monotonic() < deadline and driver.poll() is None:
            lines = [len(p.read_bytes().splitlines()) for p in run.glob("*/transcript.jsonl")]
            if lines and max(lines) >= 30:
                break
            time.sleep(0.02)
        assert driver.poll() is None, driver.stderr.read().decode()[-2000:] if driver.stderr else ""
        # The driver and its whole local cluster die at once, as when the machine goes down.
        kill(own_ray_processes(tag))
        driver.wait(timeout=30)
        assert len(list(run.glob("*/summary.json"))) < len(CLASSES) and not (run / "summary.json").exists()
        # Resumed as it began (on Ray, as audit.json records): the same audit as the local one.
        proc = subprocess.run([*cmd, "--resume", str(run), "--json"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        got = json.loads(proc.stdout)
        assert_same_audit(run, got, local_reference)
        assert any(c["recovery"]["resumed"] for c in got["classes"])
    finally:
        if driver.poll() is None:
            driver.kill()
        # Whatever this test started and is still there (Ray's node agents outlive a SIGKILLed driver).
        kill(own_ray_processes(tag))


# -- what a Ray audit refuses, with or without Ray ------------------------------------------------------------


def test_a_ray_audit_refuses_totals_shared_in_order(tmp_path, capsys):
    config = tmp_path / "a.yaml"
    config.write_text(json.dumps({**SETTINGS, "budget": {"per_class": {"images": 400}, "total": {"images": 1000}}}))
    assert main(["audit", str(config), "--out", str(tmp_path / "x"), "--executor", "ray"]) == 2
    err = capsys.readouterr().err.strip()
    if not HAVE_RAY:
        assert "pip install 'sleuth[ray]'" in err
    else:
        assert "budget.total.images: an audit's totals are shared by its classes in order" in err
        assert "per_class.images: 250 for 1000 over 4 classes" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "x").exists()


def test_executor_flags_and_settings_are_checked(tmp_path, capsys):
    config = tmp_path / "a.yaml"
    config.write_text(json.dumps(SETTINGS))
    assert main(["audit", str(config), "--out", str(tmp_path / "x"), "--address", "auto"]) == 2
    assert "--address: Ray settings; add --executor ray" in capsys.readouterr().err
    assert main(["audit", str(config), "--out", "s3://bucket/audit", "--executor", "ray"]) == 2
    assert "run directories are paths, not URLs" in capsys.readouterr().err
    assert main(["audit", str(config), "--out", str(tmp_path / "x"), "--executor", "ray", "--memory", "lots"]) == 2
    assert "--memory: could not parse value and unit from byte string; got 'lots'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    with pytest.raises(Exception, match="executor: address: Ray settings; they need name: ray"):
        parse_config({**SETTINGS, "executor": {"address": "auto"}})
    # The executor is how an audit runs, not what it computes: its recorded config is the same either way.
    on_ray = parse_config({**SETTINGS, "executor": {"name": "ray", "num_gpus": 1, "memory": "8GB"}})
    assert on_ray.model_dump() == parse_config(SETTINGS).model_dump()
    assert (on_ray.executor.num_gpus, on_ray.executor.memory) == (1.0, 8_000_000_000)


def test_without_ray_the_error_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: importing it raises ImportError
    config = tmp_path / "a.yaml"
    config.write_text(json.dumps(SETTINGS))
    assert main(["audit", str(config), "--out", str(tmp_path / "x"), "--executor", "ray"]) == 2
    assert capsys.readouterr().err.strip() == ("sleuth audit: error: --executor ray needs Ray, which is not "
                                               "installed: pip install 'sleuth[ray]'")
    assert not (tmp_path / "x").exists()


@pytest.mark.e2e
@needs_ray
def test_a_worker_asking_for_a_gpu_the_cluster_lacks_is_refused(tmp_path, cluster):
    run = tmp_path / "audit"
    new_audit(run, name="ray", num_gpus=1)
    from sleuth.agent.audit.on_ray import RayAudit
    from sleuth.agent.errors import UsageError

    with pytest.raises(UsageError, match=r"the Ray cluster has 0 GPU in all; each worker asks for 1 \(--num-gpus 0"):
        RayAudit(run).run()
    assert not list(run.glob("*/transcript.jsonl"))


# -- what lets classes run at once: a clock file per class, a lock per class -----------------------------------


def test_each_class_keeps_its_own_clock_and_older_audits_clocks_are_read(tmp_path):
    from sleuth.agent.audit.budget import Clock

    t = [100.0]
    (tmp_path / "clock.json").write_text(json.dumps({"fly": 3.0}))  # an audit begun before per-class clocks
    a, b = Clock(tmp_path, now=lambda: t[0]), Clock(tmp_path, now=lambda: t[0])  # two processes at once
    a.start("cat")
    b.start("dog")
    t[0] += 5.0
    a.stop()
    t[0] += 2.0
    b.stop()
    assert json.loads((tmp_path / "cat" / "clock.json").read_text()) == {"seconds": 5.0}
    assert json.loads((tmp_path / "dog" / "clock.json").read_text()) == {"seconds": 7.0}
    fresh = Clock(tmp_path)
    assert (fresh.of("cat"), fresh.of("dog"), fresh.of("fly"), fresh.total()) == (5.0, 7.0, 3.0, 15.0)
    # A class resumed in a third process goes on from the seconds on disk.
    c = Clock(tmp_path, now=lambda: t[0])
    (tmp_path / "cat" / "clock.json").write_text(json.dumps({"seconds": 6.0}))
    c.start("cat")
    t[0] += 1.0
    assert c.of("cat") == 7.0


def test_a_class_lock_makes_a_second_process_wait(tmp_path):
    import threading

    from sleuth.agent.audit import class_lock

    entered = threading.Event()

    def second() -> None:
        with class_lock(tmp_path / "cat"):
            entered.set()

    with class_lock(tmp_path / "cat"):
        thread = threading.Thread(target=second)
        thread.start()
        assert not entered.wait(0.3)  # held: the second waits
    assert entered.wait(5)
    thread.join()
