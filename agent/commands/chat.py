"""`sleuth chat --class CLASS`: talk to sleuth in the terminal; slash commands drive the tools, an LLM plans."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sleuth.agent.backend_args import add_backend_arguments, backend_config, build_backends, check_backend_args
from sleuth.agent.cli import UsageError
from sleuth.agent.planner_args import add_planner_arguments, build_llm_planner, check_planner_args

NAME = "chat"
HELP = "Talk to sleuth in the terminal: slash commands drive the tools; with --llm, an LLM plans and answers."

MAX_BUDGET = 1_000_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--class", dest="label", required=True, help="Class to audit, e.g. cat.")
    p.add_argument("--budget", type=int, default=20_000, help="Most images to generate (default 20000).")
    p.add_argument("--baseline-n", type=int, default=1000, help="Baseline size for /auto (default 1000).")
    p.add_argument("--seed", type=int, default=0, help="Investigation seed (selects fresh image seeds).")
    p.add_argument("--criterion", choices=["top1", "topk", "parent"], default="top1",
                   help="Failure criterion (default top1).")
    p.add_argument("--alpha", type=float, default=0.05, help="Family-wise error level (default 0.05).")
    p.add_argument("--runs", default="runs", help="Folder for run directories (default ./runs).")
    p.add_argument("--max-turns", type=int, default=40,
                   help="Most LLM planner turns per message (default 40).")
    p.add_argument("--no-progress", action="store_true", help="No progress bars or spinners.")
    add_backend_arguments(p)
    add_planner_arguments(p)


def check_args(args: argparse.Namespace) -> None:
    if not 1 <= args.budget <= MAX_BUDGET:
        raise UsageError(f"--budget must be between 1 and {MAX_BUDGET}, got {args.budget}")
    if not 50 <= args.baseline_n <= 20_000:
        raise UsageError(f"--baseline-n must be between 50 and 20000, got {args.baseline_n}")
    if not 0 < args.alpha < 0.5:
        raise UsageError(f"--alpha must be in (0, 0.5), got {args.alpha}")
    if not 0 <= args.seed < 65536:
        raise UsageError(f"--seed must be in [0, 65535], got {args.seed}")
    if not 1 <= args.max_turns <= 1000:
        raise UsageError(f"--max-turns must be between 1 and 1000, got {args.max_turns}")
    check_planner_args(args)
    check_backend_args(args)


def _public_url(url: str | None) -> str | None:
    """The URL without any user:password part (it would otherwise be written to the transcript)."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sleuth.agent.chat import Chat, ProgressRelay, banner
    from sleuth.agent.planners.protocol import ProtocolPlanner
    from sleuth.agent.progress import ProgressBars
    from sleuth.agent.session import Session, new_run_dir
    from sleuth.agent.transcript import TranscriptWriter
    from sleuth.tools.registry import ToolError

    check_args(args)
    console = Console(highlight=False)
    show_bars = console.is_terminal and not args.no_progress
    with ProgressBars(console, enabled=show_bars) as bars:
        backends = build_backends(args, progress=bars.update)
        if args.llm:
            from sleuth.agent.llm.client import import_litellm

            import_litellm()  # seconds of imports: better spent here than at the first question
    labels = backends.classifier.labels
    if args.label not in labels.labels:
        raise UsageError(labels.unknown_message(args.label))
    run_dir = new_run_dir(Path(args.runs), args.label, args.seed)
    config: dict[str, Any] = {"class": args.label, "world": args.world, "budget": args.budget,
                              "baseline_n": args.baseline_n, "seed": args.seed, "criterion": args.criterion,
                              "alpha": args.alpha, "llm": args.llm, "api_base": _public_url(args.api_base),
                              "planner_sees_images": args.planner_sees_images, "backends": backend_config(args)}
    relay = ProgressRelay()
    try:
        session = Session(backends=backends, label=args.label, run_dir=run_dir, config=config, seed=args.seed,
                          budget=args.budget, criterion=args.criterion, alpha=args.alpha, progress=relay.update,
                          command="chat")
    except ToolError as e:
        raise UsageError(str(e)) from None
    planner = build_llm_planner(args, backends, args.label, session=session, mode="chat") if args.llm else None
    class_prompt = backends.prompt_for(args.label)
    with TranscriptWriter(session.transcript) as writer:
        chat = Chat(session, writer, console, planner=planner, relay=relay, bars=show_bars,
                    max_turns=args.max_turns,
                    protocol=lambda: ProtocolPlanner(args.label, class_prompt, baseline_n=args.baseline_n))
        console.print(banner(args.label, args.budget, str(session.transcript), args.llm))
        chat.start()
        status = chat.loop(console.input)
        chat.finish(status)
    n = len(session.investigation.findings)
    console.print(f"{session.investigation.budget.used} images, {n} finding{'s' * (n != 1)}. "
                  f"Replay it with: sleuth replay {session.transcript}")
    return 0
