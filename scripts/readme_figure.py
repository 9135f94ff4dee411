"""The README's picture: the forest plot of a run's failure modes, as `sleuth report` draws its findings.

    sleuth investigate --class cat --runs runs        # the demo
    python scripts/readme_figure.py runs/<run id> docs/demo_findings.png

One row per failure mode, its best-evidenced finding's: discovery test (circle), confirmation on fresh seeds
(diamond) and counterfactual edits (square), on one log scale of failure-rate ratios to the class.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sleuth.agent.report import load_runs
from sleuth.agent.report.plots import forest_plot
from sleuth.tools.investigation import normalise_caption


def figure(run_dir: Path) -> bytes:
    [run] = load_runs(run_dir)
    captions = {normalise_caption(m.caption) for m in run.modes}
    tests = [t for t in run.tests if normalise_caption(t.caption) in captions]
    findings = sum(1 for f in run.findings if f.confirmed)
    data = forest_plot(tests, run.class_prompt,
                       title=f"{run.label}: {len(run.modes)} failure modes ({findings} confirmed findings), "
                             "failure-rate ratio to the class")
    if data is None:
        raise SystemExit(f"{run_dir}: no confirmed finding to draw")
    return data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("out", type=Path)
    args = p.parse_args()
    args.out.write_bytes(figure(args.run_dir))
    print(f"{args.out}: {args.out.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
