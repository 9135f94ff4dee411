"""Reproduce toyworld's shipped weights: train the classifier and captioner of the packaged worlds.

    python scripts/train_toyworld.py                 # default and nobugs, written to the package's weights/
    python scripts/train_toyworld.py --world my.yaml --out /tmp/my.safetensors
    python scripts/train_toyworld.py --random 20     # the benchmark's random worlds 0-19, to weights/random/<hash>
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sleuth.tools.backends.toyworld.config import load_world
from sleuth.tools.backends.toyworld.random_world import random_world
from sleuth.tools.backends.toyworld.train import save_weights, shipped_by_hash, shipped_path, train_all


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", action="append",
                   help="World config or packaged name (repeatable; default: default, nobugs).")
    p.add_argument("--out", help="Output file (only with a single --world); default: the package's weights/<name>.")
    p.add_argument("--random", type=int, metavar="N",
                   help="Random worlds 0..N-1 instead (sleuth world random), written to weights/random/<config hash>.")
    args = p.parse_args(argv)
    if args.random is not None and (args.world or args.out):
        p.error("--random takes neither --world nor --out")
    worlds = [random_world(s) for s in range(args.random)] if args.random is not None else \
        [load_world(name) for name in args.world or ["default", "nobugs"]]
    if args.out and len(worlds) != 1:
        p.error("--out needs exactly one --world")
    for world in worlds:
        start = time.perf_counter()
        last: dict[str, int] = {}

        def progress(task: str, done: int, total: int, last: dict[str, int] = last, name: str = world.name) -> None:
            if last.get(task) != done:
                last[task] = done
                print(f"  {name}: {task} {done}/{total}", file=sys.stderr, flush=True)

        tensors = train_all(world, progress)
        if args.out:
            out = Path(args.out)
        else:
            out = shipped_by_hash(world.config_hash()) if args.random is not None else shipped_path(world)
        save_weights(tensors, world, out)
        print(f"{world.name}: {out} (config {world.config_hash()}, {time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
