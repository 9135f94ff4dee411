"""Command-line flags that choose the backends, shared by every command that runs an investigation."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from agent.cli import UsageError
from tools.backends.base import Backends

Progress = Callable[[str, int, int], None]


def add_backend_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--world", help="toyworld config: a YAML/JSON file or a packaged world name (default, nobugs). "
                                   "Default: the embedded default world.")


def check_backend_args(args: argparse.Namespace) -> None:
    from tools.backends.toyworld.config import load_world
    from tools.backends.base import BackendError

    if args.world:
        try:
            load_world(args.world)
        except BackendError as e:
            raise UsageError(str(e)) from None


def build_backends(args: argparse.Namespace, progress: Progress | None = None) -> Backends:
    """The backends the flags name (toyworld unless told otherwise)."""
    from tools.backends.toyworld import load_backends

    return load_backends(args.world, progress=progress)
