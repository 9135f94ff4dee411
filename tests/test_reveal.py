"""`sleuth investigate --reveal`: after the run, toyworld's answer key names the class's planted bugs and decoys and
matches findings to them by the oracle; nothing of it reaches the transcript; other worlds are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sleuth.agent.cli import main
from sleuth.agent.transcript import read_transcript


@pytest.mark.e2e
def test_reveal_names_the_planted_bug_and_marks_it_found(capsys, tmp_path: Path) -> None:
    code = main(["investigate", "--class", "cat", "--budget", "3000", "--runs", str(tmp_path), "--json", "--reveal"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    key = out["answer_key"]
    assert key["class"] == "cat" and key["world"] == "default"
    planted = {p["name"]: p for p in key["planted"]}
    assert set(planted) == {"cat in snow", "ball next to a cat"}
    snow, ball = planted["cat in snow"], planted["ball next to a cat"]
    assert snow["kind"] == "bug" and snow["confuser"] == "snow leopard" and snow["found"] and snow["stage"] == "found"
    assert snow["oracle"]["ratio"] > 5 and snow["oracle"]["real"]  # the oracle's own measure of the plant
    assert ball["kind"] == "decoy" and not ball["oracle"]["real"]
    # The findings that name the bug are confirmed findings of the run, and the oracle measures them real.
    ids = {f["finding_id"] for f in out["findings"] if f["confirmed"]}
    assert snow["findings"] and set(snow["findings"]) <= ids
    # The failure modes holding them are named, each with all its findings.
    assert snow["modes"] and all(set(key["modes"][m]) <= ids for m in snow["modes"])
    judged = {f["finding_id"]: f for f in key["findings"]}
    assert all(judged[i]["real"] and judged[i]["bug"] == "cat in snow" for i in snow["findings"])
    assert key["false_findings"] == [f for f, j in judged.items() if not j["real"]]
    # The answer key is printed, never written where a planner (or a replayed planner) could read it.
    text = Path(out["transcript"]).read_text()
    assert "cat in snow" not in text and "ball next to a cat" not in text and "answer_key" not in text
    assert read_transcript(out["transcript"])[-1].kind == "run_finished"


@pytest.mark.e2e
def test_reveal_in_the_terminal_says_found_and_names_the_bug(capsys, tmp_path: Path) -> None:
    code = main(["investigate", "--class", "cat", "--budget", "3000", "--runs", str(tmp_path), "--quiet",
                 "--reveal"])
    text = capsys.readouterr().out
    assert code == 0
    key = text[text.index("Answer key"):]
    assert "• cat in snow (bug:" in key and "fails as snow leopard" in key
    line = key[key.index("• cat in snow"):key.index("• ball next to a cat")]
    assert "FOUND by mode m" in line and "MISSED" not in line
    assert "decoy" in key[key.index("• ball next to a cat"):]
    # After the findings tables, never before them.
    assert text.index("confirmed finding") < text.index("Answer key")


def test_reveal_is_refused_for_models_the_oracle_does_not_know(capsys, tmp_path: Path) -> None:
    code = main(["investigate", "--class", "cat", "--runs", str(tmp_path), "--reveal",
                 "--generator", "diffusers:toyworld-sd"])
    err = capsys.readouterr().err
    assert code == 2 and "--reveal needs toyworld's own generator and classifier" in err
    assert not any(tmp_path.iterdir())  # refused before any run started


@pytest.mark.e2e  # a whole run or a simulation: over the fast tier's 5 seconds
def test_a_missed_bug_says_how_far_the_run_got(capsys, tmp_path: Path) -> None:
    from sleuth.agent.bench.misses import STAGES
    from sleuth.agent.bench.reveal import WHY

    # The orange dog is subtle (about 3x): 1,000 images are far too few to confirm it.
    code = main(["investigate", "--class", "dog", "--budget", "1000", "--runs", str(tmp_path), "--json", "--reveal"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    [dog] = [p for p in out["answer_key"]["planted"] if p["kind"] == "bug"]
    assert dog["name"] == "orange dog" and not dog["found"] and dog["findings"] == []
    assert dog["stage"] in STAGES[1:] and dog["why"].endswith(WHY[dog["stage"]])
    assert dog["screen"]["n"] >= 0
    # The terminal prints the same key: the missed bug in red with how far the run got, then the findings' verdicts.
    from rich.console import Console

    from sleuth.agent.terminal.answer_key import render_answer_key

    console = Console(width=200, record=True)
    console.print(render_answer_key(out["answer_key"]))
    text = console.export_text()
    line = text[text.index("• orange dog"):]
    assert "MISSED: " in line and dog["why"] in " ".join(line.split()) and "FOUND" not in line.split("\n")[0]
    assert f"Confirmed findings: {len(out['answer_key']['findings'])}," in text
