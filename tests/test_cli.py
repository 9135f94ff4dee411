"""The command line itself: start-up stays light, every sub-command has help."""

from __future__ import annotations

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
