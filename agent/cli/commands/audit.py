"""`sleuth audit CONFIG`: audit many classes unattended, under budgets; `sleuth audit --resume RUN_DIR` continues."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sleuth.agent.errors import UsageError

NAME = "audit"
HELP = "Audit many classes unattended, under image, time and cost budgets; resumable after a crash."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="Audit config (YAML, TOML or JSON): backends, classes, budgets, planner.")
    p.add_argument("--resume", metavar="RUN_DIR", help="Continue the audit in RUN_DIR where it stopped.")
    p.add_argument("--out", metavar="RUN_DIR", help="Run directory for a new audit (default: a new one under --runs).")
    p.add_argument("--runs", default="runs", help="Folder for new run directories (default ./runs).")
    p.add_argument("--json", action="store_true", help="Print the audit summary as JSON.")
    p.add_argument("--verbose", action="store_true", help="Show every transcript event as it is written.")


def _build(config: Any, bars: Any) -> Any:
    with bars:
        return config.backends.build(bars.update, load=True)


def _describe(c: dict[str, Any]) -> str:
    rec = c.get("recovery") or {}
    parts = [f"{c['class']}: {c['status']}", f"{c['images']}/{c['image_budget']} images",
             f"{c['hypotheses_tested']} hypotheses", f"{len(c['findings'])} confirmed findings"]
    if c.get("stopped_by"):
        parts.append(c["stopped_by"])
    if rec.get("resumed"):
        parts.append(f"resumed after {rec['events_found']} recorded events ({rec['calls_rerun']} calls re-run)")
    if rec.get("torn_line_moved_to"):
        parts.append(f"the crash had torn the last line: {rec['torn_bytes']} bytes moved to "
                     f"{rec['torn_line_moved_to']} and that event written again")
    return "; ".join(parts)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sleuth.agent.audit import Audit, AuditError, load, resolve_classes, slug, start
    from sleuth.agent.audit.config import load_config
    from sleuth.agent.audit.summary import classes_table, findings_table
    from sleuth.agent.replay.rebuild import RebuildError
    from sleuth.agent.session import new_run_dir
    from sleuth.agent.terminal.progress import ProgressBars
    from sleuth.agent.terminal.render import render_event
    from sleuth.agent.transcript import TranscriptError

    if (args.config is None) == (args.resume is None):
        raise UsageError("give a CONFIG to start an audit, or --resume RUN_DIR to continue one (not both)")
    console = Console(stderr=args.json)
    bars = ProgressBars(console, enabled=not args.json and console.is_terminal)
    try:
        if args.resume is not None:
            if args.out:
                raise UsageError("--out names a new audit's directory; --resume continues RUN_DIR in place")
            run_dir = Path(args.resume)
            config, _ = load(run_dir)
            backends = _build(config, bars)
        else:
            config = load_config(args.config)
            backends = _build(config, bars)
            classes = resolve_classes(config, backends)
            run_dir = Path(args.out) if args.out else new_run_dir(Path(args.runs), "audit", config.seed)
            start(run_dir, config, classes)
    except AuditError as e:
        raise UsageError(str(e)) from None

    def show(event: Any) -> None:
        renderable = render_event(event)
        if renderable is not None:
            bars.print(renderable)

    def on_class(summary: dict[str, Any]) -> None:
        if not args.json:
            bars.print(_describe(summary))

    audit = Audit(run_dir, backends, progress=bars.update, on_event=show if args.verbose else None,
                  on_class=on_class)
    try:
        with bars:
            out = audit.run()
    except (RebuildError, TranscriptError) as e:
        print(f"sleuth audit: cannot continue {run_dir}: {e}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        console.print(classes_table(out))
        console.print(findings_table(out))
        console.print(f"{out['images']} images, {out['seconds']:.1f} s active. Summary: {run_dir / 'summary.json'}")
        console.print(f"Replay a class with: sleuth replay {run_dir / slug(audit.classes[0])}")
    return 0 if all(c["status"] in ("completed", "budget_spent", "skipped") for c in out["classes"]) else 1
