"""`sleuth replay T`: render a transcript; `--verify` re-runs its tool calls; `--fork N` continues it anew.

- render: the hash chain is checked, then every event is shown as the live terminal showed it, with its line number
  (``--step`` waits for Enter before each planner turn);
- ``--verify``: re-runs every recorded tool call with its recorded seeds on the recorded backends and classes each
  difference by the tolerance policy of ``agent.replay.verify`` (identical, equivalent, drifted, different), and reports
  any break of the hash chain, by line number. Exit 0 when every recorded conclusion holds; ``--strict`` demands
  identical bytes. T may be a folder: every transcript under it is verified;
- ``--fork N --planner P``: copies lines 1..N (cut back to the start of a planner turn) into a new transcript and
  continues from there with planner P. ``--planner replay`` plays the recorded turns instead: a recorded session,
  LLM sessions included, runs again without a model or an API key.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sleuth.agent.errors import UsageError

NAME = "replay"
HELP = "Render a recorded transcript; --verify re-runs its tool calls; --fork N continues it with another planner."


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sleuth.agent.cli.flags import add_planner_arguments

    p.add_argument("transcript", help="A transcript.jsonl, or the run directory that holds one (for --verify: any "
                                      "folder; every transcript under it is verified).")
    p.add_argument("--no-verify", action="store_true",
                   help="Skip the hash-chain check (the schema is still checked).")
    p.add_argument("--width", type=int, default=None, help="Output width in columns (default: the terminal's).")
    p.add_argument("--step", action="store_true", help="Wait for Enter before each planner turn.")
    p.add_argument("--verify", action="store_true",
                   help="Re-run every tool call with its recorded seeds and report results that differ.")
    p.add_argument("--strict", action="store_true",
                   help="With --verify: demand identical results, byte for byte (default: images within 2 grey "
                        "levels, floats within 1e-4, and drifted counts pass when every conclusion holds).")
    p.add_argument("--json", action="store_true", help="With --verify: print the reports as JSON.")
    p.add_argument("--fork", type=int, metavar="N",
                   help="Keep lines 1..N (cut back to a planner turn) and continue with --planner in a new transcript.")
    p.add_argument("--out", metavar="DIR", help="With --fork: the new run directory (default: a new one under --runs).")
    p.add_argument("--runs", default="runs", help="With --fork: folder for the new run directory (default ./runs).")
    p.add_argument("--baseline-n", type=int, default=None,
                   help="With --fork: the planner's baseline size (default: the recorded run's).")
    p.add_argument("--quiet", action="store_true", help="With --fork: do not render the new events.")
    # The recorded turns themselves are one more planner a fork can continue with.
    add_planner_arguments(p, extra=("replay",))


def resolve(path: str) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / "transcript.jsonl"
    if not p.is_file():
        raise UsageError(f"no transcript at {path}")
    return p


def transcripts_under(path: str) -> list[Path]:
    p = Path(path)
    if p.is_file():
        return [p]
    if p.is_dir():
        found = sorted(p.rglob("transcript.jsonl"))
        if found:
            return found
    raise UsageError(f"no transcript at {path}")


def run(args: argparse.Namespace) -> int:
    if args.width is not None and args.width < 20:
        raise UsageError(f"--width must be at least 20, got {args.width}")
    if args.verify and args.fork is not None:
        raise UsageError("--verify and --fork are separate actions; run them one after the other")
    if args.strict and not args.verify:
        raise UsageError("--strict goes with --verify")
    if args.verify:
        return _verify(args)
    if args.fork is not None:
        return _fork(args)
    return _render(args)


# -- render ---------------------------------------------------------------------------------------------------


def _numbered(line: int, renderable: Any) -> Any:
    from rich.table import Table

    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="dim", no_wrap=True, justify="right", width=4)
    grid.add_column(overflow="fold")
    grid.add_row(str(line), renderable)
    return grid


def _render(args: argparse.Namespace) -> int:
    from sleuth.agent.transcript import NotATranscript, TranscriptError, read_transcript

    path = resolve(args.transcript)
    try:
        events = read_transcript(path, verify=not args.no_verify)
    except NotATranscript as e:
        raise UsageError(f"{path}: {e.message}") from None
    except TranscriptError as e:
        print(f"sleuth replay: {path}: line {e.line}: {e.reason}", file=sys.stderr)
        return 1
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    # The renderers import the tools (and scipy): only once the file is known to be a transcript.
    from rich.console import Console

    from sleuth.agent.terminal.render import render_event
    console = Console(width=args.width, highlight=False)
    step = args.step and sys.stdin.isatty()
    seen_turn = False
    for event in events:
        if step and event.kind == "planner_turn":
            if seen_turn:
                input()
            seen_turn = True
        renderable = render_event(event)
        if renderable is not None:
            console.print(_numbered(event.seq + 1, renderable))
    checked = "hash chain verified" if not args.no_verify else "hash chain not checked"
    console.print(f"{len(events)} events, {checked}.", style="dim")
    # The run's failure modes last, as the run ended: what the transcript's findings amount to.
    from sleuth.agent.audit.summary import modes_rows
    from sleuth.agent.mode_summary import mode_summaries
    from sleuth.agent.view import InvestigationView

    modes = [m.model_dump(mode="json") for m in mode_summaries(InvestigationView.from_events(events))]
    table = modes_rows(modes, 1, f"{len(modes)} failure mode{'s' * (len(modes) != 1)}, strongest first")
    if table is not None:
        console.print(table)
    return 0


# -- verify ---------------------------------------------------------------------------------------------------


def _verify(args: argparse.Namespace) -> int:
    from sleuth.agent.transcript import NotATranscript, TranscriptError, read_transcript

    paths = transcripts_under(args.transcript)
    if len(paths) == 1:  # a file that is no transcript is said so before the backends' libraries load
        try:
            read_transcript(paths[0], verify=False)
        except NotATranscript as e:
            raise UsageError(f"{paths[0]}: {e.message}") from None
        except TranscriptError:
            pass  # a damaged transcript: the verification reports it with the rest
    from rich.console import Console
    from rich.text import Text

    from sleuth.agent.errors import RebuildError
    from sleuth.agent.events import RunStarted
    from sleuth.agent.replay.rebuild import backend_specs, verify_run
    from sleuth.agent.terminal.progress import ProgressBars

    console = Console(width=args.width, highlight=False, stderr=args.json)
    bars = ProgressBars(console, enabled=not args.json and console.is_terminal)
    built: dict[str, Any] = {}
    reports = []
    failed = 0
    with bars:
        for path in paths:
            try:
                first = read_transcript(path, verify=False)[:1]
                backends = None
                if first and isinstance(first[0], RunStarted):
                    specs = backend_specs(first[0])
                    key = specs.model_dump_json()
                    if key not in built:  # transcripts of one audit share their backends
                        built[key] = specs.build(bars.update, load=True)
                    backends = built[key]
                report = verify_run(path, backends=backends, progress=bars.update, strict=args.strict)
            except NotATranscript as e:
                if len(paths) == 1:
                    raise UsageError(f"{path}: {e.message}") from None
                failed += 1
                reports.append({"transcript": str(path), "status": "different", "ok": False, "error": e.message})
                if not args.json:
                    bars.print(Text(f"{path}: cannot verify: {e.message}", style="red"))
                continue
            except (RebuildError, TranscriptError) as e:
                failed += 1
                reports.append({"transcript": str(path), "status": "different", "ok": False, "error": str(e)})
                if not args.json:
                    bars.print(Text(f"{path}: cannot verify: {e}", style="red"))
                continue
            reports.append(report.model_dump(mode="json"))
            failed += not report.ok
            if not args.json:
                _print_report(bars, report)
    if args.json:
        json.dump(reports if len(reports) > 1 else reports[0], sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif len(paths) > 1:
        console.print(f"{len(paths) - failed} of {len(paths)} transcripts verified, {failed} with problems.")
    return 1 if failed else 0


STYLE = {"identical": "green", "equivalent": "green", "drifted": "yellow", "different": "red", "tampered": "red"}


def _difference_lines(differences: list[Any]) -> list[tuple[str, str]]:
    """Drifted and different results one per line; a call's equivalent ones (re-rendered images, floats in their
    last digits) summed up in one line."""
    out: list[tuple[str, str]] = []
    equivalent: dict[tuple[int, str, str], list[Any]] = {}
    for d in differences:
        if d.kind == "equivalent":
            equivalent.setdefault((d.line, d.tool, d.call_id), []).append(d)
        else:
            out.append((d.kind, d.describe()))
    for (line, tool, call_id), ds in equivalent.items():
        images = [d for d in ds if d.note.startswith("image")]
        numbers = len(ds) - len(images)
        parts = [f"{len(images)} image{'s' * (len(images) != 1)} within 2 grey levels"] if images else []
        parts += [f"{numbers} number{'s' * (numbers != 1)} within 1e-4"] if numbers else []
        out.append(("equivalent", f"line {line}: {tool} ({call_id}): equivalent: {', '.join(parts)}"))
    return out


def _print_report(bars: Any, report: Any) -> None:
    from rich.markup import escape

    head = escape(report.transcript)
    if report.chain_error:
        bars.print(f"[red]{head}: {escape(report.chain_error)}[/red]")
    for t in report.tampered:
        bars.print(f"[red]{head}: {escape(t)}: recorded numbers contradict each other[/red]")
    for line in _difference_lines(report.differences):
        style = STYLE[line[0]]
        bars.print(f"[{style}]{head}: {escape(line[1])}[/{style}]")
    for s in report.skipped:
        bars.print(f"[yellow]{head}: line {s.line}: {s.tool} not re-run: {escape(s.reason)}[/yellow]")
    if report.unfinished:
        bars.print(f"[yellow]{head}: {report.unfinished} call(s) have no recorded result (the run was cut)[/yellow]")
    chain = "hash chain intact" if not report.chain_error else "hash chain BROKEN"
    style = "green" if report.ok else "red"
    bars.print(f"[{style}]{head}: {report.events} events, {chain}; {escape(report.summary())}; "
               f"{report.seconds:.1f} s[/{style}]")


# -- fork -----------------------------------------------------------------------------------------------------


def _fork(args: argparse.Namespace) -> int:
    from sleuth.agent.transcript import NotATranscript, TranscriptError, read_transcript

    source = resolve(args.transcript)
    if args.fork < 1:
        raise UsageError(f"--fork must be a line number of at least 1, got {args.fork}")
    try:
        events = read_transcript(source)
    except NotATranscript as e:
        raise UsageError(f"{source}: {e.message}") from None
    except TranscriptError as e:
        print(f"sleuth replay: {source}: line {e.line}: {e.reason}", file=sys.stderr)
        return 1
    from rich.console import Console

    from sleuth.agent.cli.flags import planner_config
    from sleuth.agent.errors import RebuildError
    from sleuth.agent.planners.replay import ReplayPlanner
    from sleuth.agent.replay.resume import fork_point, fork_run
    from sleuth.agent.session import new_run_dir
    from sleuth.agent.terminal.progress import ProgressBars
    from sleuth.agent.terminal.render import render_event
    if not events or events[0].kind != "run_started":
        raise UsageError(f"{source} does not begin with run_started")
    config = events[0].config
    if args.fork > len(events):
        raise UsageError(f"--fork {args.fork}: {source} has only {len(events)} lines")
    keep = fork_point(events, args.fork)
    chosen = planner_config(args) if args.planner != "replay" else None

    def make_planner(session: Any) -> Any:
        if chosen is None:
            return ReplayPlanner.from_events(events, after=keep)
        baseline_n = args.baseline_n or session.config.planner.baseline_n
        return session.planner(config=chosen.model_copy(update={"baseline_n": baseline_n}))

    label = str(config.get("class", "run"))
    seed = int(config.get("seed", 0))
    out = Path(args.out) if args.out else new_run_dir(Path(args.runs), f"{label}-fork{keep}", seed)
    console = Console(width=args.width, highlight=False)
    bars = ProgressBars(console, enabled=console.is_terminal)

    def show(event: Any) -> None:
        renderable = render_event(event)
        if renderable is not None:
            bars.print(_numbered(event.seq + 1, renderable))

    try:
        with bars:
            done = fork_run(source, args.fork, out, make_planner, progress=bars.update,
                            subscribers=() if args.quiet else (show,))
    except (RebuildError, FileExistsError) as e:
        print(f"sleuth replay: cannot fork {source}: {e}", file=sys.stderr)
        return 1
    if keep != args.fork:
        console.print(f"Line {args.fork} is inside a planner turn: the fork keeps lines 1..{keep}, up to that turn.",
                      style="yellow", markup=False)
    if done.divergence is not None:
        console.print(f"The {args.planner} planner does not reproduce the recorded turns "
                      f"({done.divergence.describe()}); it starts its own procedure on the rebuilt state.",
                      style="yellow", markup=False)
    console.print(f"Forked {source} at line {keep}: {done.transcript} shares lines 1..{keep} and continues with "
                  f"the {args.planner} planner: {done.result.events} events, {done.result.status}.", markup=False)
    return 0 if done.result.status in ("completed", "budget_spent") else 1
