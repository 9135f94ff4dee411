"""`sleuth world check`: the toyworld's measured numbers (accuracy, baselines, planted bugs, decoys, captioner)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sleuth.agent.errors import UsageError

NAME = "world"
HELP = "Inspect a toyworld config: measure its classifier, planted bugs and decoys."


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="world_command", metavar="SUBCOMMAND")
    check = sub.add_parser("check", help="Measure accuracy, class baselines, bug and decoy rates, captioner accuracy.",
                           description="Measure accuracy, class baselines, bug and decoy rates (paired seeds) and "
                                       "the captioner's attribute accuracy.")
    check.add_argument("--world", help="World config file (YAML or JSON); default: the embedded world.")
    check.add_argument("--n", type=int, default=2000, help="Images per condition (default 2000).")
    check.add_argument("--seed", type=int, default=7_000_000, help="First image seed (default 7000000).")
    check.add_argument("--criterion", choices=["top1", "topk", "parent"], default="top1",
                       help="Failure criterion (default top1).")
    check.add_argument("--json", action="store_true", help="Print the numbers as JSON.")
    check.set_defaults(_world_run=run_check)


def run(args: argparse.Namespace) -> int:
    handler = getattr(args, "_world_run", None)
    if handler is None:
        raise UsageError("missing sub-command: try `sleuth world check`")
    return int(handler(args))


def run_check(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sleuth.agent.terminal.progress import ProgressBars
    from sleuth.tools.backends.base import BackendError
    from sleuth.tools.backends.toyworld import Oracle, load_world
    from sleuth.tools.backends.toyworld.captioner import ToyCaptioner
    from sleuth.tools.backends.toyworld.classifier import ToyClassifier

    if not 100 <= args.n <= 100_000:
        raise UsageError(f"--n must be between 100 and 100000, got {args.n}")
    if args.world and not Path(args.world).is_file():
        raise UsageError(f"world config not found: {args.world}")
    console = Console(stderr=True)
    try:
        world = load_world(args.world)
        with ProgressBars(console, enabled=sys.stderr.isatty()) as bars:
            oracle = Oracle(world, ToyClassifier(world, progress=bars.update))
            report = oracle.check(args.n, args.seed, args.criterion, progress=bars.update,
                                  captioner=ToyCaptioner(world, progress=bars.update))
    except BackendError as e:
        raise UsageError(str(e)) from None
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        Console().print(render(report))
    return 0


def render(report: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table

    head = (f"world {report['world']} ({report['config_hash']}): in-distribution accuracy "
            f"{report['accuracy']:.3f}, {report['n_per_condition']} images per condition, {report['criterion']}")
    classes = Table("class", "baseline failure rate", title="class baselines")
    for c in report["classes"]:
        classes.add_row(c["name"], f"{c['k']}/{c['n']} = {c['baseline_rate']:.3f}")
    bugs = Table("kind", "name", "class", "baseline", "rate", "ratio", "confused with", title="planted bugs and decoys")
    for kind in ("bugs", "decoys"):
        for b in report[kind]:
            label = b.get("strength") if kind == "bugs" else "decoy"
            bugs.add_row(label, b["name"], b["class"], f"{b['baseline_rate']:.3f}", f"{b['rate']:.3f}",
                         f"{b['ratio']:.1f}x", b.get("most_confused_with") or "")
    parts: list[Any] = [head, classes, bugs]
    cap = report.get("captioner")
    if cap:
        t = Table("condition", *cap["accuracy"].keys(), title="captioner attribute accuracy")
        for name, acc in [("all", cap["accuracy"]), *cap["by_condition"].items()]:
            t.add_row(name, *(f"{v:.2f}" for v in acc.values()))
        parts.append(t)
    return Group(*parts)
