"""`sleuth replay TRANSCRIPT`: check a transcript's hash chain, then render it as the live terminal showed it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agent.cli import UsageError

NAME = "replay"
HELP = "Render a recorded transcript again (after checking its hash chain)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("transcript", help="A transcript.jsonl, or the run directory that holds one.")
    p.add_argument("--no-verify", action="store_true",
                   help="Skip the hash-chain check (the schema is still checked).")
    p.add_argument("--width", type=int, default=None, help="Output width in columns (default: the terminal's).")


def resolve(path: str) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / "transcript.jsonl"
    if not p.is_file():
        raise UsageError(f"no transcript at {path}")
    return p


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from agent.render import render_event
    from agent.transcript import TranscriptError, read_transcript

    if args.width is not None and args.width < 20:
        raise UsageError(f"--width must be at least 20, got {args.width}")
    path = resolve(args.transcript)
    try:
        events = read_transcript(path, verify=not args.no_verify)
    except TranscriptError as e:
        print(f"sleuth replay: {path}: line {e.line}: {e.reason}", file=sys.stderr)
        return 1
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    console = Console(width=args.width, highlight=False)
    for event in events:
        renderable = render_event(event)
        if renderable is not None:
            console.print(renderable)
    checked = "hash chain verified" if not args.no_verify else "hash chain not checked"
    console.print(f"{len(events)} events, {checked}.", style="dim")
    return 0
