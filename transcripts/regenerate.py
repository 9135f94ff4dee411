"""Regenerate the example transcripts kept in this folder (run from the repository root, offline, a minute on a CPU).

    python transcripts/regenerate.py

- ``investigate-fly-s0/``: ``sleuth investigate --class fly --seed 0 --budget 4000`` on toyworld's
  default world (protocol planner).
- ``audit-fly-cat/``: ``sleuth audit transcripts/audit-fly-cat.yaml`` (two classes, small budgets).

Only the images a transcript mentions are kept in its artifact store, less the examples of screening samples; the
others (every stored failure of every measurement) re-render from their seeds, so ``sleuth replay --verify`` needs
none of them.
`sleuth replay --verify transcripts` must report zero mismatches after any change to the tools or backends; when a
change is meant to alter results, run this script again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REF = re.compile(rb"[0-9a-f]{64}")


def prune_artifacts(run_dir: Path) -> tuple[int, int]:
    """Delete the artifacts no event of the run's transcript mentions, and the example images of screening samples
    (every generate_and_classify result after the first, the baseline): they re-render from their seeds and would
    make the example hundreds of images larger. Returns (kept, removed)."""
    mentioned: set[bytes] = set()
    samples = 0
    for line in (run_dir / "transcript.jsonl").read_bytes().splitlines():
        event = json.loads(line)
        if event["kind"] == "tool_returned" and event.get("name") == "generate_and_classify":
            samples += 1
            if samples > 1:
                continue
        mentioned |= set(REF.findall(line))
    kept = removed = 0
    for f in sorted((run_dir / "artifacts").rglob("*")):
        if f.is_file():
            if f.stem.encode() in mentioned:
                kept += 1
            else:
                f.unlink()
                removed += 1
    for d in sorted((run_dir / "artifacts").glob("*"), reverse=True):
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    return kept, removed


def sleuth(*args: str, cache: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLEUTH_CACHE": cache}
    subprocess.run([sys.executable, "-m", "sleuth", *args], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    with tempfile.TemporaryDirectory() as cache:
        target = HERE / "investigate-fly-s0"
        shutil.rmtree(target, ignore_errors=True)
        with tempfile.TemporaryDirectory(dir=HERE) as runs:
            sleuth("investigate", "--class", "fly", "--seed", "0", "--budget", "4000",
                   "--runs", str(Path(runs).relative_to(ROOT)), "--json", cache=cache)
            (made,) = Path(runs).iterdir()
            made.rename(target)
        print(target.name, prune_artifacts(target))
    # Its own cache: each example is a first audit of its seeds (on a cache shared with the run above, the audit's
    # fly would confirm on the next confirmation draw, as a re-audit does).
    with tempfile.TemporaryDirectory() as cache:
        audit = HERE / "audit-fly-cat"
        shutil.rmtree(audit, ignore_errors=True)
        sleuth("audit", "transcripts/audit-fly-cat.yaml", "--out", "transcripts/audit-fly-cat", "--json", cache=cache)
        for cls in sorted(p for p in audit.iterdir() if (p / "transcript.jsonl").is_file()):
            print(f"{audit.name}/{cls.name}", prune_artifacts(cls))


if __name__ == "__main__":
    main()
