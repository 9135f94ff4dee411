"""Failure modes scored against a world's ground truth (purity, redundancy), and two benchmarks compared bug by bug."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sleuth.agent.bench.compare import compare, load_runs, mcnemar
from sleuth.agent.bench.modes import cause_of, distinct_causes, mode_summary, run_modes, scene_values
from sleuth.agent.events import Finding, ModePlaced, RunStarted
from sleuth.agent.view import InvestigationView
from sleuth.tools import stats
from sleuth.tools.backends.toyworld.config import load_world
from sleuth.tools.findings import Evidence
from sleuth.tools.findings import Finding as FindingModel

CAT = "a realistic photograph of a cat"


def test_a_mode_is_pure_when_one_value_is_named_by_every_finding() -> None:
    world = load_world("default")
    river, boat = scene_values(f"{CAT} in a river.", world, CAT), scene_values(f"{CAT} on a boat.", world, CAT)
    assert river == boat == {"background=water"}
    snow3 = scene_values(f"{CAT}. the cat is grey. there is a person next to it. it is in the snow.", world, CAT)
    assert snow3 == {"colour=grey", "co_object=person", "background=snow"}
    assert cause_of([river, boat]) == (True, frozenset({"background=water"}))
    assert cause_of([snow3, scene_values(f"{CAT} in a snowstorm.", world, CAT)]) == (
        True, frozenset({"background=snow"}))
    night = scene_values(f"{CAT} at night.", world, CAT)
    assert cause_of([river, boat, night]) == (False, frozenset({"background=water"}))  # what most of them name
    assert cause_of([]) == (False, frozenset())


def test_modes_whose_causes_share_a_value_are_one_cause() -> None:
    water, snow = frozenset({"background=water"}), frozenset({"background=snow"})
    assert distinct_causes([water, snow]) == 2
    assert distinct_causes([water, snow, water | {"colour=blue"}]) == 2
    assert distinct_causes([water, frozenset(), frozenset()]) == 3  # a mode with no cause is its own


def evidence(tid: str) -> Evidence:
    return Evidence(test_id=tid, hypothesis=stats.binomial_rate(20, 30), baseline=stats.binomial_rate(10, 300),
                    rate_ratio=stats.rate_ratio(20, 30, 10, 300), p_value=1e-6, adjusted_p=4e-5, kind="rate")


def transcript(placed: list[tuple[str, str, str]]) -> InvestigationView:
    """A run whose findings (id, caption) were placed in the modes given."""
    events: list[object] = [RunStarted(run_id="r", command="investigate", planner="protocol", class_prompt=CAT)]
    for fid, caption, mode in placed:
        f = FindingModel(finding_id=fid, caption=caption, summary="", confirmed=True, discovery=evidence(f"d{fid}"),
                         confirmation=evidence(f"c{fid}"))
        events += [Finding(finding_id=fid, finding=f.model_dump(mode="json")),
                   ModePlaced(mode_id=mode, finding_id=fid, reason="")]
    return InvestigationView.from_events(events)  # type: ignore[arg-type]


def test_a_run_s_modes_are_scored_pure_and_redundant_against_the_world() -> None:
    world = load_world("default")
    view = transcript([("f1", f"{CAT} in a river.", "m1"), ("f2", f"{CAT} underwater.", "m1"),
                       ("f3", f"{CAT} in the snow.", "m2"), ("f4", f"{CAT} on a boat.", "m3"),
                       ("f5", f"{CAT} at night.", "m4"), ("f6", f"{CAT} in a snowstorm.", "m4")])
    got = run_modes(view, world)
    assert [m["findings"] for m in got["modes"]] == [["f1", "f2"], ["f3"], ["f4"], ["f5", "f6"]]
    assert [m["pure"] for m in got["modes"]] == [True, True, True, False]
    # Water is split over m1 and m3; the impure m4 names night and snow once each, so no cause of its own.
    assert got["n_modes"] == 4 and got["pure"] == 3 and got["causes"] == 3 and got["phrasings"] == 2
    summary = mode_summary([{"modes": got}, {"modes": {**got, "n_modes": 2, "pure": 2, "causes": 2}}])
    assert summary["modes"] == 6 and summary["purity"] == pytest.approx(5 / 6)
    assert summary["redundancy"] == pytest.approx(6 / 5) and summary["modes_per_class_median"] == 3


def run(world: str, label: str, bugs: dict[str, tuple[float, int | None]], planner: str = "protocol") -> dict:
    """A benchmark result: each bug with its oracle ratio and the images by which a real finding named it."""
    return {"world": world, "label": label, "planner": planner, "seed": 0, "transcript": "",
            "bugs": [{"name": b, "oracle": {"ratio": r}} for b, (r, _) in bugs.items()],
            "findings": [{"bug": b, "images_until": at} for b, (_, at) in bugs.items() if at is not None]}


def test_two_benchmarks_are_paired_bug_by_bug(tmp_path: Path) -> None:
    a = [run("w0", "cat", {"snow": (13.0, 1200), "net": (6.0, None), "dusk": (1.1, None)}),
         run("w0", "dog", {"orange": (3.8, 11_000)})]
    b = [run("w0", "cat", {"snow": (13.0, 900), "net": (6.0, 2_500), "dusk": (1.1, None)}),
         run("w0", "dog", {"orange": (3.8, 4_000)})]
    out = compare(a, b, "protocol", "protocol", by=(3_000, 5_000))
    learned = out["groups"]["learned (>= 2x)"]
    assert out["paired_bugs"] == 4 and learned["bugs"] == 3  # the 1.1x planting was not learned
    assert (learned["all"]["a"]["k"], learned["all"]["b"]["k"]) == (2, 3) and learned["all"]["only_b"] == ["w0: net"]
    assert learned["by 3000"]["only_b"] == ["w0: net"] and learned["by 3000"]["a"]["k"] == 1
    assert learned["by 5000"]["only_b"] == ["w0: net", "w0: orange"] and not learned["by 5000"]["same"]
    assert out["groups"][">= 5x"]["bugs"] == 2
    assert mcnemar(0, 2) == pytest.approx(0.5) and mcnemar(0, 0) == 1.0
    assert mcnemar(11, 1) == pytest.approx(0.0063, abs=1e-4)
    # A benchmark's --json output or its --out folder.
    (tmp_path / "a.json").write_text(json.dumps({"runs": a}))
    assert load_runs(tmp_path / "a.json") == a
    folder = tmp_path / "out" / "w0" / "results" / "cat"
    folder.mkdir(parents=True)
    (folder / "protocol-s0.json").write_text(json.dumps(b[0]))
    assert load_runs(tmp_path / "out") == [b[0]]
    with pytest.raises(ValueError, match="no benchmark results"):
        load_runs(tmp_path)
