"""`sleuth investigate --class CLASS`: audit one class end to end and print the findings with their evidence."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from sleuth.agent.backend_args import add_backend_arguments, backend_config, build_backends, check_backend_args
from sleuth.agent.cli import UsageError
from sleuth.agent.planner_args import add_planner_arguments, attach_session, build_planner, check_planner_args

NAME = "investigate"
HELP = "Investigate one class: find failure hypotheses, test, refine, confirm, and record findings."

MAX_BUDGET = 1_000_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--class", dest="label", required=True, help="Class to audit, e.g. cat.")
    p.add_argument("--budget", type=int, default=20_000, help="Most images to generate (default 20000).")
    p.add_argument("--baseline-n", type=int, default=1000, help="Images for the class baseline (default 1000).")
    p.add_argument("--seed", type=int, default=0, help="Investigation seed (selects fresh image seeds).")
    p.add_argument("--criterion", choices=["top1", "topk", "parent"], default="top1",
                   help="Failure criterion: top-1 wrong, label not in top-3, or no top-3 label under the true "
                        "label's parent (Wiles et al.). Default top1.")
    p.add_argument("--alpha", type=float, default=0.05, help="Family-wise error level (default 0.05).")
    p.add_argument("--runs", default="runs", help="Folder for run directories (default ./runs).")
    p.add_argument("--json", action="store_true", help="Print a JSON summary instead of the terminal report.")
    p.add_argument("--quiet", action="store_true", help="No live transcript, only the findings table.")
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
    check_planner_args(args)
    check_backend_args(args)


def _json_number(x: float | str | None) -> float | None:
    """Strict JSON has no infinity: an infinite ratio (no baseline failures) is null."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def summary(session: Any, result: Any, seconds: float) -> dict[str, Any]:
    inv = session.investigation
    findings = []
    for f in inv.findings:
        d, c = f["discovery"], f["confirmation"]
        findings.append({
            "caption": f["caption"],
            "confirmed": f["confirmed"],
            "adjusted_p": d["adjusted_p"],
            "confirmation_adjusted_p": c["adjusted_p"],
            "rate_ratio": _json_number(d["rate_ratio"]["ratio"]),
            "rate_ratio_ci": [_json_number(d["rate_ratio"]["low"]), _json_number(d["rate_ratio"]["high"])],
            "baseline": {"k": d["baseline"]["k"], "n": d["baseline"]["n"]},
            "hypothesis": {"k": d["hypothesis"]["k"], "n": d["hypothesis"]["n"]},
            "confirmation": {"k": c["hypothesis"]["k"], "n": c["hypothesis"]["n"],
                             "baseline_k": c["baseline"]["k"], "baseline_n": c["baseline"]["n"]},
        })
    return {
        "class": inv.label,
        "status": result.status,
        "images": inv.budget.used,
        "baseline": ({"k": base.k, "n": base.n} if (base := inv.baselines.get("discovery")) is not None else None),
        "seconds": round(seconds, 2),
        "transcript": str(session.transcript),
        "hypotheses_tested": len([t for t in inv.tests if t.purpose == "discovery"]),
        "findings": findings,
        "answer": result.answer,
    }


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sleuth.agent.progress import ProgressBars
    from sleuth.agent.render import render_event
    from sleuth.agent.report_table import findings_table
    from sleuth.agent.session import Session, new_run_dir
    from sleuth.tools.registry import ToolError

    check_args(args)
    console = Console(stderr=args.json)
    bars = ProgressBars(console, enabled=not args.json and console.is_terminal)
    with bars:
        backends = build_backends(args, progress=bars.update)
    labels = backends.classifier.labels
    if args.label not in labels.labels:
        raise UsageError(labels.unknown_message(args.label))
    run_dir = new_run_dir(Path(args.runs), args.label, args.seed)
    planner = build_planner(args, backends, args.label)
    config = {"class": args.label, "world": args.world, "budget": args.budget, "baseline_n": args.baseline_n,
              "seed": args.seed, "criterion": args.criterion, "alpha": args.alpha, "planner": planner.name,
              "backends": backend_config(args)}
    try:
        session = Session(backends=backends, label=args.label, run_dir=run_dir, config=config, seed=args.seed,
                          budget=args.budget, criterion=args.criterion, alpha=args.alpha, progress=bars.update)
    except ToolError as e:
        raise UsageError(str(e)) from None
    attach_session(planner, session)  # an LLM planner reads images and the LLM helps perturb captions
    if not args.json and not args.quiet:
        def show(event: Any) -> None:
            renderable = render_event(event)
            if renderable is not None:
                bars.print(renderable)
        session.subscribers.append(show)
    t0 = time.perf_counter()
    with bars:
        result = session.run(planner)
    seconds = time.perf_counter() - t0
    out = summary(session, result, seconds)
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        console.print(findings_table(session.investigation))
        console.print(f"{out['images']} images, {seconds:.1f} s. Transcript: {session.transcript}")
        console.print(f"Replay it with: sleuth replay {session.transcript}")
    return 0 if result.status == "completed" else 1
