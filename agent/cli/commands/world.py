"""`sleuth world check`: a toyworld's measured numbers (accuracy, baselines, planted bugs, decoys, captioner);
`sleuth world random`: write a random world's config."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sleuth.agent.errors import UsageError

NAME = "world"
HELP = "Inspect a toyworld config (measure its classifier, planted bugs and decoys), or write a random one."


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="world_command", metavar="SUBCOMMAND")
    check = sub.add_parser("check", help="Measure accuracy, class baselines, bug and decoy rates, captioner accuracy.",
                           description="Measure accuracy, class baselines, bug and decoy rates (paired seeds) and "
                                       "the captioner's attribute accuracy.")
    check.add_argument("--world", help="World config file (YAML or JSON); default: the embedded world.")
    check.add_argument("--n", type=int, help="Images per condition (default 2000; with --diffusion, class-prompt "
                                             "images, default 1000).")
    check.add_argument("--seed", type=int, default=7_000_000, help="First image seed (default 7000000).")
    check.add_argument("--criterion", choices=["top1", "topk", "parent"], default="top1",
                       help="Failure criterion (default top1).")
    check.add_argument("--json", action="store_true", help="Print the numbers as JSON.")
    diff = check.add_argument_group("the packaged diffusion model (--diffusion)")
    diff.add_argument("--diffusion", action="store_true",
                      help="Measure toyworld-sd instead: class accuracy of its images, attribute adherence, null-text "
                           "reconstruction PSNR and prompt-to-prompt background swaps.")
    diff.add_argument("--generator", default="diffusers:toyworld-sd", metavar="SPEC",
                      help="Generator spec to measure (default diffusers:toyworld-sd).")
    diff.add_argument("--editor", default="sd-edit:toyworld-sd,clip=toyworld-clip", metavar="SPEC",
                      help="Editor spec for inversions and swaps (default sd-edit:toyworld-sd,clip=toyworld-clip: "
                           "toyworld-clip scores the edits for LANCE's filters).")
    diff.add_argument("--attribute-n", type=int, default=240, help="Images per attribute (default 240).")
    diff.add_argument("--inversions", type=int, default=24, help="Null-text inversions (default 24; 0: skip).")
    diff.add_argument("--inversion-steps", type=int, default=50,
                      help="DDIM steps of the null-text inversions (default 50; the swaps run at the editor's own, "
                           "25 for toyworld-sd).")
    diff.add_argument("--swaps", type=int, default=60, help="Background swaps (default 60; 0: skip).")
    check.set_defaults(_world_run=run_check)
    rand = sub.add_parser(
        "random", help="Write a random world config: random priors, planted bugs and decoys.",
        description="Write the config of a random world: the default world's classes and vocabularies with random "
                    "natural priors, planted bugs on random (class, attribute, value, confuser) choices over strengths "
                    "of about 2-20x, and decoys. Its networks train on first use and are cached by config hash.")
    rand.add_argument("--seed", type=int, required=True, help="The world's seed: the same seed, the same config.")
    rand.add_argument("--out", help="File to write (default: standard output).")
    rand.add_argument("--bugs", type=int, default=5, help="Planted bugs (default 5, at most 6).")
    rand.add_argument("--decoys", type=int, default=3, help="Decoys (default 3).")
    rand.set_defaults(_world_run=run_random)


def run(args: argparse.Namespace) -> int:
    handler = getattr(args, "_world_run", None)
    if handler is None:
        raise UsageError("missing sub-command: try `sleuth world check` or `sleuth world random --seed 0`")
    return int(handler(args))


def run_check(args: argparse.Namespace) -> int:
    if args.diffusion:
        return run_diffusion_check(args)
    args.n = 2000 if args.n is None else args.n
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


def run_diffusion_check(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sleuth.agent.terminal.progress import ProgressBars
    from sleuth.tools.backends.base import BackendError
    from sleuth.tools.backends.specs import BackendSpecs
    from sleuth.tools.backends.toyworld import load_world
    from sleuth.tools.backends.toyworld.captioner import ToyCaptioner
    from sleuth.tools.backends.toyworld.classifier import ToyClassifier
    from sleuth.tools.backends.toyworld.diffusion.check import DiffusionCheck

    n = 1000 if args.n is None else args.n
    if not 12 <= n <= 100_000 or not 4 <= args.attribute_n <= 100_000:
        raise UsageError("--n must be between 12 and 100000 and --attribute-n between 4 and 100000")
    if args.inversions < 0 or args.swaps < 0:
        raise UsageError("--inversions and --swaps must be at least 0")
    if not 1 <= args.inversion_steps <= 1000:
        raise UsageError("--inversion-steps must be between 1 and 1000")
    if args.world and not Path(args.world).is_file():
        raise UsageError(f"world config not found: {args.world}")
    console = Console(stderr=True)
    try:
        world = load_world(args.world)
        with ProgressBars(console, enabled=sys.stderr.isatty()) as bars:
            parts = BackendSpecs(generator=args.generator, editor=args.editor,
                                 world=args.world).build_parts(bars.update, load=True)
            check = DiffusionCheck(world, parts["generator"], parts["editor"],
                                   ToyClassifier(world, progress=bars.update),
                                   ToyCaptioner(world, progress=bars.update),
                                   ToyClassifier(load_world("nobugs"), progress=bars.update), progress=bars.update,
                                   reconstruction_steps=args.inversion_steps)
            report = check.run(n, args.attribute_n, args.inversions, args.swaps, seed=args.seed)
    except BackendError as e:
        raise UsageError(str(e)) from None
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        Console().print(render_diffusion(report))
    return 0


def render_diffusion(report: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table

    def rate(r: dict[str, Any]) -> str:
        return f"{r['k']}/{r['n']} = {r['rate']:.1%} [{r['low']:.1%}, {r['high']:.1%}]"

    t = Table("measure", "value", title=f"{report['generator']} on world {report['world']}")
    t.add_row("class accuracy (world classifier)", rate(report["class_accuracy"]["overall"]))
    for attr, r in report["attribute_adherence"].items():
        t.add_row(f"{attr} adherence (captioner)", rate(r["overall"]))
    inv = report.get("null_text_reconstruction")
    if inv:
        t.add_row(f"null-text reconstruction, {inv['steps']} steps",
                  f"PSNR {inv['psnr_mean']:.1f} dB mean, {inv['psnr_min']:.1f} min ({inv['n']} images); "
                  f"autoencoder alone {inv['autoencoder_psnr_mean']:.1f} dB; against it "
                  f"{inv['psnr_vs_autoencoder_mean']:.1f} dB")
    sw = report.get("background_swaps")
    if sw:
        t.add_row("background swaps: success", rate(sw["success"]))
        t.add_row("  new background read", rate(sw["new_background_read"]))
        t.add_row("  class kept", rate(sw["class_kept"]))
        t.add_row("  LANCE filters passed", rate(sw["filters_passed"]))
    classes = Table("class", "accuracy", title="class prompts")
    for name, r in report["class_accuracy"]["by_class"].items():
        classes.add_row(name, rate(r))
    return Group(t, classes)


def run_random(args: argparse.Namespace) -> int:
    from sleuth.tools.backends.toyworld.random_world import random_world, random_world_yaml

    if not 0 <= args.seed < 2**32:
        raise UsageError(f"--seed must be in [0, 2**32), got {args.seed}")
    if not 1 <= args.bugs <= 6 or not 0 <= args.decoys <= 6:
        raise UsageError("--bugs must be between 1 and 6 and --decoys between 0 and 6")
    world = random_world(args.seed, args.bugs, args.decoys)  # validates
    if len(world.bugs) < args.bugs:
        raise UsageError(f"could not place {args.bugs} bugs on distinct classes; try fewer")
    text = random_world_yaml(args.seed, args.bugs, args.decoys)
    if args.out:
        Path(args.out).write_text(text)
        print(f"{args.out}: world {world.name} ({world.config_hash()}), {len(world.bugs)} bugs, "
              f"{len(world.decoys)} decoys", file=sys.stderr)
    else:
        print(text, end="")
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
