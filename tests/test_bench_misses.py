"""The miss report: how far a planted bug got in a run, read from transcript events."""

from __future__ import annotations

from typing import Any

import pytest

from sleuth.agent.bench.misses import STAGES, miss_counts, stage_of
from sleuth.agent.bench.table import misses_table

CLASS = "a photo of a cat"
SNOW = "a photo of a cat in the snow."


def names(caption: str) -> bool:
    return "snow" in caption


class Events:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def call(self, name: str, args: dict[str, Any], result: dict[str, Any] | None) -> Events:
        i = str(len(self.events))
        self.events += [{"kind": "tool_called", "call_id": i, "name": name, "arguments": args},
                        {"kind": "tool_returned", "call_id": i, "name": name, "ok": result is not None,
                         "result": result}]
        return self

    def look(self, prompt: str, k: int, n: int) -> Events:
        return self.call("generate_and_classify", {"prompt": prompt, "n": n},
                         {"summary": {"failures": {"k": k, "n": n}}})

    def test(self, caption: str, purpose: str, verdict: str) -> Events:
        return self.call("measure_rate", {"caption": caption, "confirm": purpose == "confirmation"},
                         {"caption": caption, "purpose": purpose, "verdict": verdict})


def stage(e: Events, found: bool = False) -> str:
    return str(stage_of(e.events, names, CLASS, found)["stage"])


def test_each_stage_is_the_furthest_the_bug_got():
    base = Events().look(CLASS, 10, 300)
    assert stage(base) == "never proposed"
    base.call("perturb_caption", {}, {"edits": [{"caption": SNOW}]})
    assert stage(base) == "proposed, not screened"
    base.look(SNOW, 0, 3)
    assert stage(base) == "screened out"
    assert stage_of(base.events, names, CLASS, False)["screen"]["k"] == 0
    base.look(SNOW, 9, 29)  # pooled 9/32 against a 3.3% class: 2x is all but certain
    out = stage_of(base.events, names, CLASS, False)
    assert out["stage"] == "screened, not tested" and out["screen"]["n"] == 32
    assert out["screen"]["p_twice_baseline"] == pytest.approx(1.0, abs=1e-3)
    base.test(SNOW, "discovery", "inconclusive")
    assert stage(base) == "tested, not supported"
    base.test(SNOW, "discovery", "supported")
    assert stage(base) == "supported, not confirmed"
    base.test(SNOW, "confirmation", "inconclusive")
    assert stage(base) == "confirmation not significant"
    base.test(SNOW, "confirmation", "supported")
    assert stage(base) == "confirmed, not recorded"
    base.call("record_finding", {"caption": SNOW}, {"caption": SNOW})
    assert stage(base) == "recorded, not real"
    assert stage(base, found=True) == "found"


def test_calls_that_name_another_attribute_or_failed_do_not_count():
    e = Events().look(CLASS, 10, 300).look("a photo of a cat in the grass.", 3, 3)
    e.call("measure_rate", {"caption": SNOW}, None)  # failed: no result
    assert stage(e) == "never proposed"


def test_counts_and_table_keep_unlearned_bugs_apart():
    bugs = [{"ratio": 15.0, "stage": "found"}, {"ratio": 3.0, "stage": "screened out"},
            {"ratio": 1.1, "stage": "found"}, {"ratio": 1.0, "stage": "never proposed"}]
    m = miss_counts(bugs)
    assert m["learned"] == 2 and m["not_learned"] == 2 and m["not_learned_found"] == 1
    assert m["stages"]["found"] == 1 and m["stages"]["screened out"] == 1
    assert set(m["stages"]) == set(STAGES)
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(misses_table({"planners": {"protocol": {"misses": m}}}))
    text = console.export_text()
    assert "screened out" in text and "2 (1)" in text
