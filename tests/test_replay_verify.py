"""`sleuth replay --verify` and `--fork`: committed transcripts re-run to zero mismatches; tampering is named by line;
forks share their prefix byte for byte and continue validly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sleuth.agent.cli import main
from sleuth.agent.events import ToolCall, event_hash
from sleuth.agent.planners.scripted import ScriptedPlanner
from sleuth.agent.replay.rebuild import verify_run
from sleuth.agent.replay.verify import ACCEPTED
from sleuth.agent.runner import Turn
from sleuth.agent.transcript import read_transcript, verify_transcript
from sleuth.tools.stats import binomial_rate
from tests.compare import assert_equivalent_runs
from tests.fakeworld import fake_backends, new_session
from tests.othermachine import another_machine

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "transcripts"
EXAMPLE = COMMITTED / "investigate-fly-s0" / "transcript.jsonl"
AUDIT_FLY = COMMITTED / "audit-fly-cat" / "fly" / "transcript.jsonl"
VOLATILE = {"ts", "hash", "prev_hash", "duration_s"}


@pytest.mark.e2e
def test_every_committed_transcript_verifies_and_every_conclusion_holds(capsys):
    found = sorted(COMMITTED.rglob("transcript.jsonl"))
    assert EXAMPLE in found and AUDIT_FLY in found
    started = read_transcript(EXAMPLE)[0]
    assert (started.command, started.planner, started.config["class"]) == ("investigate", "protocol", "fly")
    assert main(["replay", "--verify", str(COMMITTED), "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert sorted(Path(r["transcript"]) for r in reports) == found
    for r in reports:
        # On the machine that recorded them: identical. On any other: at worst drifted, never a changed conclusion.
        assert r["ok"] and r["status"] in ACCEPTED and r["chain_error"] is None, r["transcript"]
        assert not [d for d in r["differences"] if d["kind"] == "different"] and r["tampered"] == []
        assert r["calls"] > 20 and r["unfinished"] == 0 and r["skipped"] == []
        assert r["calls"] == sum(e.kind == "tool_called" for e in read_transcript(r["transcript"]))
        assert sum(r["by_call"].values()) == r["calls"]


@pytest.mark.e2e
def test_on_another_machine_a_transcript_is_equivalent_or_drifted_with_its_conclusions_held(monkeypatch, capsys):
    with another_machine(monkeypatch):
        assert main(["replay", "--verify", str(EXAMPLE), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert main(["replay", "--verify", str(AUDIT_FLY), "--width", "250"]) == 0
        out = capsys.readouterr().out
        # Byte for byte, it is not the same run.
        assert main(["replay", "--verify", str(AUDIT_FLY), "--strict"]) == 1
        capsys.readouterr()
    assert report["ok"] and report["status"] in ("equivalent", "drifted") and report["chain_error"] is None
    assert report["by_call"]["different"] == 0 and report["by_call"]["identical"] < report["calls"]
    images = [d for d in report["differences"] if d["note"].startswith("image within tolerance")]
    # Compared by pixels (the artifacts are kept beside the transcript), edited images included.
    assert images and all(d["kind"] == "equivalent" for d in images)
    assert any(".flips[" in d["path"] for d in images)
    calls = sum(e.kind == "tool_called" for e in read_transcript(AUDIT_FLY))
    assert f"{calls} tool calls re-run: " in out and "images within 2 grey levels" in out
    assert "every conclusion held" in out or "(within tolerance)" in out


def _measure_line(lines: list[bytes]) -> int:
    """0-based index of the first successful measure_rate result."""
    return next(i for i, raw in enumerate(lines)
                if b'"kind":"tool_returned"' in raw and b'"name":"measure_rate"' in raw and b'"ok":true' in raw)


def _forged(lines: list[bytes]) -> bytes:
    """The lines with the hash chain recomputed, as a forger who knows the format would."""
    prev = ""
    forged = []
    for raw in lines:
        o = json.loads(raw)
        o["prev_hash"] = prev
        o["hash"] = prev = event_hash(o)
        forged.append(json.dumps(o, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")
    return b"".join(forged)


@pytest.mark.e2e
def test_a_tampered_count_is_named_by_line_and_a_count_that_flips_a_verdict_fails(tmp_path, capsys):
    lines = AUDIT_FLY.read_bytes().split(b"\n")[:-1]
    i = _measure_line(lines)
    obj = json.loads(lines[i])
    k = obj["result"]["hypothesis"]["failures"]["k"]
    obj["result"]["hypothesis"]["failures"]["k"] = k + 1
    tampered = [*lines[:i], json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode(), *lines[i + 1:]]
    copy = tmp_path / "tampered.jsonl"
    copy.write_bytes(b"".join(line + b"\n" for line in tampered))

    assert main(["replay", "--verify", str(copy), "--width", "250"]) == 1
    out = capsys.readouterr().out
    assert f"line {i + 1}: hash mismatch: the line was changed after it was written" in out
    assert f"line {i + 1}: measure_rate ({obj['call_id']}): result.hypothesis.failures: {k + 1}/" in out
    assert "recorded numbers contradict each other" in out and "tampered (TAMPERED)" in out
    assert f"line {i + 1}: measure_rate ({obj['call_id']}): drifted: result.hypothesis.failures.k: recorded " \
           f"{k + 1}, re-run gives {k} (-1)" in out

    # A forger who re-hashes the chain passes the chain check; the numbers still contradict each other.
    copy.write_bytes(_forged(tampered))
    assert verify_transcript(copy).ok
    assert main(["replay", "--verify", str(copy), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["chain_error"] is None and report["status"] == "tampered" and not report["ok"]

    # A careful forger makes the numbers consistent and flips the verdict: the re-run changes a conclusion.
    j, res = next((j, r) for j, r in ((j, json.loads(raw)) for j, raw in enumerate(lines))
                  if r.get("name") == "measure_rate" and r.get("ok") and r["result"]["verdict"] != "supported"
                  and r["result"].get("hypothesis"))
    n = res["result"]["hypothesis"]["failures"]["n"]
    res["result"]["hypothesis"]["failures"] = binomial_rate(n - 1, n).model_dump(mode="json")
    res["result"]["verdict"] = "supported"
    lines[j] = json.dumps(res, separators=(",", ":"), ensure_ascii=False).encode()
    copy.write_bytes(_forged(lines))
    assert main(["replay", "--verify", str(copy), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "different" and report["tampered"] == [] and report["chain_error"] is None
    changed = [d for d in report["differences"] if d["kind"] == "different"]
    assert [(d["line"], d["path"], d["recorded"]) for d in changed] == [(j + 1, "conclusion.verdict", "supported")]
    assert changed[0]["replayed"] in ("not supported", "inconclusive")


@pytest.mark.e2e
def test_fork_of_the_example_at_an_early_event_with_the_protocol_planner(tmp_path, capsys):
    out = tmp_path / "fork"
    assert main(["replay", str(EXAMPLE), "--fork", "5", "--planner", "protocol", "--out", str(out), "--quiet"]) == 0
    said = capsys.readouterr().out
    assert "keeps lines 1..4" in said and "shares lines 1..4" in said
    fork = out / "transcript.jsonl"
    assert verify_transcript(fork).ok
    src_lines = EXAMPLE.read_bytes().split(b"\n")
    new_lines = fork.read_bytes().split(b"\n")
    assert new_lines[:4] == src_lines[:4] and new_lines[4] != src_lines[4]  # shared prefix, then its own events
    events = read_transcript(fork)
    assert events[-1].kind == "run_finished" and events[-1].status == "completed"
    assert json.loads((out / "fork.json").read_text())["kept_lines"] == 4
    assert "does not reproduce" not in said  # the recorded first turn is the planner's own: it goes on from there
    assert sum(e.kind == "finding" for e in events) >= 1 and events[-1].n_findings >= 1


@pytest.mark.e2e
def test_fork_with_recorded_turns_reruns_a_session_without_any_model(tmp_path, capsys):
    out = tmp_path / "rerun"
    assert main(["replay", str(AUDIT_FLY), "--fork", "30", "--planner", "replay", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    # Recorded on another machine, perhaps: results within the tolerance policy, counts drifting at most.
    assert_equivalent_runs(read_transcript(out / "transcript.jsonl"), read_transcript(AUDIT_FLY),
                           allow=("equivalent", "drifted"))
    # Line 30 falls inside a turn that starts before it (the screening turn, one look per candidate): the prefix
    # ends before that turn.
    events = read_transcript(AUDIT_FLY)
    starts = [i for i, e in enumerate(events) if e.kind == "planner_turn"]
    inside = max(i for i in starts if i < 29)
    assert inside < 28 and min(i for i in starts if i > inside) > 30
    keep = json.loads((out / "fork.json").read_text())["kept_lines"]
    assert keep == inside and events[keep].kind == "planner_turn"
    assert (out / "transcript.jsonl").read_bytes().split(b"\n")[:keep] == AUDIT_FLY.read_bytes().split(b"\n")[:keep]


@pytest.mark.e2e
def test_fork_with_a_different_planner_setting_starts_afresh_on_the_rebuilt_state(tmp_path, capsys):
    out = tmp_path / "other"
    assert main(["replay", str(AUDIT_FLY), "--fork", "9", "--baseline-n", "300", "--out", str(out), "--quiet"]) == 0
    said = capsys.readouterr().out
    assert "does not reproduce the recorded turns (line 2" in said
    events = read_transcript(out / "transcript.jsonl")
    assert verify_transcript(out / "transcript.jsonl").ok and events[-1].status == "completed"
    assert (out / "transcript.jsonl").read_bytes().split(b"\n")[:9] == AUDIT_FLY.read_bytes().split(b"\n")[:9]
    # The new procedure's baseline (300 images) pools with the recorded one: the family and budget carry over.
    assert events[9].tool_calls[0].arguments == {"prompt": "a realistic photograph of a fly", "n": 300}


def test_replay_renders_numbered_events_with_rates_intervals_and_verdicts(capsys):
    assert main(["replay", str(AUDIT_FLY), "--width", "160"]) == 0
    out = capsys.readouterr().out
    assert "   3 → generate_and_classify(prompt='a realistic photograph of a fly', n=200)" in out
    events = read_transcript(AUDIT_FLY)
    base = events[3].result["summary"]["failures"]
    assert f"failures {base['k']}/{base['n']} = {100 * base['k'] / base['n']:.1f}% [{100 * base['low']:.1f}–" in out
    m = next(e.result for e in events if e.kind == "tool_returned" and e.name == "measure_rate" and e.ok)
    rr = m["rate_ratio"]
    assert f"rate ratio  {rr['ratio']:.3g}× [{rr['low']:.3g}, {rr['high']:.3g}]" in out
    assert f"{m['test_id']} {m['verdict']}  discovery" in out and "holm-adjusted" in out
    assert f"{len(events)} events, hash chain verified." in out
    # ... and ends with the run's failure modes, strongest first, as the run ended.
    modes = {e.mode_id for e in events if e.kind == "mode"}
    tail = out[out.index("events, hash chain verified."):]
    assert f"{len(modes)} failure modes, strongest first" in tail
    assert all(f"\n{m} " in tail for m in modes)


def test_llm_perturbations_are_not_rerun_and_a_cut_run_reports_its_unfinished_call(tmp_path):
    cat = "a realistic photograph of a cat"
    s = new_session(fake_backends(), tmp_path / "run")
    reply = {"edits": [{"type": "background", "edit": "+ snow", "caption": f"{cat}. it is in the snow."}]}
    s.ctx.llm = lambda prompt: json.dumps(reply)
    perturb = ToolCall(id="a", name="perturb_caption", arguments={"caption": cat, "types": ["background"]})
    sample = ToolCall(id="b", name="generate_and_classify", arguments={"prompt": cat, "n": 60})
    turns = [Turn(tool_calls=[perturb, sample]),
             Turn(tool_calls=[ToolCall(id="c", name="finish", arguments={"summary": "done"})])]
    s.run(ScriptedPlanner(turns))
    report = verify_run(s.transcript, backends=fake_backends())
    assert report.ok and report.calls == 2 and [x.tool for x in report.skipped] == ["perturb_caption"]
    assert "LLM" in report.skipped[0].reason
    # Cut after the second call started: nothing to compare for it, nothing wrong either.
    lines = s.transcript.read_bytes().split(b"\n")
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"\n".join(lines[:5]) + b"\n")
    r = verify_run(cut, backends=fake_backends())
    assert r.ok and r.unfinished == 1 and r.calls == 0 and len(r.skipped) == 1


@pytest.mark.parametrize("args, message", [
    (["--verify", "--fork", "3"], "separate actions"),
    (["--fork", "0"], "at least 1"),
    (["--fork", "100000"], "has only"),
])
def test_bad_replay_flags(args, message, capsys):
    assert main(["replay", str(AUDIT_FLY), *args]) == 2
    assert message in capsys.readouterr().err
