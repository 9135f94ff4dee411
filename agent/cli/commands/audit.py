"""`sleuth audit CONFIG`: audit many classes unattended, under budgets; `sleuth audit --resume RUN_DIR` continues."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sleuth.agent.errors import UsageError

# The executor settings each flag sets (agent.audit.config.ExecutorConfig).
EXECUTOR_FLAGS = {"executor": "name", "address": "address", "workers": "workers", "num_cpus": "num_cpus",
                  "num_gpus": "num_gpus", "memory": "memory", "max_retries": "max_retries"}

NAME = "audit"
HELP = "Audit many classes unattended, under image, time and cost budgets; resumable after a crash."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="Audit config (YAML, TOML or JSON): backends, classes, budgets, planner.")
    p.add_argument("--resume", metavar="RUN_DIR", help="Continue the audit in RUN_DIR where it stopped.")
    p.add_argument("--out", metavar="RUN_DIR", help="Run directory for a new audit (default: a new one under --runs).")
    p.add_argument("--runs", default="runs", help="Folder for new run directories (default ./runs).")
    p.add_argument("--json", action="store_true", help="Print the audit summary as JSON.")
    p.add_argument("--verbose", action="store_true",
                   help="Show every transcript event as it is written (local executor), and every finding.")
    g = p.add_argument_group("executor", "Where the classes run; a config's executor section sets the same, and "
                                         "--resume continues as the audit began unless these say otherwise.")
    g.add_argument("--executor", choices=["local", "ray"],
                   help="local (default): one class after the other here; ray: classes at once on Ray workers, "
                        f"each holding the loaded models (needs {_INSTALL}).")
    g.add_argument("--address", metavar="ADDR",
                   help="Ray cluster to join: auto, HOST:PORT or ray://HOST:10001 (default: a local cluster on "
                        "127.0.0.1). The run directory must be at the same path on every node.")
    g.add_argument("--workers", type=int, metavar="N",
                   help="Classes at once (Ray actors); a local cluster gets N x --num-cpus CPUs. Default: as many "
                        "as the cluster's resources hold.")
    g.add_argument("--num-cpus", type=float, metavar="N", help="CPUs per worker, and its torch threads (default 1).")
    g.add_argument("--num-gpus", type=float, metavar="N",
                   help="GPUs per worker (default 1 when the config's backends.device is cuda, else 0).")
    g.add_argument("--memory", metavar="SIZE", help="Memory each worker reserves, e.g. 8GB (default: none).")
    g.add_argument("--max-retries", type=int, metavar="N",
                   help="Times a dead worker is restarted and its class resumed from its transcript (default 3).")


_INSTALL = "pip install 'sleuth[ray]'"


def _build(config: Any, bars: Any, *, load: bool = True) -> Any:
    with bars:
        return config.backends.build(bars.update, load=load)


def _executor(args: argparse.Namespace, config: Any) -> None:
    """Apply the executor flags to ``config.executor`` (from the config file, or as the audit began)."""
    from pydantic import ValidationError

    from sleuth.agent.audit.config import ExecutorConfig
    from sleuth.agent.config import one_line

    given = {to: getattr(args, dest) for dest, to in EXECUTOR_FLAGS.items() if getattr(args, dest) is not None}
    if not given:
        return
    name = given.get("name", config.executor.name)
    ray_flags = [f"--{dest.replace('_', '-')}" for dest, to in EXECUTOR_FLAGS.items() if to != "name" and to in given]
    if name != "ray" and ray_flags:
        raise UsageError(f"{', '.join(ray_flags)}: Ray settings; add --executor ray")
    # Switching to local drops the Ray settings the audit began with.
    base = config.executor.model_dump() if name == config.executor.name else {}
    try:
        config.executor = ExecutorConfig.model_validate({**base, **given})
    except ValidationError as e:
        raise UsageError(one_line(e, flags={to: f"--{dest.replace('_', '-')}" for dest, to in
                                            EXECUTOR_FLAGS.items()})) from None


def _describe(c: dict[str, Any]) -> str:
    rec = c.get("recovery") or {}
    parts = [f"{c['class']}: {c['status']}", f"{c['images']}/{c['image_budget']} images",
             f"{c['hypotheses_tested']} hypotheses",
             f"{len(c['findings'])} confirmed findings in {len(c.get('modes') or [])} failure mode(s)"]
    if c.get("stopped_by"):
        parts.append(c["stopped_by"])
    if c.get("reaudit"):
        parts.append(c["reaudit"])
    if rec.get("resumed"):
        parts.append(f"resumed after {rec['events_found']} recorded events ({rec['calls_rerun']} calls re-run)")
    if rec.get("torn_line_moved_to"):
        parts.append(f"the crash had torn the last line: {rec['torn_bytes']} bytes moved to "
                     f"{rec['torn_line_moved_to']} and that event written again")
    return "; ".join(parts)


def _ray_ready(args: argparse.Namespace, config: Any, classes: list[str]) -> bool:
    """Whether the audit runs on Ray; if so, Ray is installed and the audit is one it can run (checked before
    anything is written)."""
    if config.executor.name != "ray":
        return False
    from sleuth.agent.audit.on_ray import check, import_ray

    if args.verbose:
        raise UsageError("--verbose shows the events of classes run here; on Ray, follow a class with "
                         "sleuth replay RUN_DIR/CLASS")
    import_ray(config.executor)
    check(config, classes)
    return True


def run(args: argparse.Namespace) -> int:
    from rich.text import Text

    from sleuth.agent.audit import Audit, AuditError, check_run_dir, load, resolve_classes, slug, start
    from sleuth.agent.audit.config import load_config
    from sleuth.agent.audit.summary import classes_table, findings_table, modes_table
    from sleuth.agent.replay.rebuild import RebuildError
    from sleuth.agent.session import new_run_dir
    from sleuth.agent.terminal.progress import ProgressBars
    from sleuth.agent.terminal.render import render_event
    from sleuth.agent.terminal.tables import console as make_console
    from sleuth.agent.transcript import TranscriptError

    if (args.config is None) == (args.resume is None):
        raise UsageError("give a CONFIG to start an audit, or --resume RUN_DIR to continue one (not both)")
    console = make_console(stderr=args.json)
    bars = ProgressBars(console, enabled=not args.json and console.is_terminal)
    try:
        if args.resume is not None:
            if args.out:
                raise UsageError("--out names a new audit's directory; --resume continues RUN_DIR in place")
            run_dir = check_run_dir(args.resume)
            config, classes = load(run_dir)
            _executor(args, config)
            on_ray = _ray_ready(args, config, classes)
            backends = None if on_ray else _build(config, bars)
        else:
            out_dir = check_run_dir(args.out) if args.out else None
            config = load_config(args.config)
            _executor(args, config)
            # On Ray the workers load the models; here they are only named, to check the classes.
            backends = _build(config, bars, load=config.executor.name != "ray")
            classes = resolve_classes(config, backends)
            on_ray = _ray_ready(args, config, classes)
            run_dir = out_dir or new_run_dir(Path(args.runs), "audit", config.seed)
            start(run_dir, config, classes)
    except AuditError as e:
        raise UsageError(str(e)) from None

    def show(event: Any) -> None:
        renderable = render_event(event)
        if renderable is not None:
            bars.print(renderable)

    def on_class(summary: dict[str, Any]) -> None:
        if not args.json:
            bars.print(Text(_describe(summary)))  # captions and paths, not markup

    if on_ray:
        from sleuth.agent.audit.on_ray import RayAudit

        audit: Any = RayAudit(run_dir, progress=bars.update, on_class=on_class,
                              on_note=None if args.json else lambda note: bars.print(Text(note)))
    else:
        assert backends is not None
        audit = Audit(run_dir, backends, progress=bars.update, on_event=show if args.verbose else None,
                      on_class=on_class)
    try:
        with bars:
            out = audit.run()
    except KeyboardInterrupt:
        # Every finished class is kept, and a class cut short resumes where its transcript ends.
        print(f"sleuth audit: interrupted; continue it with: sleuth audit --resume {run_dir}", file=sys.stderr)
        return 130
    except UsageError as e:  # what the Ray cluster cannot give (checked once joined): the audit waits for a resume
        raise UsageError(f"{e}; the audit is in {run_dir}: continue it with sleuth audit --resume {run_dir} and "
                         "other options") from None
    except (RebuildError, TranscriptError, AuditError) as e:
        print(f"sleuth audit: cannot continue {run_dir}: {e}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        console.print(classes_table(out))
        modes = modes_table(out)
        if modes is not None:
            console.print(modes)
        if args.verbose or modes is None:
            console.print(findings_table(out))
        console.print(f"{out['images']:,} images, {out['seconds']:.0f} s active. Summary: {run_dir / 'summary.json'}",
                      markup=False)
        console.print(f"Next: sleuth report {run_dir} --open. Every turn of a class: sleuth replay "
                      f"{run_dir / slug(classes[0])}", markup=False)
    return 0 if all(c["status"] in ("completed", "budget_spent", "skipped") for c in out["classes"]) else 1
