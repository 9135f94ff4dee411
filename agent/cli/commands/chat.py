"""`sleuth chat --class CLASS`: talk to sleuth in the terminal; slash commands drive the tools, an LLM plans."""

from __future__ import annotations

import argparse
from pathlib import Path

from sleuth.agent.cli.flags import (
    add_backend_arguments,
    add_planner_arguments,
    add_run_arguments,
    build_backends,
    run_config,
)
from sleuth.agent.errors import UsageError

NAME = "chat"
HELP = "Talk to sleuth in the terminal: slash commands drive the tools; with --llm, an LLM plans and answers."

MAX_TURNS_PER_MESSAGE = 40


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.usage = "%(prog)s --class LABEL [options]"
    add_run_arguments(p, max_turns=False)
    p.add_argument("--max-turns", type=int, default=MAX_TURNS_PER_MESSAGE,
                   help=f"most planner turns per message ({MAX_TURNS_PER_MESSAGE})")
    p.add_argument("--no-progress", action="store_true", help="no progress bars or spinners")
    add_backend_arguments(p)
    add_planner_arguments(p)


def run(args: argparse.Namespace) -> int:
    # Flags, input files and the class are checked first: a mistake is reported before torch and the models load.
    if not 1 <= args.max_turns <= 1000:
        raise UsageError(f"--max-turns must be between 1 and 1000, got {args.max_turns}")
    config = run_config(args)

    from rich.console import Console

    from sleuth.agent.chat import Chat, ProgressRelay, auto_planner, banner
    from sleuth.agent.chat.lineedit import line_reader
    from sleuth.agent.runner import Planner
    from sleuth.agent.session import Session, new_run_dir
    from sleuth.agent.terminal.progress import ProgressBars
    from sleuth.agent.transcript import TranscriptWriter
    from sleuth.tools.registry import ToolError

    console = Console(highlight=False)
    show_bars = console.is_terminal and not args.no_progress
    with ProgressBars(console, enabled=show_bars) as bars:
        backends = build_backends(config.backends, progress=bars.update)
        if config.planner.llm is not None:
            from sleuth.agent.llm.client import import_litellm

            import_litellm()  # seconds of imports: better spent here than at the first question
    labels = backends.classifier.labels
    if config.label not in labels.labels:
        raise UsageError(labels.unknown_message(config.label))
    run_dir = new_run_dir(Path(args.runs), config.label, config.seed)
    relay = ProgressRelay()
    try:
        session = Session(backends=backends, config=config, run_dir=run_dir, progress=relay.update, command="chat")
    except ToolError as e:
        raise UsageError(str(e)) from None
    planner = session.planner(mode="chat") if config.planner.llm is not None else None
    inv = session.investigation

    def protocol() -> Planner:
        return auto_planner(session, config.planner.baseline_n)

    model = config.planner.llm.model if config.planner.llm is not None else None
    with TranscriptWriter(session.transcript) as writer, line_reader(console.input) as read:
        chat = Chat(session, writer, console, planner=planner, relay=relay, bars=show_bars,
                    max_turns=args.max_turns, protocol=protocol)
        console.print(banner(config.label, config.budget, str(session.transcript), model))
        if session.reaudit:
            console.print(session.reaudit, style="yellow", markup=False)
        chat.start()
        status = chat.loop(read)
        chat.finish(status)
    n = len(inv.findings)
    console.print(f"{inv.budget.used} images, {n} finding{'s' * (n != 1)}. "
                  f"Replay it with: sleuth replay {session.transcript}", markup=False)
    return 0
