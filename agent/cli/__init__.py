"""The `sleuth` command line: one sub-command per module in agent.commands."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from sleuth.agent.errors import UsageError

# Sub-command modules, in the order `sleuth --help` lists them.
COMMANDS = ("investigate", "chat", "audit", "runs", "mitigate", "replay", "report", "classify", "world", "bench")


def _load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"sleuth.agent.cli.commands.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"sleuth.agent.cli.commands.{name}":
            return None
        raise


def build_parser() -> argparse.ArgumentParser:
    from sleuth import __version__

    parser = argparse.ArgumentParser(
        prog="sleuth", description="Audit an image classifier with generated images, captions and statistics."
    )
    parser.add_argument("--version", action="version", version=f"sleuth {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = _load(name)
        if module is None:
            continue
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from sleuth.tools.backends.base import BackendError

    # litellm fetches a model cost map at import unless told not to; sleuth works offline.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except UsageError as e:
        print(f"sleuth {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BackendError as e:
        # A missing model, an unusable world config, an image a backend cannot take: the user's to fix.
        print(f"sleuth {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"sleuth {args.command}: interrupted", file=sys.stderr)
        return 130


def entrypoint() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entrypoint()
