"""`sleuth runs`: a table of the runs in a folder, newest first, read from their transcripts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sleuth.agent.cli import main
from sleuth.agent.runs import find_runs, read_run
from sleuth.agent.transcript import read_transcript
from sleuth.agent.view import InvestigationView

EXAMPLES = Path(__file__).resolve().parents[1] / "transcripts"


@pytest.fixture()
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    root.mkdir()
    shutil.copytree(EXAMPLES / "investigate-fly-s0", root / "fly-run", ignore=shutil.ignore_patterns("artifacts"))
    shutil.copytree(EXAMPLES / "audit-fly-cat", root / "audit1", ignore=shutil.ignore_patterns("artifacts"))
    # A run cut short: its last lines (the end of the run) were never written, and the last one is torn.
    cut = root / "cut-run"
    cut.mkdir()
    lines = (EXAMPLES / "investigate-fly-s0" / "transcript.jsonl").read_bytes().splitlines(keepends=True)
    (cut / "transcript.jsonl").write_bytes(b"".join(lines[:200]) + lines[200][:30])
    (root / "not-a-run").mkdir()
    (root / "notes.txt").write_text("x")
    return root


def test_each_row_agrees_with_its_transcript(runs):
    rows = {Path(r.path).relative_to(runs).as_posix(): r for r in find_runs(runs)}
    assert sorted(rows) == ["audit1/cat", "audit1/fly", "cut-run", "fly-run"]
    for name, row in rows.items():
        path = Path(row.path) / "transcript.jsonl"
        if name == "cut-run":  # what was written whole
            whole = path.with_name("whole.jsonl")
            whole.write_bytes(path.read_bytes().rsplit(b"\n", 1)[0] + b"\n")
            path = whole
        events = read_transcript(path)
        view = InvestigationView.from_events(events)
        assert row.label == events[0].config["class"] and row.planner == events[0].planner
        assert row.images == view.images_used
        assert row.modes == len({e.mode_id for e in events if e.kind == "mode"})
        if name == "cut-run":
            assert row.status == "running / cut" and row.findings == len({f.finding_id for f in view.findings})
        else:
            assert row.status == events[-1].status and row.findings == events[-1].n_findings
            assert row.seconds is not None and row.seconds > 0
    assert rows["audit1/cat"].audit == "audit1" and rows["fly-run"].audit is None
    assert rows["fly-run"].findings == 5 and rows["fly-run"].images == 3078  # the example's own numbers


def test_the_command_lists_them_newest_first_as_a_table_or_json(runs, capsys):
    assert main(["runs", str(runs), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["started"] for r in out] == sorted((r["started"] for r in out), reverse=True)
    assert main(["runs", str(runs), "--limit", "2"]) == 0
    text = capsys.readouterr().out
    assert "4 runs in" in text and "newest 2 shown" in text
    assert "started" in text and "modes" in text and "sleuth report PATH --open" in text
    assert main(["runs", str(runs / "missing")]) == 2
    assert "no runs folder" in capsys.readouterr().err
    assert read_run(runs / "notes.txt") is None
