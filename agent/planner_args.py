"""Command-line flags that choose the planner, shared by every command that runs an investigation."""

from __future__ import annotations

import argparse

from agent.loop import Planner
from tools.backends.base import Backends

PLANNERS = ("protocol",)


def add_planner_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--planner", choices=PLANNERS, default="protocol",
                   help="Planner (default protocol: the offline, deterministic procedure).")


def check_planner_args(args: argparse.Namespace) -> None:
    """Reject bad planner flags before any model is loaded."""


def build_planner(args: argparse.Namespace, backends: Backends, label: str) -> Planner:
    from agent.planners.protocol import ProtocolPlanner

    return ProtocolPlanner(label, backends.prompt_for(label), baseline_n=args.baseline_n)
