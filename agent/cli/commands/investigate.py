"""`sleuth investigate --class CLASS`: audit one class end to end and print the findings with their evidence."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sleuth.agent.cli.flags import (
    add_backend_arguments,
    add_planner_arguments,
    add_run_arguments,
    build_backends,
    run_config,
)
from sleuth.agent.errors import UsageError

if TYPE_CHECKING:
    from sleuth.agent.mode_summary import ModeSummary
    from sleuth.agent.view import InvestigationView

NAME = "investigate"
HELP = "Investigate one class: find failure hypotheses, test, refine, confirm, and record findings."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.usage = "%(prog)s --class LABEL [options]"
    add_run_arguments(p)
    p.add_argument("--json", action="store_true", help="Print a JSON summary instead of the terminal report.")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="Stream every turn; end with every finding and test.")
    p.add_argument("--quiet", action="store_true", help="No progress line, only the final screen.")
    p.add_argument("--reveal", action="store_true",
                   help="toyworld only: after the run, the answer key (planted bugs and decoys, the findings that "
                        "match them, why a bug was missed); never shown to the planner or written")
    add_backend_arguments(p)
    add_planner_arguments(p)


def summary(session: Any, result: Any, seconds: float, modes: Sequence[ModeSummary] = ()) -> dict[str, Any]:
    """What ``--json`` prints: the run's outcome, its failure modes (``ModeSummary``) and its findings
    (``FindingSummary``, each with the id of its mode), as an audit's summary.json has them."""
    from sleuth.agent.mode_summary import mode_ids
    from sleuth.tools.findings import FindingSummary

    inv = session.investigation
    base = inv.baselines.get("discovery")
    ids = mode_ids(modes)
    return {
        "class": inv.label,
        "status": result.status,
        "images": inv.budget.used,
        "baseline": {"k": base.k, "n": base.n} if base is not None else None,
        "seconds": round(seconds, 2),
        "transcript": str(session.transcript),
        "confirmation_draw": session.config.confirmation_draw,
        "reaudit": session.reaudit,
        "hypotheses_tested": len([t for t in inv.tests if t.purpose == "discovery"]),
        "modes": [m.model_dump(mode="json") for m in modes],
        "findings": [{**FindingSummary.of(inv.label, f).model_dump(mode="json"), "mode_id": ids.get(f.finding_id)}
                     for f in inv.findings],
        "answer": result.answer,
    }


def answer_key(config: Any, out: dict[str, Any], view: InvestigationView) -> dict[str, Any]:
    """The answer key of a finished toyworld run, from its closed transcript's view and the world's oracle."""
    from sleuth.agent.bench.reveal import answer_key as key_of
    from sleuth.tools.backends.toyworld.config import load_world

    world = load_world(config.backends.world)
    return key_of(world, config.label, view, [f for f in out["findings"] if f["confirmed"]],
                  criterion=config.criterion)


def run(args: argparse.Namespace) -> int:
    # Flags, input files and the class are checked first: a mistake is reported before torch and the models load.
    config = run_config(args)
    if args.reveal:
        from sleuth.agent.bench.reveal import reveal_refusal

        refusal = reveal_refusal(config.backends)
        if refusal is not None:
            raise UsageError(refusal)

    from rich.text import Text

    from sleuth.agent.events import ErrorEvent
    from sleuth.agent.mode_summary import mode_summaries
    from sleuth.agent.session import Session, new_run_dir
    from sleuth.agent.terminal.progress import ProgressBars
    from sleuth.agent.terminal.render import render_event
    from sleuth.agent.terminal.tables import console as make_console
    from sleuth.agent.terminal.tables import end_screen, findings_table
    from sleuth.agent.view import InvestigationView
    from sleuth.tools.registry import ToolError

    console = make_console(stderr=args.json)
    bars = ProgressBars(console, enabled=not args.json and not args.quiet and console.is_terminal)
    with bars:
        backends = build_backends(config.backends, progress=bars.update)
    labels = backends.classifier.labels
    if config.label not in labels.labels:
        raise UsageError(labels.unknown_message(config.label))
    run_dir = new_run_dir(Path(args.runs), config.label, config.seed)
    try:
        session = Session(backends=backends, config=config, run_dir=run_dir, progress=bars.update)
    except ToolError as e:
        raise UsageError(str(e)) from None
    planner = session.planner()
    if session.reaudit and not args.json:
        console.print(Text(session.reaudit, style="yellow"))
    if args.verbose and not args.json:
        def show(event: Any) -> None:
            renderable = render_event(event)
            if renderable is not None:
                bars.print(renderable)
        session.subscribers.append(show)
    else:  # one live line: images used of the budget, and the findings so far
        inv = session.investigation

        def tick(event: Any) -> None:
            found = sum(f.confirmed for f in inv.findings)
            bars.update(f"{config.label}: images ({found} finding{'s' * (found != 1)})", inv.budget.used,
                        inv.budget.images, key="run")
        session.subscribers.append(tick)
    errors: list[str] = []
    session.subscribers.append(lambda e: errors.append(e.message) if isinstance(e, ErrorEvent) else None)
    t0 = time.perf_counter()
    with bars:
        result = session.run(planner)
    seconds = time.perf_counter() - t0
    # The modes as the closed transcript records them: the same ones a replay, the report and an audit read.
    view = InvestigationView.from_transcript(session.transcript)
    modes = mode_summaries(view)
    out = summary(session, result, seconds, modes)
    if result.status == "error" and session.investigation.budget.used == 0:
        # The run never started (e.g. the LLM server cannot be reached): no folder is left behind for it.
        session.discard()
        out["transcript"] = None
    # The transcript is closed: nothing of the answer key reaches the planner.
    key = answer_key(config, out, view) if args.reveal else None
    if key is not None:
        out["answer_key"] = key
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif result.status == "error" and not session.investigation.tests:
        # Nothing was measured (e.g. the LLM server cannot be reached): the reason, not an empty findings table.
        if args.quiet and errors:
            console.print(Text(f"error: {errors[-1]}", style="bold red"))
        console.print(Text("The run stopped with an error before generating any image; no run folder is kept.",
                           style="red"))
    else:
        inv = session.investigation
        console.print(findings_table(inv, modes=modes) if args.verbose else end_screen(inv, modes))
        if key is not None:
            from sleuth.agent.terminal.answer_key import render_answer_key

            console.print()
            console.print(render_answer_key(key))
        console.print()
        console.print(f"{out['images']:,} images, {seconds:.0f} s. Next: sleuth report {session.run_dir} --open",
                      markup=False)
        console.print(f"Every turn, finding and test: sleuth replay {session.run_dir}"
                      + ("" if args.verbose else " (or -v)"), markup=False)
    return 0 if result.status in ("completed", "budget_spent") else 1
