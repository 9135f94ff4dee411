"""`sleuth bench`: benchmarks. `sleuth bench throughput` times toyworld's generate + classify."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from sleuth.agent.errors import UsageError
from sleuth.tools.defaults import BASELINE_N, BUDGET

NAME = "bench"
HELP = ("Benchmarks: `discovery` (planted-bug recall, false findings, calibration), `mitigation` (a mitigated "
        "classifier against the planted bugs) and `throughput`.")


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

    from sleuth.agent.planners import ADVERSARIAL_PLANNERS as ADVERSARIES
    from sleuth.agent.planners import OFFLINE_PLANNERS as PLANNERS
    from sleuth.agent.planners import PLANNERS as REGISTRY

    m = sub.add_parser(
        "mitigation", help="A mitigated toyworld classifier against the world's planted bugs (its oracle).",
        description="Renders every planted bug's and decoy's caption on the same fresh seeds for the original and the "
                    "mitigated classifier: before and after failure rates, their ratio, the exact McNemar p that the "
                    "rate went down (Holm over the bugs), and paired top-1 accuracy with a non-inferiority test on "
                    "the training distribution and on the class prompts.")
    m.add_argument("weights", metavar="MITIGATION",
                   help="What `sleuth mitigate` wrote: its folder, or the classifier.safetensors in it.")
    m.add_argument("--world", help="World config file or packaged name (default: the one the mitigation used).")
    m.add_argument("--n", type=int, default=3000, help="Images per planted bug or decoy (default 3000).")
    m.add_argument("--n-per-class", type=int, default=1000, help="Images per class for accuracy (default 1000).")
    m.add_argument("--margin", type=float, default=0.01, help="Non-inferiority margin (default 0.01: one point).")
    m.add_argument("--json", action="store_true", help="Print the numbers as JSON.")
    m.set_defaults(_bench_run=run_mitigation)

    d = sub.add_parser(
        "discovery", help="Investigate worlds' classes with each planner; score against each world's oracle.",
        description="Runs investigations over toyworld worlds (--worlds random:20 for random worlds 0..19) with each "
                    "planner and scores them against each world's oracle: recall of planted bugs with a Wilson "
                    "interval and by strength band, false findings (a finding is real when the oracle's 95% interval "
                    "for its rate ratio lies above 1.2), images and seconds per class, images until each bug is first "
                    "confirmed, and recall against budget. Classes run in parallel processes; results are filed as "
                    "they finish and reused by a later run with the same --out. --calibrate instead runs "
                    "investigations against null classifiers (errors independent of the image) and partial-null "
                    "ones (one attribute value matters, so which captions are null is known), with the offline "
                    "planners and adversarial scripts, and reports per planner how often a null hypothesis got "
                    "through discovery, confirmation and recording (k/n runs with 95%% intervals; the guarantee: "
                    "at most alpha). "
                    "Planners: " + "; ".join(f"{k}: {REGISTRY[k].help}" for k in PLANNERS) + ".")
    d.add_argument("--worlds", help="Comma list of worlds: random:N (random worlds 0..N-1), packaged names "
                                    "(default, nobugs) or config files (default: default).")
    d.add_argument("--world", help="One world (file or packaged name); the same as --worlds WORLD.")
    d.add_argument("--classes", help="Comma-separated classes, in every world, or all (default: the classes with "
                                     "planted bugs, plus --bug-free).")
    d.add_argument("--bug-free", type=int, default=0, metavar="K",
                   help="Also investigate K classes per world without a planted bug (default 0).")
    d.add_argument("--planners", default=None,
                   help=f"Comma-separated (default {','.join(PLANNERS)}; with --calibrate also the adversaries "
                        f"{','.join(ADVERSARIES)}); llm:MODEL for a language model, protocol+llm:MODEL for the "
                        "protocol planner with a language model proposing candidates.")
    d.add_argument("--llm", metavar="MODEL", help="Add the llm planner with this litellm model (llm:MODEL).")
    d.add_argument("--api-base", metavar="URL", help="OpenAI-compatible server of the llm: and protocol+llm: "
                                                     "planners, e.g. http://127.0.0.1:8080/v1.")
    d.add_argument("--tool-choice", choices=["auto", "required"], metavar="auto|required",
                   help="The llm planner's tool choice (required: forced calls).")
    d.add_argument("--call-format", choices=["tools", "json"], metavar="tools|json",
                   help="How the llm planner's calls are asked for (json: a schema-constrained reply).")
    d.add_argument("--llm-timeout", type=float, metavar="S", help="Seconds per language-model request.")
    d.add_argument("--llm-context", type=int, metavar="TOKENS", help="The llm planner's rough token budget per "
                                                                     "request (default 24000).")
    d.add_argument("--max-seconds", type=float, metavar="S", help="Most seconds of one llm planner's run.")
    d.add_argument("--jobs", type=int, default=None, help="Worker processes (default: the number of CPU cores).")
    d.add_argument("--seeds", default="0", help="Comma-separated investigation seeds, or a count like 3 → 0,1,2 "
                                                "(default 0).")
    d.add_argument("--budget", type=int, default=BUDGET, help=f"Images per investigation (default {BUDGET}).")
    d.add_argument("--baseline-n", type=int, help="Baseline images (default: each planner's own, 300 for protocol "
                                                  f"and {BASELINE_N} for the others).")
    d.add_argument("--oracle-n", type=int, default=10_000, help="Oracle images per judged caption (default 10000).")
    d.add_argument("--calibrate", action="store_true", help="Run the calibration instead (null classifier).")
    d.add_argument("--runs", type=int, default=80, help="Calibration investigations per planner and kind of "
                                                        "classifier (default 80: 0 of 80 bounds the rate below 5%%).")
    d.add_argument("--calibrate-budget", type=int, default=6000,
                   help="Images per calibration investigation (default 6000).")
    d.add_argument("--out", default=None, help="Folder for results and transcripts (default runs/bench-<time>); "
                                               "an existing one is resumed.")
    d.add_argument("--json", action="store_true", help="Print the results as JSON.")
    d.set_defaults(_bench_run=run_discovery)

    c = sub.add_parser(
        "compare", help="Two discovery benchmarks side by side, bug by bug (paired McNemar; recall by N images).",
        description="Pairs the planted bugs of two `sleuth bench discovery` results (their --json output or --out "
                    "folders) and reports, over the bugs the classifier learned (>= 2x) and those >= 5x: recall on "
                    "each side, the bugs found on one side only with the exact McNemar p, and the same within --by "
                    "images. Two planners on the same worlds, or one planner given two budgets (what it has found "
                    "by N images should not depend on the budget).")
    c.add_argument("a", metavar="A", help="A benchmark's --json output or --out folder.")
    c.add_argument("b", metavar="B", help="Another, on the same worlds.")
    c.add_argument("--planner-a", help="A's planner (default: its only one, or protocol).")
    c.add_argument("--planner-b", help="B's planner (default: its only one, or protocol).")
    c.add_argument("--by", default="3000,5000", help="Comma-separated image counts (default 3000,5000).")
    c.add_argument("--transcripts", action="store_true",
                   help="Also compare each class's two transcripts call by call: the images until they first differ "
                        "(a planner given two budgets should make the same calls until the smaller one binds).")
    c.add_argument("--json", action="store_true", help="Print the comparison as JSON.")
    c.set_defaults(_bench_run=run_compare)


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


def _planners(args: argparse.Namespace) -> list[str]:
    from sleuth.agent.planners import ADVERSARIAL_PLANNERS, OFFLINE_PLANNERS
    from sleuth.agent.planners import PLANNERS as REGISTRY

    default = [*OFFLINE_PLANNERS, *(ADVERSARIAL_PLANNERS if args.calibrate else ())]
    planners = [p.strip() for p in args.planners.split(",") if p.strip()] if args.planners else default
    if args.llm:
        planners.append(f"llm:{args.llm}")
    bad = [p for p in planners if (p.split(":", 1)[0] not in (*REGISTRY, "protocol+llm") or p in ("llm", "protocol+llm")
                                   or p.endswith(":"))]
    if bad or not planners:
        raise UsageError(f"unknown planner(s) {', '.join(bad) or '(none)'}; known: "
                         f"{', '.join(k for k in REGISTRY if k != 'llm')}, llm:MODEL (or --llm MODEL), "
                         "protocol+llm:MODEL")
    from sleuth.agent.bench.discovery import uses_llm

    if not any(uses_llm(p) for p in planners):
        for flag, value in (("--api-base", args.api_base), ("--tool-choice", args.tool_choice),
                            ("--call-format", args.call_format), ("--llm-timeout", args.llm_timeout),
                            ("--llm-context", args.llm_context), ("--max-seconds", args.max_seconds)):
            if value is not None:
                raise UsageError(f"{flag} is for a planner with a language model (llm:MODEL or protocol+llm:MODEL)")
    if len(set(planners)) != len(planners):
        raise UsageError(f"--planners names a planner twice: {','.join(planners)}")
    return planners


def run_discovery(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sleuth.agent.bench.calibrate import Calibration
    from sleuth.agent.bench.multiworld import MultiWorldBench
    from sleuth.agent.bench.table import discovery_table
    from sleuth.agent.bench.worlds import parse_worlds
    from sleuth.agent.terminal.progress import ProgressBars

    planners = _planners(args)
    seeds = _seeds(args.seeds)
    if not seeds or any(not 0 <= s < 65536 for s in seeds):
        raise UsageError("--seeds must name seeds in [0, 65535]")
    if not 1000 <= args.oracle_n <= 200_000:
        raise UsageError(f"--oracle-n must be between 1000 and 200000, got {args.oracle_n}")
    if not 1 <= args.runs <= 10_000:
        raise UsageError(f"--runs must be between 1 and 10000, got {args.runs}")
    jobs = args.jobs if args.jobs is not None else (os.cpu_count() or 1)
    if not 1 <= jobs <= 256:
        raise UsageError(f"--jobs must be between 1 and 256, got {jobs}")
    if args.bug_free < 0:
        raise UsageError(f"--bug-free must be a count of classes, got {args.bug_free}")
    if args.world and args.worlds:
        raise UsageError("give --worlds or --world, not both")
    if args.calibrate and args.worlds:
        raise UsageError("--calibrate runs on one world: use --world")
    root = Path(args.out) if args.out else Path("runs") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    console = Console(stderr=True)
    bars = ProgressBars(console, enabled=console.is_terminal)
    t0 = time.perf_counter()
    if args.calibrate:
        with bars:
            out = Calibration(runs=args.runs, planners=planners, world=args.world, budget=args.calibrate_budget,
                              baseline_n=args.baseline_n, jobs=jobs, root=root, progress=bars.update).run()
    else:
        classes = [c.strip() for c in args.classes.split(",") if c.strip()] if args.classes else None
        try:
            worlds = parse_worlds(args.worlds or args.world or "default")
            bench = MultiWorldBench(worlds=worlds, planners=planners, seeds=seeds, budget=args.budget,
                                    baseline_n=args.baseline_n, oracle_n=args.oracle_n, bug_free=args.bug_free,
                                    classes=classes, jobs=jobs, root=root, progress=bars.update,
                                    llm={k: v for k, v in (("api_base", args.api_base),
                                                           ("tool_choice", args.tool_choice),
                                                           ("call_format", args.call_format),
                                                           ("llm_timeout", args.llm_timeout),
                                                           ("llm_context", args.llm_context),
                                                           ("max_seconds", args.max_seconds)) if v is not None})
            with bars:
                out = bench.run()
        except ValueError as e:
            raise UsageError(str(e)) from None
    out["wall_seconds"] = round(time.perf_counter() - t0, 1)
    out["transcripts"] = str(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "bench.json").write_text(json.dumps(out, indent=2) + "\n")
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    out_console = Console()
    if args.calibrate:
        from sleuth.agent.bench.table import calibration_table

        out_console.print(calibration_table(out))
    else:
        out_console.print(discovery_table(out))
    out_console.print(f"Transcripts and bench.json in {root}", markup=False)
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sleuth.agent.bench.compare import compare, load_runs, planners_of
    from sleuth.agent.bench.table import compare_table

    try:
        a, b = load_runs(args.a), load_runs(args.b)
        by = [int(x) for x in args.by.split(",") if x.strip()]
    except ValueError as e:
        raise UsageError(str(e)) from None

    def planner(runs: list[dict[str, object]], given: str | None, side: str) -> str:
        names = planners_of(runs)
        if given is not None:
            if given not in names:
                raise UsageError(f"--planner-{side}: {given!r} has no runs there (planners: {', '.join(names)})")
            return given
        if len(names) == 1:
            return names[0]
        if "protocol" in names:
            return "protocol"
        raise UsageError(f"{side.upper()} holds several planners ({', '.join(names)}): name one with --planner-{side}")

    pa, pb = planner(a, args.planner_a, "a"), planner(b, args.planner_b, "b")
    out = compare(a, b, pa, pb, by)
    if args.transcripts:
        from sleuth.agent.bench.compare import agreement

        out["transcripts"] = agreement(a, b, pa, pb, max(by) if by else 0)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        console = Console()
        console.print(compare_table(out, str(args.a), str(args.b)))
        t = out.get("transcripts")
        if t is not None:
            console.print(f"Transcripts: {t['agree']} of {t['classes']} classes made the same calls with the same "
                          f"results until {t['by']:,} images or more" + (": differ " + "; ".join(t["differ_before"])
                                                                        if t["differ_before"] else "."),
                          markup=False)
    return 0


def run_mitigation(args: argparse.Namespace) -> int:
    from sleuth.agent.bench.mitigation import check
    from sleuth.tools.backends.base import BackendError

    path = Path(args.weights)
    world = args.world
    if path.is_dir():
        result = path / "mitigation.json"
        if world is None and result.is_file():
            world = json.loads(result.read_text(encoding="utf-8")).get("backends", {}).get("world")
        path = path / "classifier.safetensors"
    if not path.is_file():
        raise UsageError(f"no mitigated toyworld classifier at {path}")
    for name, value, low in (("--n", args.n, 10), ("--n-per-class", args.n_per_class, 10)):
        if value < low:
            raise UsageError(f"{name} must be at least {low}, got {value}")
    if not 0 < args.margin < 1:
        raise UsageError(f"--margin must be in (0, 1), got {args.margin}")
    try:
        out = check(path, world, n=args.n, margin=args.margin, n_per_class=args.n_per_class)
    except BackendError as e:
        raise UsageError(str(e)) from None
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{out['world']}: planted bugs before and after ({out['n']} images each, same seeds)",
                  title_justify="left")
    for col in ("bug", "kind", "before", "after", "reduction", "after/before [95% CI]", "adj. p"):
        table.add_column(col)
    for r in out["bugs"] + out["decoys"]:
        lo, hi = r["ratio_ci"]
        red = "" if r["reduction"] is None else f"{100 * r['reduction']:.0f}%"
        p = r.get("adjusted_p_lower")
        table.add_row(r["name"], r["kind"], f"{r['before']['k']}/{r['before']['n']}",
                      f"{r['after']['k']}/{r['after']['n']}", red, f"{r['ratio']:.2f} [{lo:.2f}–{hi:.2f}]",
                      "" if p is None else ("< 1e-6" if p < 1e-6 else f"{p:.2g}"))
    console = Console()
    console.print(table)
    for key, name in (("accuracy_training_distribution", "training distribution"),
                      ("accuracy_class_prompts", "class prompts")):
        a = out[key]
        console.print(f"accuracy, {name}: {100 * a['before']:.2f}% → {100 * a['after']:.2f}% "
                      f"({100 * a['difference']:+.2f} points, 95% lower bound {100 * a['lower_bound_95']:+.2f}; "
                      f"non-inferior at −{100 * a['margin']:.1f}: {'yes' if a['non_inferior'] else 'no'})")
    console.print(f"bugs at least halved: {out['halved']} of {len(out['bugs'])}")
    return 0
