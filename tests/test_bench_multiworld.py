"""The many-world benchmark's plumbing: worker processes, results filed per class, resumption, the command.

Investigations and the oracle are replaced by fakes here (the workers are forked, so they inherit the fakes): these
tests check what the benchmark does with runs, in seconds. tests/test_bench.py runs real investigations.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sleuth.agent.bench import discovery, multiworld
from sleuth.agent.bench.discovery import RunRecord
from sleuth.agent.bench.worlds import parse_worlds
from sleuth.agent.cli import main
from sleuth.tools.backends.toyworld import Oracle

WORLDS = "random:2"


def _bug_captions() -> dict[tuple[str, str], str]:
    out = {}
    for spec in parse_worlds(WORLDS):
        for b in Oracle(spec.world).bugs():
            out[(spec.world.name, b.class_)] = b.caption
    return out


CAPTIONS = _bug_captions()


class FakeJudge:
    """Real (8x) for a bug's own caption, not real (1.0x) for anything else."""

    def __init__(self, world: str) -> None:
        self.world = world

    def judge(self, label: str, caption: str, full: bool = False) -> dict:
        real = CAPTIONS.get((self.world, label)) == caption
        ratio = 8.0 if real else 1.0
        return {"ratio": ratio, "ratio_ci": [ratio * 0.8, ratio * 1.25], "real": real, "stage": "full"}


def fake_prepare(key, world):
    return {"world": key, "trained": False, "seconds": 0.0}


def fake_loaded(key, world, oracle_n, criterion):
    return None, Oracle(world), FakeJudge(world.name)


def fake_investigation(backends, label, seed, planner, *, budget, baseline_n, run_dir, criterion="top1", llm=None):
    """protocol confirms the planted bug after 3,000 images, then a false finding; wiles confirms only the false one."""
    from sleuth.agent.events import Finding, RunStarted, ToolReturned
    from sleuth.agent.transcript import TranscriptWriter
    from sleuth.tools import stats
    from sleuth.tools.findings import Evidence

    run_dir.mkdir(parents=True, exist_ok=True)
    world = run_dir.parent.parent.parent.name
    bug = CAPTIONS[(world, label)]
    ev = Evidence(test_id="t", hypothesis=stats.binomial_rate(9, 30), baseline=stats.binomial_rate(3, 300),
                  rate_ratio=stats.rate_ratio(9, 30, 3, 300), p_value=1e-4, adjusted_p=1e-3, kind="confirmation")

    def finding(fid: str, caption: str) -> Finding:
        return Finding(finding_id=fid, finding={"finding_id": fid, "caption": caption, "summary": "", "confirmed": True,
                                                "discovery": ev.model_dump(mode="json"),
                                                "confirmation": ev.model_dump(mode="json")})

    def used(n: int) -> ToolReturned:
        return ToolReturned(call_id=str(n), name="measure_rate", ok=False, images_used=n)

    false = f"a realistic photograph of a {label}. it is in a bathroom."
    findings = [{"finding_id": "f2", "caption": false}]
    events = [RunStarted(run_id="r", command="investigate", planner=planner, config={"llm": llm or {}}), used(1000),
              used(2000)]
    if planner == "protocol":
        findings.insert(0, {"finding_id": "f1", "caption": bug})
        events.append(finding("f1", bug))
    events += [used(500), finding("f2", false)]
    transcript = run_dir / "transcript.jsonl"
    with TranscriptWriter(transcript) as writer:
        for e in events:
            writer.append(e)
    return RunRecord(planner, label, seed, "finished", 3500, 1.5, str(transcript), findings)


@pytest.fixture
def fakes(monkeypatch):
    monkeypatch.setattr(multiworld, "START_METHOD", "fork")  # the workers must see the patches
    monkeypatch.setattr(multiworld, "prepare_world", fake_prepare)
    monkeypatch.setattr(multiworld, "_loaded", fake_loaded)
    monkeypatch.setattr(discovery, "run_investigation", fake_investigation)


def _bench(root: Path) -> dict:
    return multiworld.MultiWorldBench(worlds=parse_worlds(WORLDS), planners=["protocol", "wiles"], budget=6000,
                                      jobs=2, root=root).run()


def test_bench_over_worlds_in_two_processes_scores_every_planted_bug(fakes, tmp_path):
    out = _bench(tmp_path)
    p, w = out["planners"]["protocol"], out["planners"]["wiles"]
    assert (p["bugs_found"], p["bugs_planted"]) == (10, 10) and (w["bugs_found"], w["bugs_planted"]) == (0, 10)
    assert (p["false_confirmed"], p["confirmed_findings"]) == (10, 20) and w["false_confirmed"] == 10
    assert p["images_until_confirmed"] == {"median": 3000.0, "p90": 3000.0, "n": 10}
    assert [c["k"] for c in p["recall_vs_budget"]] == [0, 10, 10, None, None]
    assert p["recall_by_strength"] == {"5-10x": {"k": 10, "n": 10, "rate": 1.0, "ci": p["recall"]["ci"]}}
    assert p["images_per_class"]["median"] == 3500 and p["runs"] == 10
    assert [r["world"] for r in out["runs"]][:10] == ["random-0"] * 10
    files = sorted((tmp_path / "random-1" / "results").rglob("*.json"))
    assert len(files) == 10
    stored = json.loads(files[0].read_text())
    assert stored["world_hash"] == parse_worlds("random:2")[1].world.config_hash()


