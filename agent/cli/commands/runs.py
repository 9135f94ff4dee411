"""`sleuth runs`: the runs in a runs folder, newest first, one row each (agent/runs.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sleuth.agent.errors import UsageError

NAME = "runs"
HELP = "List past runs (investigations, chats, audit classes), newest first."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", nargs="?", default="runs", metavar="DIR", help="runs folder (./runs)")
    p.add_argument("--limit", type=int, default=30, metavar="N", help="newest N runs (30; 0: all)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")


def run(args: argparse.Namespace) -> int:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from sleuth.agent.runs import find_runs
    from sleuth.agent.terminal.tables import console as make_console

    root = Path(args.folder)
    if not root.is_dir():
        raise UsageError(f"no runs folder {root} (runs go to ./runs unless --runs names another)")
    if args.limit < 0:
        raise UsageError(f"--limit must be 0 or more, got {args.limit}")
    rows = find_runs(root)
    shown = rows[:args.limit] if args.limit else rows
    if args.json:
        json.dump([r.json() for r in shown], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    console = make_console()
    if not rows:
        console.print(f"No runs in {root}.", markup=False)
        return 0
    table = Table(title=f"{len(rows)} run{'s' * (len(rows) != 1)} in {root}"
                  + (f", newest {len(shown)} shown (--limit 0: all)" if len(shown) < len(rows) else ""),
                  title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("started", "left"), ("class", "left"), ("planner", "left"), ("status", "left"),
                          ("modes", "right"), ("findings", "right"), ("images", "right"), ("time", "right"),
                          ("path", "left")):
        table.add_column(name, justify=justify, no_wrap=name != "path", overflow="fold")  # type: ignore[arg-type]
    for r in shown:
        status = Text(r.status, style="green" if r.status in ("completed", "budget_spent") else "yellow")
        label = r.label if r.command != "chat" else f"{r.label} (chat)"
        table.add_row(r.started[5:16].replace("T", " "), label, r.planner, status, str(r.modes), str(r.findings),
                      f"{r.images:,}", _duration(r.seconds), r.path)
    console.print(table)
    console.print("Open one with: sleuth report PATH --open (or sleuth replay PATH)", markup=False)
    return 0


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
