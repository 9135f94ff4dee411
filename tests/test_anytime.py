"""Anytime in fact: what the protocol planner does with its first images does not depend on how many it was given.

Two runs of the default world's cat, one given 10,000 images and one 20,000, make the same calls and get the same
results until the first has spent most of its budget: so what either has found by 5,000 images is the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sleuth.agent.bench.compare import agree_until, steps
from sleuth.agent.bench.discovery import run_investigation
from sleuth.tools.backends.toyworld import load_backends

BY = 5_000


@pytest.mark.e2e
def test_runs_given_10000_and_20000_images_agree_until_5000(tmp_path: Path) -> None:
    backends = load_backends("default")
    small = run_investigation(backends, "cat", 0, "protocol", budget=10_000, baseline_n=None, run_dir=tmp_path / "a")
    large = run_investigation(backends, "cat", 0, "protocol", budget=20_000, baseline_n=None, run_dir=tmp_path / "b")
    differ = agree_until(small.transcript, large.transcript)
    assert differ is None or differ >= BY, differ
    early = [s for s in steps(small.transcript) if s[0] <= BY]
    assert len(early) > 100 and sum(s[1] == "finding" for s in early) >= 3  # the cat in the snow among them


def test_two_runs_differ_where_their_calls_or_results_first_do(tmp_path: Path) -> None:
    from sleuth.agent.events import RunStarted, ToolCalled, ToolReturned
    from sleuth.agent.transcript import TranscriptWriter

    def write(name: str, results: list[int]) -> Path:
        path = tmp_path / name / "transcript.jsonl"
        with TranscriptWriter(path) as w:
            w.append(RunStarted(run_id=name, command="investigate", planner="protocol"))
            for i, k in enumerate(results):
                w.append(ToolCalled(call_id=f"c{i}", name="generate_and_classify", arguments={"n": 100}))
                w.append(ToolReturned(call_id=f"c{i}", name="generate_and_classify", ok=True, result={"k": k},
                                      images_used=100))
        return path

    a, b = write("a", [1, 2, 3]), write("b", [1, 2, 4, 5])
    assert agree_until(a, b) == 200  # the third call's result differs, after 200 images
    assert agree_until(a, write("c", [1, 2, 3, 9])) is None  # one is the other's beginning
