"""mypy over sleuth, with the options of pyproject.toml's [tool.mypy] (``make lint`` runs it).

mypy names a module after the folders that hold it, and agent/, tools/ and prompts/ are not under sleuth/: this hands
mypy every module of sleuth/, agent/, tools/ and prompts/ under the name it is imported by (agent/cli/flags.py is
``sleuth.agent.cli.flags``). Arguments are mypy's options, for example ``--no-incremental``.

    python scripts/typecheck.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource
from mypy.util import count_stats

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"sleuth": "sleuth", "agent": "sleuth.agent", "tools": "sleuth.tools", "prompts": "sleuth.prompts"}


def sources(root: Path = ROOT) -> list[BuildSource]:
    """Every module of the package's folders, by the name it is imported by; paths relative to ``root``."""
    out = []
    for folder, package in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.append(BuildSource(str(path.relative_to(root)), ".".join((package, *parts))))
    return out


def main(argv: list[str]) -> int:
    os.chdir(ROOT)
    _, options = process_options(argv, require_targets=False)
    found = sources()
    messages: list[str] = []

    def show(filename: str | None, new: list[str], serious: bool) -> None:
        messages.extend(new)
        for line in new:
            print(line, file=sys.stderr if serious else sys.stdout)

    try:
        build.build(found, options, flush_errors=show)
    except CompileError as e:  # a blocking error (a syntax error, say), already shown
        if not messages:
            show(None, e.messages, True)
        return 2
    errors, _, files = count_stats(messages)
    if errors:
        print(f"Found {errors} error{'s' * (errors != 1)} in {files} file{'s' * (files != 1)} "
              f"(checked {len(found)} source files)")
        return 1
    print(f"Success: no issues found in {len(found)} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
