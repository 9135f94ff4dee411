"""Train toyworld-clip and toyworld-sd from the default world's renders, on CPU, with fixed seeds.

    python scripts/train_toyworld_sd.py [--out DIR] [--seed 0] [--threads 2] [--clip-steps N] [--vae-steps N]
                                        [--unet-steps N] [--offset-steps N] [--resume DIR]

Writes ``DIR/toyworld-clip`` (a transformers CLIPModel folder) and ``DIR/toyworld-sd`` (a diffusers
StableDiffusionPipeline folder), each with ``training.json`` (settings, seconds, versions). The default ``DIR`` is
the package's weights folder, where ``--generator diffusers:toyworld-sd``, ``--editor sd-edit:toyworld-sd`` and
``--embedder toyworld-clip`` find them. Then measure them with ``sleuth world check --diffusion``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, Any]:
    """The command line: every training setting is a flag (``--unet-steps 6000``, ``--no-unet-pooled-text``)."""
    from sleuth.tools.backends.packaged import WEIGHTS
    from sleuth.tools.backends.toyworld.diffusion.train import TrainSettings

    defaults = TrainSettings()
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, default=WEIGHTS, help=f"output folder (default {WEIGHTS})")
    p.add_argument("--world", help="world config (default: the embedded default world)")
    p.add_argument("--resume", type=Path, metavar="DIR",
                   help="take the tokenizer, toyworld-clip, the autoencoder and the UNet from an earlier run's DIR "
                        "(trained without the offset stage, with the same settings) and train only the offset stage")
    for name, value in defaults.model_dump().items():
        flag = f"--{name.replace('_', '-')}"
        if isinstance(value, tuple):
            p.add_argument(flag, type=_ints, default=value, metavar="N,N,...",
                           help=f"default {','.join(map(str, value))}")
        elif isinstance(value, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=value, help=f"default {value}")
        else:
            p.add_argument(flag, type=type(value), default=value, help=f"default {value}")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars or log lines")
    args = p.parse_args(argv)
    return args, TrainSettings(**{k: getattr(args, k) for k in defaults.model_dump()})


def main(argv: list[str] | None = None) -> int:
    args, settings = parse(argv)

    import torch
    from rich.console import Console

    from sleuth.agent.terminal.progress import ProgressBars
    from sleuth.tools.backends.toyworld import load_world
    from sleuth.tools.backends.toyworld.diffusion.train import Trainer

    console = Console(stderr=True)
    world = load_world(args.world)
    start = time.perf_counter()
    with ProgressBars(console, enabled=not args.quiet and sys.stderr.isatty()) as bars:
        log = (lambda _m: None) if args.quiet else (lambda m: console.log(m))
        try:
            record = Trainer(world, settings, progress=bars.update, log=log).run(args.out, resume=args.resume)
        except ValueError as e:
            console.print(f"[red]error:[/] {e}")
            return 2
    record["seconds"]["total"] = time.perf_counter() - start
    if "resumed" in record:  # the whole training: the earlier run's stages and this one
        record["seconds"]["total"] += record["resumed"]["seconds"].get("total", 0.0)
    import diffusers
    import transformers

    record["versions"] = {"torch": torch.__version__, "diffusers": diffusers.__version__,
                          "transformers": transformers.__version__, "python": platform.python_version()}
    record["cpu"] = platform.processor() or platform.machine()
    sizes = {}
    for name in ("toyworld-clip", "toyworld-sd"):
        folder = args.out / name
        (folder / "training.json").write_text(json.dumps(record, indent=2) + "\n")
        sizes[name] = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    record["bytes"] = sizes
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