def _stamps(root: Path) -> dict[Path, int]:
    return {f: f.stat().st_mtime_ns for f in root.rglob("results/*/*.json")}


def test_an_interrupted_bench_reuses_what_it_filed(fakes, tmp_path):
    first = _bench(tmp_path)
    # One class's result lost (as if the bench had stopped before it): only that one runs again.
    lost = next((tmp_path / "random-0" / "results").iterdir()) / "wiles-s0.json"
    lost.unlink()
    before = _stamps(tmp_path)
    again = multiworld.MultiWorldBench(worlds=parse_worlds(WORLDS), planners=["protocol", "wiles"], budget=6000,
                                       jobs=1, root=tmp_path).run()
    after = _stamps(tmp_path)
    assert set(after) - set(before) == {lost} and all(after[f] == t for f, t in before.items())
    assert again["planners"] == first["planners"]
    # Other settings are other results: every one runs again.
    multiworld.MultiWorldBench(worlds=parse_worlds("random:1"), planners=["wiles"], budget=5000, jobs=1,
                               root=tmp_path).run()
    rerun = _stamps(tmp_path)
    changed = [f for f in rerun if rerun[f] != after[f]]
    assert len(changed) == 5 and all(f.name == "wiles-s0.json" and "random-0" in str(f) for f in changed)


def test_bench_command_prints_the_table_and_json(fakes, capsys, tmp_path):
    assert main(["bench", "discovery", "--worlds", WORLDS, "--planners", "protocol,wiles", "--budget", "6000",
                 "--jobs", "2", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "protocol" in text and "10/10" in text and "Recall by strength" in text
    assert main(["bench", "discovery", "--worlds", WORLDS, "--planners", "protocol", "--llm", "openai/x",
                 "--budget", "6000", "--out", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["planners_run"] == ["protocol", "llm:openai/x"]
    assert json.loads((tmp_path / "bench.json").read_text())["planners"] == out["planners"]


def test_bench_runs_the_protocol_planner_with_a_proposing_model_on_its_server(fakes, capsys, tmp_path):
    assert main(["bench", "discovery", "--worlds", WORLDS, "--planners", "protocol,protocol+llm:openai/x",
                 "--api-base", "http://127.0.0.1:9/v1", "--tool-choice", "required", "--budget", "6000",
                 "--jobs", "1", "--out", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["planners_run"] == ["protocol", "protocol+llm:openai/x"]
    # Every class's investigation was handed the model's settings (run_investigation applies them to the planners
    # that name a model only).
    from sleuth.agent.transcript import read_transcript

    seen = [e.config for f in tmp_path.glob("*/transcripts/*/*/transcript.jsonl") for e in read_transcript(f)
            if e.kind == "run_started"]
    assert len(seen) == 20 and all(c["llm"] == {"api_base": "http://127.0.0.1:9/v1", "tool_choice": "required"}
                                   for c in seen)
    assert not discovery.uses_llm("protocol") and discovery.uses_llm("protocol+llm:openai/x")
    assert discovery.uses_llm("llm:openai/x")


@pytest.mark.parametrize("argv, words", [
    (["--worlds", "random:x"], "random:N"),
    (["--planners", "protocol,nosuch"], "unknown planner(s) nosuch"),
    (["--planners", "llm"], "unknown planner(s) llm"),
    (["--planners", "protocol+llm"], "unknown planner(s) protocol+llm"),
    (["--planners", "protocol", "--api-base", "http://127.0.0.1:9/v1"], "--api-base is for a planner with a language"),
    (["--jobs", "0"], "--jobs must be between 1 and 256"),
    (["--world", "default", "--worlds", "random:1"], "not both"),
    (["--calibrate", "--worlds", "random:2"], "--calibrate runs on one world"),
])
def test_bench_command_refuses_bad_input_in_one_line(capsys, argv, words, tmp_path):
    assert main(["bench", "discovery", *argv, "--out", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert words in err


def test_a_worker_ends_once_the_benchmark_process_is_gone():
    import os

    stopped: list[int] = []
    gone = multiworld.exit_with_parent(-1, interval=0.01, stop=stopped.append)  # not this process's parent
    gone.join(timeout=5)
    assert stopped == [1] and not gone.is_alive()
    alive = multiworld.exit_with_parent(os.getppid(), interval=0.01, stop=stopped.append)
    alive.join(timeout=0.1)
    assert alive.is_alive() and stopped == [1]  # still watching: its parent is there
