"""`sleuth investigate` end to end on toyworld's default world: findings, JSON, errors, interruption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sleuth.agent.bench.discovery import names_bug
from sleuth.agent.cli import main
from sleuth.agent.transcript import read_transcript
from sleuth.tools.backends.toyworld import Oracle
from sleuth.tools.findings import FindingSummary

ROOT = Path(__file__).resolve().parents[1]


def investigate(capsys, tmp_path, *args: str) -> dict:
    code = main(["investigate", "--runs", str(tmp_path), "--json", *args])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


@pytest.mark.e2e
def test_the_demo_lists_no_finding_as_another_findings_phrasing(capsys, tmp_path):
    import re

    out = investigate(capsys, tmp_path, "--class", "cat")  # the demo: 20,000 images
    answer = read_transcript(out["transcript"])[-1].answer
    also = set(re.findall(r"'([^']+)'", " ".join(re.findall(r"(?:also|and) phrased ([^)]*)\)", answer))))
    recorded = {f["caption"] for f in out["findings"] if f["confirmed"]}
    # A phrasing tested at the end and confirmed on its own ("in the sky", failing as fox where the snow finding it
    # was read as fails as snow leopard) is a finding, no longer listed as another's phrasing.
    assert len(recorded) >= 10 and also and not recorded & also, sorted(recorded & also)
    # The answer names each failure mode once, as the modes table does.
    assert sorted(re.findall(r"\((m\d+)\) ", answer)) == sorted(m["mode_id"] for m in out["modes"])


@pytest.mark.e2e
def test_fly_investigation_confirms_the_planted_flower(capsys, tmp_path):
    out = investigate(capsys, tmp_path, "--class", "fly", "--budget", "6000")
    assert {"class", "images", "transcript", "findings"} <= set(out)
    # The protocol planner searches for weaker effects while images remain, and never past the budget.
    assert out["class"] == "fly" and 0 < out["images"] <= 6_000
    oracle = Oracle()
    bug = next(b for b in oracle.bugs() if b.class_ == "fly")
    # Found under whatever phrasing the planner tested, as the world's parser reads it (e.g. a potted plant).
    flower = [f for f in out["findings"] if names_bug(f["caption"], bug, oracle.world)]
    assert flower, [f["caption"] for f in out["findings"]]
    # Each finding in the one compact shape, with the failure mode that holds it; every mode in its own shape.
    assert all(set(f) == {*FindingSummary.model_fields, "mode_id"} for f in out["findings"])
    modes = {m["mode_id"]: m for m in out["modes"]}
    assert all(f["finding_id"] in modes[f["mode_id"]]["findings"] for f in out["findings"] if f["confirmed"])
    f = flower[0]
    d = f["discovery"]
    assert f["confirmed"] and d["adjusted_p"] < 0.05 and f["confirmation"]["adjusted_p"] < 0.05
    assert d["rate_ratio"] > 5 and d["rate_ratio_ci"][0] > 1
    assert d["hypothesis"]["k"] / d["hypothesis"]["n"] > d["baseline"]["k"] / d["baseline"]["n"]
    events = read_transcript(out["transcript"])
    assert events[0].kind == "run_started" and events[-1].kind == "run_finished"
    # A finding is written again when its counterfactual is added: one id per finding.
    assert len({e.finding_id for e in events if e.kind == "finding"}) == len(out["findings"])
    # Images of every failure the planner looked at are in the artifact store beside the transcript.
    refs = {r for e in events if e.kind == "tool_returned" for r in e.artifacts}
    assert refs and all((Path(out["transcript"]).parent / "artifacts" / r[:2] / f"{r}.png").is_file() for r in refs)


def test_max_seconds_stops_the_run_with_its_own_status_and_exit_1(capsys, tmp_path):
    code = main(["investigate", "--runs", str(tmp_path), "--json", "--class", "cat", "--max-seconds", "0.001"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["status"] == "time_limit"
    events = read_transcript(out["transcript"])
    assert sum(e.kind == "planner_turn" for e in events) == 1 and events[-1].status == "time_limit"


@pytest.mark.parametrize("args, message", [
    (["--class", "kat"], "Did you mean: cat"),
    (["--class", "cat", "--budget", "0"], "--budget"),
    (["--class", "cat", "--budget", "99999999"], "--budget"),
    (["--class", "cat", "--world", "no-such-world"], "not a packaged world"),
    (["--class", "cat", "--max-seconds", "-1"], "--max-seconds"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, args, message):
    assert main(["investigate", "--runs", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_malformed_world_config_is_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("classes: [cat\n")
    assert main(["investigate", "--runs", str(tmp_path), "--class", "cat", "--world", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "not valid YAML" in err and len(err.splitlines()) == 1


def test_ctrl_c_leaves_a_valid_transcript(tmp_path):
    # No prediction cache (a warm one, or a planner that stops early, could finish the run before the signal) and
    # the earlier protocol planner, which spends its whole budget: the run is still going when it is interrupted.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "SLEUTH_NO_CACHE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "sleuth", "investigate", "--class", "cat", "--quiet",
                             "--planner", "protocol-v1", "--budget", "200000", "--runs", str(tmp_path)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # A suite started in the background inherits SIGINT ignored; a terminal's run does not.
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # Wait until the run has captioned its first failures (every model it uses is loaded by then: a signal that
    # lands inside a C extension's weight loading may surface as that library's own error), then interrupt it as a
    # terminal's Ctrl-C would.
    deadline = time.time() + 120
    transcript = None
    while time.time() < deadline:
        found = list(tmp_path.glob("*/transcript.jsonl"))
        if found and any('"kind":"tool_returned"' in line and '"name":"caption_failures"' in line
                         for line in found[0].read_text().splitlines()):
            transcript = found[0]
            break
        time.sleep(0.05)
    assert transcript is not None, "the run wrote no events"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    events = read_transcript(transcript)
    assert events[-1].kind == "run_finished" and events[-1].status == "interrupted"


@pytest.mark.e2e  # a whole run or a simulation: over the fast tier's 5 seconds
def test_a_run_ends_in_one_screen_and_verbose_shows_every_step(capsys, tmp_path):
    """By default a run shows one progress line, then the failure modes, its tests by verdict, the answer key
    (--reveal) and the next command; -v streams every turn and ends with every finding and test."""
    args = ["investigate", "--class", "cat", "--budget", "1500", "--runs", str(tmp_path), "--reveal"]
    assert main(args) == 0
    screen = capsys.readouterr().out
    lines = screen.splitlines()
    assert len(lines) <= 60, screen
    assert "failure modes from" in lines[0] and "fails at least" in lines[1]
    assert "╭─ planner" not in screen and "→ measure_rate" not in screen  # no turn-by-turn stream
    counts = next(i for i, line in enumerate(lines) if line.startswith("Tests: "))
    assert "discovery (" in lines[counts] and "confirmation attempt" in lines[counts]
    assert counts < next(i for i, line in enumerate(lines) if line.startswith("Answer key"))
    assert "FOUND by mode m" in screen
    run = next(tmp_path.iterdir())
    assert f"Next: sleuth report {run} --open" in " ".join(screen.split())
    assert main([*args[:-1], "-v", "--runs", str(tmp_path / "v")]) == 0
    verbose = capsys.readouterr().out
    assert "╭─ planner" in verbose and "→ measure_rate" in verbose
    assert "confirmed findings (class baseline" in verbose and len(verbose.splitlines()) > 3 * len(lines)
