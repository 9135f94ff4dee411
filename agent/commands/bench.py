"""`sleuth bench`: benchmarks. `sleuth bench throughput` times toyworld's generate + classify."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from agent.cli import UsageError

NAME = "bench"
HELP = "Benchmarks: `throughput` (toyworld images per second)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")
    t = sub.add_parser("throughput", help="Images per second of toyworld generate + classify.",
                       description="Time toyworld's generator and classifier on batches of one prompt.")
    t.add_argument("--world", help="World config file; default: the embedded world.")
    t.add_argument("--n", type=int, default=4000, help="Images to time (default 4000).")
    t.add_argument("--size", type=int, default=64, help="Image size in pixels (default 64).")
    t.add_argument("--batch", type=int, default=500, help="Images per batch (default 500).")
    t.add_argument("--json", action="store_true", help="Print the numbers as JSON.")
    t.set_defaults(_bench_run=run_throughput)


def run(args: argparse.Namespace) -> int:
    handler = getattr(args, "_bench_run", None)
    if handler is None:
        raise UsageError("missing sub-command: try `sleuth bench throughput`")
    return int(handler(args))


def run_throughput(args: argparse.Namespace) -> int:
    from tools.backends.base import BackendError
    from tools.backends.toyworld import load_backends

    if not 1 <= args.n <= 1_000_000:
        raise UsageError(f"--n must be between 1 and 1000000, got {args.n}")
    if not 1 <= args.batch <= 10_000:
        raise UsageError(f"--batch must be between 1 and 10000, got {args.batch}")
    if args.world and not Path(args.world).is_file():
        raise UsageError(f"world config not found: {args.world}")
    try:
        b = load_backends(args.world, size=args.size)
        label = b.classifier.labels.labels[0]
        prompt = b.prompt_for(label)
        b.classifier.logits(b.generator.generate([prompt], [0])[0].image[None])  # load weights, build banks
        gen_s = clf_s = 0.0
        for start in range(0, args.n, args.batch):
            seeds = list(range(start, min(args.n, start + args.batch)))
            t0 = time.perf_counter()
            gens = b.generator.generate([prompt] * len(seeds), seeds)
            t1 = time.perf_counter()
            b.classifier.logits([g.image for g in gens])
            t2 = time.perf_counter()
            gen_s, clf_s = gen_s + t1 - t0, clf_s + t2 - t1
    except BackendError as e:
        raise UsageError(str(e)) from None
    out = {"images_per_s": args.n / (gen_s + clf_s), "generate_images_per_s": args.n / gen_s,
           "classify_images_per_s": args.n / clf_s, "n": args.n, "size": args.size, "batch": args.batch}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['images_per_s']:.0f} images/s (generate {out['generate_images_per_s']:.0f}/s, "
              f"classify {out['classify_images_per_s']:.0f}/s) at {args.size} px, {args.n} images")
    return 0
