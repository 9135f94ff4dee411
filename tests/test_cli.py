"""The command line itself: start-up stays light, every sub-command has help."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sleuth.agent.cli import COMMANDS, _load, build_parser

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "scipy", "litellm", "diffusers", "transformers", "matplotlib", "open_clip")


def test_building_the_parser_imports_no_heavy_library():
    # `sleuth --help` and argument errors must answer at once: heavy imports belong inside the commands.
    code = ("import sys, sleuth.agent.cli; sleuth.agent.cli.build_parser(); "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"imported at start-up: {out.stdout.strip()}"


@pytest.mark.parametrize("command", [c for c in COMMANDS if _load(c) is not None])
def test_every_command_has_help(command, capsys):
    parser = build_parser()
    with pytest.raises(SystemExit) as e:
        parser.parse_args([command, "--help"])
    assert e.value.code == 0
    assert command in capsys.readouterr().out


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```")[1]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()[1:] if line.strip()]
    assert commands == ["make demo", "make test"]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert ci[-2:] == ["make test", "make test-e2e"]
    makefile = (ROOT / "Makefile").read_text()
    assert "sleuth investigate --class cat" in makefile.split("\ndemo:")[1].split("\n\n")[0]


def test_investigate_help_is_short_and_advertises_only_the_real_planners(capsys, monkeypatch):
    from sleuth.agent.planners import PLANNERS

    monkeypatch.setenv("COLUMNS", "80")
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["investigate", "--help"])
    out = capsys.readouterr().out
    adversarial = [n for n, s in PLANNERS.items() if s.adversarial]
    assert len(adversarial) == 5 and not any(n in out for n in adversarial)
    assert "protocol, protocol-v2, protocol-v1, wiles, random, llm" in out
    assert len(out.splitlines()) < 80, len(out.splitlines())
    assert max(len(line) for line in out.splitlines()) <= 80
    # Hidden is not refused: the calibration scripts still run (docs/bench.md) ...
    args = parser.parse_args(["investigate", "--class", "cat", "--planner", "adv-early"])
    assert args.planner == "adv-early"
    # ... and a wrong name is one line naming the real planners.
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["investigate", "--class", "cat", "--planner", "foo"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("sleuth investigate: error: argument --planner: unknown planner 'foo' (choose from protocol, "
                   "protocol-v2, protocol-v1, wiles, random, llm)")


# Reports which heavy libraries were imported when the command returned, after its own output.
_PROBE = """
import sys
try:
    from sleuth.agent.cli import main
    rc = main(sys.argv[1:])
except SystemExit as e:
    rc = e.code
print("IMPORTED=" + ",".join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)
sys.exit(rc)
"""


def test_input_errors_are_reported_before_any_heavy_import(tmp_path):
    # A typo must be answered at once, not after torch and the models load (seconds on a loaded machine).
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    cases = [
        (["investigate", "--class", "zebra"],
         "sleuth investigate: error: unknown class 'zebra'. Did you mean: crab, brick wall? Classes: cat, "
         "snow leopard, dog, fox, fly, bee, crayfish, crab, goldfish, shark, chainlink fence, brick wall."),
        (["chat", "--class", "kat"], "sleuth chat: error: unknown class 'kat'. Did you mean: cat? Classes: cat, "),
        (["investigate", "--class", "cat", "--budget", "0"],
         "sleuth investigate: error: --budget: Input should be greater than or equal to 1; got 0"),
        (["investigate", "--class", "cat", "--world", str(tmp_path / "missing.yaml")],
         f"sleuth investigate: error: world config {tmp_path / 'missing.yaml'}: no such file"),
        (["investigate", "--class", "cat", "--planner", "nope"],
         "sleuth investigate: error: argument --planner: unknown planner 'nope'"),
        (["replay", str(tmp_path / "missing.jsonl")], f"sleuth replay: error: no transcript at {tmp_path}"),
        (["replay", str(empty)], f"sleuth replay: error: {empty}: empty file, not a transcript"),
        (["replay", str(empty), "--verify"], f"sleuth replay: error: {empty}: empty file, not a transcript"),
        (["report", str(tmp_path / "missing")], f"sleuth report: error: no such file or directory: {tmp_path}"),
    ]
    for argv, message in cases:
        out = subprocess.run([sys.executable, "-c", _PROBE.format(heavy=HEAVY + ("diffusers", "ray")), *argv],
                             cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        *lines, imported = out.stderr.splitlines()
        assert out.returncode == 2, (argv, out.stderr)
        assert lines[-1].startswith(message), (argv, out.stderr)
        assert len(lines) == 1 or lines[0].startswith("usage:"), (argv, out.stderr)  # argparse's usage line
        assert imported == "IMPORTED=", (argv, imported)
        assert out.stdout == ""
