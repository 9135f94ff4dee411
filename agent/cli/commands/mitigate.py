"""`sleuth mitigate RUN_DIR...`: retrain the classifier's final layer on generated images of its confirmed failures
and show, on fresh seeds, whether it fixed them without breaking the rest (see ``agent.mitigate``)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from pydantic import ValidationError

from sleuth.agent.errors import UsageError

NAME = "mitigate"
HELP = ("Retrain the classifier's last layer on generated images of confirmed findings; measure before and after "
        "on fresh seeds.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN_DIR",
                   help="Run directories of investigations of one classifier, or audit directories.")
    p.add_argument("--findings", default=None, metavar="F1,F2",
                   help="Findings to mitigate: f1 or CLASS:f1 (when several runs have an f1); default: all.")
    p.add_argument("--n", type=int, default=None, help="Generated images per finding, before the filter (2000).")
    p.add_argument("--lambda", dest="lam", type=float, default=None,
                   help="Weight of the failure-mode loss against in-distribution images (0.5).")
    p.add_argument("--id-n", type=int, default=None, help="In-distribution training images per class (500).")
    p.add_argument("--eval-n", type=int, default=None, help="Fresh evaluation images per finding and class (1000).")
    p.add_argument("--eval-id-n", type=int, default=None,
                   help="Fresh evaluation images per class for the accuracy test (500).")
    p.add_argument("--margin", type=float, default=None,
                   help="Non-inferiority margin of accuracy, as a proportion (0.01: one point).")
    p.add_argument("--filter", choices=["captioner", "none"], default=None,
                   help="Keep generated images the captioner reads the failure mode in (default), or all.")
    p.add_argument("--train", choices=["auto", "head", "block"], default=None,
                   help="Retrain the final linear layer (head), or also the last block (block: toyworld's CNN); "
                        "default auto: block where supported, else head.")
    p.add_argument("--steps", type=int, default=None, help="Training steps (1200).")
    p.add_argument("--seed", type=int, default=None, help="Selects the mitigation's seeds (0).")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps or auto.")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="Where to write the weights, mitigation.json and mitigation.jsonl (default: "
                        "FIRST_RUN_DIR/mitigation).")
    p.add_argument("--json", action="store_true", help="Print the result as JSON.")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sleuth.agent.mitigate import MitigateConfig, Mitigation, find_runs, load_run, write
    from sleuth.agent.terminal.progress import ProgressBars

    given = {"findings": [f.strip() for f in args.findings.split(",") if f.strip()] if args.findings else None,
             "n": args.n, "lambda": args.lam, "id_n": args.id_n, "eval_n": args.eval_n, "eval_id_n": args.eval_id_n,
             "margin": args.margin, "filter": args.filter, "train": args.train, "steps": args.steps,
             "seed": args.seed}
    try:
        config = MitigateConfig.model_validate({k: v for k, v in given.items() if v is not None})
    except ValidationError as e:
        err = e.errors()[0]
        flag = "--" + str(err["loc"][0]).replace("_", "-") if err["loc"] else "options"
        raise UsageError(f"{flag}: {err['msg']}") from None
    runs = [load_run(t) for t in find_runs(args.runs)]
    out = Path(args.out) if args.out else Path(args.runs[0]) / "mitigation"
    console = Console(stderr=args.json)
    with ProgressBars(console, enabled=not args.json and console.is_terminal) as bars:
        result = Mitigation(runs, config, device=args.device, progress=bars.update).run(out)
    command = "sleuth mitigate " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 2 else \
        "sleuth mitigate"
    path = write(result, out, command)
    if args.json:
        sys.stdout.write(result.model_dump_json(indent=1) + "\n")
        return 0
    from sleuth.agent.terminal.tables import mitigation_tables

    for t in mitigation_tables(result):
        console.print(t)
    console.print(f"written: {path}, {out / 'mitigation.jsonl'}", markup=False)
    first = runs[0]
    console.print(f"audit it again: sleuth investigate --class {shlex.quote(first.label)} "
                  f"--classifier {shlex.quote(result.classifier_after)}"
                  + (f" --world {shlex.quote(first.backends.world)}" if first.backends.world else ""), markup=False)
    return 0
