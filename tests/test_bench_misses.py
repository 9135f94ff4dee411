"""The miss report: how far a planted bug got in a run, read from its transcript through the investigation's view."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from sleuth.agent.bench.misses import STAGES, miss_counts, stage_of
from sleuth.agent.bench.table import misses_table
from sleuth.agent.events import Event, RunStarted, ToolCalled, ToolReturned
from sleuth.agent.view import InvestigationView
from sleuth.tools import generate_and_classify, measure_rate, perturb_caption, record_finding, stats
from sleuth.tools.common import SampleSummary
from sleuth.tools.findings import Evidence

CLASS = "a photo of a cat"
SNOW = "a photo of a cat in the snow."


def names(caption: str) -> bool:
    return "snow" in caption


def evidence(caption: str, kind: str) -> Evidence:
    return Evidence(test_id=kind, hypothesis=stats.binomial_rate(9, 30), baseline=stats.binomial_rate(10, 300),
                    rate_ratio=stats.rate_ratio(9, 30, 10, 300), p_value=1e-4, adjusted_p=1e-3, kind=kind)


class Events:
    """A run's events, call by call, each result a real one of its tool."""

    def __init__(self) -> None:
        self.events: list[Event] = [RunStarted(run_id="r", command="investigate", planner="protocol",
                                               class_prompt=CLASS)]

    def call(self, name: str, args: dict[str, Any], result: BaseModel | None) -> Events:
        i = str(len(self.events))
        self.events += [ToolCalled(call_id=i, name=name, arguments=args),
                        ToolReturned(call_id=i, name=name, ok=result is not None,
                                     result=None if result is None else result.model_dump(mode="json"))]
        return self

    def look(self, prompt: str, k: int, n: int) -> Events:
        summary = SampleSummary(prompt=prompt, failures=stats.binomial_rate(k, n), seeds=(0, n - 1))
        return self.call("generate_and_classify", {"prompt": prompt, "n": n},
                         generate_and_classify.Result(measurement_id=f"m{len(self.events)}", summary=summary,
                                                      failure_images=[], success_images=[]))

    def propose(self, caption: str) -> Events:
        edit = perturb_caption.Edit(type="background", edit="-> in the snow", caption=caption)
        return self.call("perturb_caption", {"caption": CLASS},
                         perturb_caption.Result(caption=CLASS, edits=[edit], refinements=[], source="vocabulary"))

    def test(self, caption: str, purpose: str, verdict: str) -> Events:
        return self.call("measure_rate", {"caption": caption, "confirm": purpose == "confirmation"},
                         measure_rate.Result(test_id=f"t{len(self.events)}", caption=caption, purpose=purpose,
                                             mode="sample", baseline=stats.binomial_rate(10, 300), p_value=0.5,
                                             adjusted_p=0.5, family_size=1, adjust_method="holm", verdict=verdict))

    def record(self, caption: str) -> Events:
        return self.call("record_finding", {"caption": caption},
                         record_finding.Result(finding_id="f1", caption=caption, summary="", confirmed=True,
                                               discovery=evidence(caption, "discovery"),
                                               confirmation=evidence(caption, "confirmation")))

    @property
    def view(self) -> InvestigationView:
        view = InvestigationView.from_events(self.events)
        assert not view.warnings, view.warnings
        return view


def stage(e: Events, found: bool = False) -> str:
    return str(stage_of(e.view, names, found)["stage"])


def test_each_stage_is_the_furthest_the_bug_got():
    base = Events().look(CLASS, 10, 300)
    assert stage(base) == "never proposed"
    base.propose(SNOW)
    assert stage(base) == "proposed, not screened"
    base.look(SNOW, 0, 3)
    assert stage(base) == "screened out"
    assert stage_of(base.view, names, False)["screen"]["k"] == 0
    base.look(SNOW, 9, 29)  # pooled 9/32 against a 3.3% class: 2x is all but certain
    out = stage_of(base.view, names, False)
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
    base.record(SNOW)
    assert stage(base) == "recorded, not real"
    assert stage(base, found=True) == "found"


def test_a_screen_of_many_captions_counts_each_captions_pooled_images_once():
    def screen(rows: list[tuple[str, int, int]]) -> generate_and_classify.Result:
        summary = SampleSummary(prompt=rows[0][0], failures=stats.binomial_rate(rows[0][1], rows[0][2]),
                                seeds=(0, 1))
        return generate_and_classify.Result(
            measurement_id="m9", summary=summary, failure_images=[], success_images=[],
            screen=generate_and_classify.Screen(
                effect=3.0, class_rate=stats.binomial_rate(10, 300), worth=0.1, images=0, stopped="done",
                captions=[generate_and_classify.Screened(caption=c, k=k, n=n, plausible=0.5, verdict="open")
                          for c, k, n in rows]))

    grass = "a photo of a cat in the grass."
    e = Events().look(CLASS, 10, 300).look(SNOW, 1, 3)
    # A screen's rows already pool each caption's earlier looks (1/3 of them here): they replace, never add.
    e.call("generate_and_classify", {"prompt": "a playful cat", "proposed": True},
           screen([(grass, 3, 3), (SNOW, 4, 15)]))
    out = stage_of(e.view, names, False)
    assert (out["screen"]["k"], out["screen"]["n"]) == (4, 15) and out["stage"] == "screened, not tested"
    e.look(SNOW, 2, 5)  # a later look adds to them
    e.call("generate_and_classify", {"proposed": True}, screen([(SNOW + " at dawn", 0, 12)]))
    out = stage_of(e.view, names, False)
    assert (out["screen"]["k"], out["screen"]["n"]) == (6, 32)


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


def test_a_sure_screen_left_untested_while_phrasings_were_confirmed_waited_behind_them():
    from sleuth.agent.events import Finding, ModePlaced

    e = Events().look(CLASS, 10, 300).look(SNOW, 30, 32)  # 2x the class is certain
    assert stage(e) == "screened, not tested"
    river, water = "a photo of a cat in a river.", "a photo of a cat in the water."
    for fid, caption in (("f1", river), ("f2", water)):
        e.record(caption)
        f = record_finding.Result(finding_id=fid, caption=caption, summary="", confirmed=True,
                                  discovery=evidence(caption, "discovery"),
                                  confirmation=evidence(caption, "confirmation"))
        e.events.append(Finding(finding_id=fid, finding=f.model_dump(mode="json")))
    e.events.append(ModePlaced(mode_id="m1", finding_id="f1", reason="a cause of its own"))
    assert stage(e) == "screened, not tested"  # two modes of their own, no phrasing yet
    e.events.append(ModePlaced(mode_id="m1", finding_id="f2", reason="its failures read as f1's"))
    assert stage(e) == "waited behind a mode's phrasings"
    e.look(SNOW, 0, 400)  # a screen no longer sure: screened out whatever the phrasings did
    assert stage(e) == "screened out"
