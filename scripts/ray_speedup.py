"""The speed-up of an audit on 2 Ray workers over 1: the measurement docs/audit.md reports.

    python scripts/ray_speedup.py [--images 3000] [--workers 1 2] [--out DIR]

Runs one 12-class audit of toyworld's default world (every class, the protocol planner, ``--images`` a class) through
``sleuth audit --executor ray`` once per worker count, each on a local cluster of its own (one CPU a worker) and an
empty prediction cache, so no run reads another's predictions. Each run's seconds are the whole command's wall time
(starting Ray and loading the models included). The summaries must be equal, wall-clock fields aside; the script
prints one JSON line per run, then the ratio and the load average, and exits 1 if the summaries differ.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def stable(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary without wall-clock and location fields."""
    out = {k: v for k, v in summary.items() if k not in ("run_dir", "seconds", "classes")}
    out["classes"] = [{k: v for k, v in c.items() if k not in ("seconds", "recovery")} for c in summary["classes"]]
    return out


def run(config: Path, out: Path, workers: int) -> tuple[float, dict[str, Any]]:
    env = {**os.environ, "SLEUTH_CACHE": str(out.parent / f"cache-{workers}"), "RAY_USAGE_STATS_ENABLED": "0"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sleuth", "audit", str(config), "--out", str(out), "--executor", "ray",
                           "--workers", str(workers), "--json"], env=env, cwd=ROOT, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"sleuth audit with {workers} workers failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return seconds, json.loads(proc.stdout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=3000, help="Image budget of each class (default 3000).")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="Worker counts to run (default 1 2).")
    p.add_argument("--out", help="Folder for the runs (default: a temporary one).")
    args = p.parse_args()
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="sleuth-ray-speedup-"))
    root.mkdir(parents=True, exist_ok=True)
    config = root / "audit.json"
    config.write_text(json.dumps({"classes": "all", "planner": {"name": "protocol"},
                                  "budget": {"per_class": {"images": args.images}}}))
    results: dict[int, tuple[float, dict[str, Any]]] = {}
    for n in args.workers:
        before = os.getloadavg()
        seconds, summary = run(config, root / f"workers-{n}", n)
        results[n] = seconds, summary
        print(json.dumps({"workers": n, "seconds": round(seconds, 1), "classes": len(summary["classes"]),
                          "images": summary["images"], "findings": len(summary["findings"]),
                          "class_seconds": summary["seconds"], "load_before": [round(x, 2) for x in before],
                          "load_after": [round(x, 2) for x in os.getloadavg()]}), flush=True)
    first, *rest = args.workers
    same = all(stable(results[n][1]) == stable(results[first][1]) for n in rest)
    for n in rest:
        print(f"{n} workers against {first}: {results[first][0]:.1f} s / {results[n][0]:.1f} s = "
              f"{results[first][0] / results[n][0]:.2f}x faster; summary.json "
              f"{'identical' if same else 'DIFFERENT'} (wall-clock fields aside)")
    print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{os.cpu_count()} CPUs; runs in {root}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
