"""`sleuth report RUN_DIR`: one self-contained HTML file (findings, plots, images) from a run or an audit."""

from __future__ import annotations

import argparse
import sys
import time
import webbrowser
from pathlib import Path

from sleuth.agent.errors import UsageError

NAME = "report"
HELP = "Write one self-contained HTML report of a run directory (or a directory of runs)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR",
                   help="A run directory (or its transcript.jsonl), or a directory of run directories (an audit).")
    p.add_argument("-o", "--output", metavar="FILE", default=None,
                   help="Where to write the HTML (default: RUN_DIR/report.html).")
    p.add_argument("--open", action="store_true", help="Open the report in the default browser when written.")
    p.add_argument("--no-verify", action="store_true",
                   help="Skip the transcripts' hash-chain check (the schema is still checked).")


def run(args: argparse.Namespace) -> int:
    out = Path(args.output) if args.output else None
    if out is not None and out.is_dir():
        raise UsageError(f"--output {out} is a directory; give a file name")
    if not Path(args.run_dir).exists():  # before the report's plotting and image libraries load
        raise UsageError(f"no such file or directory: {args.run_dir}")
    from rich.console import Console

    from sleuth.agent.report import ReportError, default_output, write_report

    t0 = time.perf_counter()
    try:
        with Console(stderr=True).status(f"Writing the report of {args.run_dir} …"):
            written = write_report(args.run_dir, out, verify=not args.no_verify)
    except ReportError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        target = out if out is not None else default_output(args.run_dir)
        raise UsageError(f"cannot write {target}: {e.strerror or e}") from None
    size = written.stat().st_size
    print(f"Report: {written} ({size / 1e6:.1f} MB, {time.perf_counter() - t0:.1f} s)")
    if args.open and not webbrowser.open(written.resolve().as_uri()):
        print("sleuth report: no browser to open it with", file=sys.stderr)
    return 0
