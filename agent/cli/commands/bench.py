"""`sleuth bench`: benchmarks. `sleuth bench throughput` times toyworld's generate + classify."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from sleuth.agent.errors import UsageError
from sleuth.tools.defaults import BASELINE_N, BUDGET

NAME = "bench"
HELP = "Benchmarks: `discovery` (planted-bug recall, false findings, calibration) and `throughput`."


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

    from sleuth.agent.planners import OFFLINE_PLANNERS as PLANNERS
    from sleuth.agent.planners import PLANNERS as REGISTRY

    d = sub.add_parser(
        "discovery", help="Investigate every class of a world with each planner; score against the oracle.",
        description="Runs investigations over a toyworld's classes with each planner, repeated over seeds, and "
                    "scores them against the oracle: recall of planted bugs, share of false findings, images and "
                    "seconds per bug found. --calibrate instead runs investigations against a null classifier "
                    "(errors independent of the image) and reports the share of runs that confirm anything. "
                    "Planners: " + "; ".join(f"{k}: {REGISTRY[k].help}" for k in PLANNERS) + ".")
    d.add_argument("--world", help="World config (file or packaged name); default: the embedded world.")
    d.add_argument("--classes", help="Comma-separated classes (default: all of the world's).")
    d.add_argument("--planners", default=",".join(PLANNERS), help=f"Comma-separated (default {','.join(PLANNERS)}).")
    d.add_argument("--seeds", default="0", help="Comma-separated investigation seeds, or a count like 3 → 0,1,2 "
                                                "(default 0).")
    d.add_argument("--budget", type=int, default=BUDGET, help=f"Images per investigation (default {BUDGET}).")
    d.add_argument("--baseline-n", type=int, default=BASELINE_N, help=f"Baseline images (default {BASELINE_N}).")
    d.add_argument("--oracle-n", type=int, default=10_000, help="Oracle images per judged caption (default 10000).")
    d.add_argument("--calibrate", action="store_true", help="Run the calibration instead (null classifier).")
    d.add_argument("--runs", type=int, default=50, help="Calibration investigations (default 50).")
    d.add_argument("--out", default=None, help="Folder for transcripts (default runs/bench-<time>).")
    d.add_argument("--json", action="store_true", help="Print the results as JSON.")
    d.set_defaults(_bench_run=run_discovery)


def run(args: argparse.Namespace) -> int:
    handler = getattr(args, "_bench_run", None)
    if handler is None:
        raise UsageError("missing sub-command: try `sleuth bench throughput`")
    return int(handler(args))


def run_throughput(args: argparse.Namespace) -> int:
    from sleuth.tools.backends.base import BackendError
    from sleuth.tools.backends.toyworld import load_backends

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
        b.classifier.logits([b.generator.generate([prompt], [0])[0].image])  # load weights, build banks
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


def _seeds(text: str) -> list[int]:
    try:
        if "," not in text and text.strip().isdigit() and not text.startswith("0"):
            return list(range(int(text)))
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--seeds must be a count or comma-separated integers, got {text!r}") from None


def run_discovery(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from sleuth.agent.bench.discovery import Calibration, DiscoveryBench
    from sleuth.agent.planners import OFFLINE_PLANNERS as PLANNERS
    from sleuth.agent.terminal.progress import ProgressBars

    planners = [p.strip() for p in args.planners.split(",") if p.strip()]
    bad = [p for p in planners if p not in PLANNERS]
    if bad or not planners:
        raise UsageError(f"unknown planner(s) {', '.join(bad) or '(none)'}; known: {', '.join(PLANNERS)}")
    seeds = _seeds(args.seeds)
    if not seeds or any(not 0 <= s < 65536 for s in seeds):
        raise UsageError("--seeds must name seeds in [0, 65535]")
    if not 1000 <= args.oracle_n <= 200_000:
        raise UsageError(f"--oracle-n must be between 1000 and 200000, got {args.oracle_n}")
    if not 1 <= args.runs <= 10_000:
        raise UsageError(f"--runs must be between 1 and 10000, got {args.runs}")
    root = Path(args.out) if args.out else Path("runs") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    console = Console(stderr=True)
    bars = ProgressBars(console, enabled=console.is_terminal)
    t0 = time.perf_counter()
    with bars:
        if args.calibrate:
            out = Calibration(runs=args.runs, planner=planners[0], world=args.world, budget=args.budget,
                              baseline_n=args.baseline_n, root=root, progress=bars.update).run()
        else:
            classes = [c.strip() for c in args.classes.split(",")] if args.classes else None
            try:
                out = DiscoveryBench(world=args.world, classes=classes, planners=planners, seeds=seeds,
                                     budget=args.budget, baseline_n=args.baseline_n, oracle_n=args.oracle_n,
                                     root=root, progress=bars.update).run()
            except ValueError as e:
                raise UsageError(str(e)) from None
    out["wall_seconds"] = round(time.perf_counter() - t0, 1)
    out["transcripts"] = str(root)
    (root / "bench.json").parent.mkdir(parents=True, exist_ok=True)
    (root / "bench.json").write_text(json.dumps(out, indent=2) + "\n")
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    out_console = Console()
    if args.calibrate:
        lo, hi = out["share_ci"]
        out_console.print(f"{out['runs_with_findings']}/{out['runs']} calibration runs confirmed a finding "
                          f"against a null classifier: {100 * out['share_with_findings']:.1f}% "
                          f"[{100 * lo:.1f}%, {100 * hi:.1f}%] (target ≤ 5%). {out['images']} images, "
                          f"{out['seconds']:.0f} s.")
    else:
        table = Table(title=f"Planted-bug discovery: world {out['world']}, {len(out['classes'])} classes, "
                            f"seeds {','.join(map(str, out['seeds']))}, budget {out['budget']}")
        for col in ("planner", "recall", "bugs found", "false findings", "images / bug", "seconds / bug"):
            table.add_column(col, justify="left" if col == "planner" else "right")
        for name, r in out["planners"].items():
            rec = (f"{100 * r['recall']:.0f}% [{100 * r['recall_ci'][0]:.0f}–{100 * r['recall_ci'][1]:.0f}%]"
                   if r["recall"] is not None else "n/a")
            fal = f"{r['false_confirmed']}/{r['confirmed_findings']}"
            table.add_row(name, rec, f"{r['bugs_found']}/{r['bugs_planted']}", fal,
                          str(r["images_per_bug"] or "–"), str(r["seconds_per_bug"] or "–"))
        out_console.print(table)
    out_console.print(f"Transcripts and bench.json in {root}")
    return 0
