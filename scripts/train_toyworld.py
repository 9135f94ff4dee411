"""Reproduce toyworld's shipped weights: train the classifier and captioner of the packaged worlds.

    python scripts/train_toyworld.py                 # default and nobugs, written to the package's weights/
    python scripts/train_toyworld.py --world my.yaml --out /tmp/my.safetensors
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sleuth.tools.backends.toyworld.config import load_world
from sleuth.tools.backends.toyworld.train import save_weights, shipped_path, train_all


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", action="append",
                   help="World config or packaged name (repeatable; default: default, nobugs).")
    p.add_argument("--out", help="Output file (only with a single --world); default: the package's weights/<name>.")
    args = p.parse_args(argv)
    worlds = args.world or ["default", "nobugs"]
    if args.out and len(worlds) != 1:
        p.error("--out needs exactly one --world")
    for name in worlds:
        world = load_world(name)
        start = time.perf_counter()
        last: dict[str, int] = {}

        def progress(task: str, done: int, total: int, last: dict[str, int] = last, name: str = world.name) -> None:
            if last.get(task) != done:
                last[task] = done
                print(f"  {name}: {task} {done}/{total}", file=sys.stderr, flush=True)

        tensors = train_all(world, progress)
        out = Path(args.out) if args.out else shipped_path(world)
        save_weights(tensors, world, out)
        print(f"{world.name}: {out} (config {world.config_hash()}, {time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
