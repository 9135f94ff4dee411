"""`sleuth replay`: renders a verified transcript; a broken chain is one line naming the bad line, exit 1."""

from __future__ import annotations

from rich.console import Console

from sleuth.agent.cli import main
from sleuth.agent.terminal.render import compact, key_values, render_event


def test_replay_renders_a_transcript(written, capsys):
    path, _ = written
    assert main(["replay", str(path), "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert "I measure the baseline of the class prompt first." in out
    assert "→ measure_rate(caption='a cat', n=120)" in out
    assert "← measure_rate" in out and "0.25 s" in out
    assert "looks" in out and "[0, 1, 2, 3, 4, 5, … +6]" in out  # long lists are cut short
    assert "✗ measure_rate: arguments are not valid JSON" in out
    assert "finding f1: a cat in the snow" in out and "0.003" in out
    assert "error in tool measure_rate: ValueError: boom" in out
    assert "run finished: completed" in out
    assert "toy-gen" in out and "run r1" in out
    assert "9 events, hash chain verified." in out


def test_replay_accepts_the_run_directory(written, capsys):
    path, _ = written
    assert main(["replay", str(path.parent), "--width", "120"]) == 0
    assert "9 events" in capsys.readouterr().out


def test_replay_of_a_tampered_copy_names_the_line(written, capsys, tmp_path):
    path, _ = written
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(path.read_bytes().replace(b'"k":37', b'"k":73'))
    assert main(["replay", str(copy)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"sleuth replay: {copy}: line 5: hash mismatch: the line was changed after it was "
                            "written\n")
    # --no-verify renders it anyway.
    assert main(["replay", str(copy), "--no-verify"]) == 0
    assert "hash chain not checked" in capsys.readouterr().out


def test_missing_transcript_is_a_usage_error(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err == f"sleuth replay: error: no transcript at {tmp_path / 'nope.jsonl'}\n"


def test_an_empty_or_foreign_file_is_no_transcript(tmp_path, capsys):
    cases = {"empty.jsonl": (b"", "empty file, not a transcript"),
             "blank.jsonl": (b"\n\n", "blank file, not a transcript"),
             "notes.txt": (b"hello world\n", "line 1 is not a sleuth transcript event: invalid JSON "
                                              "(Expecting value at column 1): 'hello world'"),
             "data.jsonl": (b'{"name": "x", "value": 1}\n{"name": "y"}\n',
                            "line 1 is not a sleuth transcript event: a JSON object with keys name, value"),
             "list.json": (b"[1, 2]", "line 1 is not a sleuth transcript event: JSON list")}
    for name, (data, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        for extra in ([], ["--no-verify"], ["--verify"], ["--fork", "1", "--planner", "replay"]):
            assert main(["replay", str(path), *extra]) == 2, (name, extra)
            captured = capsys.readouterr()
            assert captured.err == f"sleuth replay: error: {path}: {message}\n", (name, extra)
            assert "events" not in captured.out


def test_a_transcript_cut_in_its_last_line_is_still_called_torn(written, capsys, tmp_path):
    path, _ = written
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(path.read_bytes()[:-40])
    assert main(["replay", str(cut)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"sleuth replay: {cut}: line 9: invalid JSON") and "(torn final line" in err
    # A run whose only line was cut is no transcript yet.
    first = tmp_path / "first.jsonl"
    first.write_bytes(path.read_bytes().split(b"\n")[0][:-40])
    assert main(["replay", str(first)]) == 2
    assert "line 1 is not a sleuth transcript event: invalid JSON" in capsys.readouterr().err


def test_generic_formatter_summarises_rates_and_nesting():
    assert compact({"k": 3, "n": 40, "rate": 0.075, "low": 0.0258, "high": 0.199}) == "3/40 [2.6–19.9%]"
    assert compact(0.123456) == "0.1235"
    assert compact({"ratio": 7.0654, "low": 5.546, "high": 9.0, "method": "katz-log"}) == "7.07× [5.55, 9]"
    assert compact({"a": {"b": [1, 2]}, "c": None}) == "{a: {b: [1, 2]}, c: null}"
    assert compact("x" * 300).endswith("…") and len(compact("x" * 300)) == 100
    console = Console(width=80, record=True, file=open("/dev/null", "w"))
    console.print(key_values({"verdict": "supported", "notes": [], "mcnemar": None, "n": 0,
                              "hypothesis": {"prompt": "a cat", "failures": {"k": 1, "n": 2, "low": 0.1, "high": 0.9},
                                             "confusions": []}}))
    assert [line.rstrip() for line in console.export_text().splitlines()] == [
        "verdict     supported", "n           0", "hypothesis", "  prompt    a cat", "  failures  1/2 [10.0–90.0%]"]


def test_planner_turn_without_words_renders_nothing(sample_events):
    from sleuth.agent.events import PlannerTurn

    assert render_event(PlannerTurn()) is None
    console = Console(width=100, record=True, file=open("/dev/null", "w"))
    for e in sample_events:
        r = render_event(e)
        assert r is not None
        console.print(r)
    text = console.export_text()
    assert "test-model · 10+5 tokens · $0.0012" in text
