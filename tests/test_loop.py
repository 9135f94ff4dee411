"""The run loop's error policy, driven by a scripted planner and two tiny tools."""

from __future__ import annotations

import types

import numpy as np
import pytest
from pydantic import BaseModel, Field

from sleuth.agent.errors import PlannerError
from sleuth.agent.events import RunStarted, ToolCall
from sleuth.agent.planners.scripted import ScriptedPlanner
from sleuth.agent.runner import Runner, Turn, artifact_refs
from sleuth.agent.transcript import TranscriptWriter, read_transcript, verify_transcript
from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.context import ToolContext
from sleuth.tools.registry import Registry, ToolError, tool_from_module


def tool_module(name, doc, args, result, run):
    m = types.ModuleType(name, doc)
    m.NAME, m.Args, m.Result, m.run = name, args, result, run
    return m


class AddArgs(BaseModel):
    a: int = Field(description="First addend.")
    b: int = Field(description="Second addend.")


class AddResult(BaseModel):
    sum: int


class NoArgs(BaseModel):
    pass


class Empty(BaseModel):
    pass


class Done(BaseModel):
    summary: str


class FinishArgs(BaseModel):
    summary: str = Field(description="The answer.")


def _refuse(args, ctx):
    raise ToolError("the image budget is exhausted: 0 of 100 images left")


def _spent(args, ctx):
    raise ToolError("image budget exhausted: 100 images asked, 20 of 20000 left")


def _slow(args, ctx):
    import time

    time.sleep(0.05)
    return Empty()


def _crash(args, ctx):
    raise RuntimeError("index out of range in the sampler")


def _finish(args, ctx):
    ctx.finished, ctx.final_answer = True, args.summary
    return Done(summary=args.summary)


REGISTRY = Registry([tool_from_module(m) for m in (
    tool_module("add", "Add two integers.", AddArgs, AddResult, lambda args, ctx: AddResult(sum=args.a + args.b)),
    tool_module("refuse", "Always refuses.", NoArgs, Empty, _refuse),
    tool_module("crash", "Has a bug.", NoArgs, Empty, _crash),
    tool_module("finish", "End the run.", FinishArgs, Done, _finish),
)])
LIMITS = Registry([tool_from_module(m) for m in (
    tool_module("add", "Add two integers.", AddArgs, AddResult, lambda args, ctx: AddResult(sum=args.a + args.b)),
    tool_module("refuse", "Always refuses.", NoArgs, Empty, _refuse),
    tool_module("spent", "Refuses for want of images.", NoArgs, Empty, _spent),
    tool_module("slow", "Takes a while.", NoArgs, Empty, _slow),
)])

STARTED = RunStarted(run_id="t", command="test", planner="scripted")


def call(i, name, arguments):
    return ToolCall(id=f"c{i}", name=name, arguments=arguments)


def returned(events):
    """The tool results of the latest planner turn, by call id."""
    out = {}
    for e in reversed(events):
        if e.kind == "planner_turn":
            break
        if e.kind == "tool_returned":
            out[e.call_id] = e
    return out


def run(tmp_path, turns, registry=REGISTRY, **kw):
    path = tmp_path / "transcript.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with TranscriptWriter(path) as writer:
        result = Runner(registry, ToolContext(), writer).run(ScriptedPlanner(turns), run_started=STARTED, **kw)
    return result, read_transcript(path)


def test_every_planner_mistake_comes_back_as_readable_text(tmp_path):
    checked = []

    def second(events):
        r = returned(events)
        assert r["c1"].ok and r["c1"].result == {"sum": 5}
        assert not r["c2"].ok and r["c2"].error == "the image budget is exhausted: 0 of 100 images left"
        checked.append("second")
        return Turn(reasoning="Retrying with new arguments.",
                    tool_calls=[call(3, "add", '{"a": 1, "b": '), call(4, "ad", {"a": 1, "b": 2}),
                                call(5, "add", {"a": "one"})])

    def third(events):
        r = returned(events)
        assert "not valid JSON" in r["c3"].error and r["c3"].result is None
        assert r["c4"].error == "unknown tool 'ad'. Did you mean 'add'? Available tools: add, refuse, crash, finish."
        assert r["c5"].error.splitlines() == [
            "invalid arguments for add:",
            "- a: Input should be a valid integer, unable to parse string as an integer; expected integer; "
            "got 'one'",
            "- b: missing; expected integer (Second addend.)",
        ]
        # The planner also sees the whole history, including the first turn.
        assert events[0].kind == "run_started" and events[1].tool_calls[0].arguments == {"a": 2, "b": 3}
        checked.append("third")
        return Turn(reasoning="Enough.", final="2 + 3 = 5")

    first = Turn(reasoning="Add, then try the refusing tool.",
                 tool_calls=[call(1, "add", {"a": 2, "b": 3}), call(2, "refuse", "{}")])
    result, events = run(tmp_path, [first, second, third])

    assert checked == ["second", "third"]
    assert result.model_dump() == {"status": "completed", "answer": "2 + 3 = 5", "n_turns": 3, "events": 15}
    assert [e.kind for e in events] == [
        "run_started",
        "planner_turn", "tool_called", "tool_returned", "tool_called", "tool_returned",
        "planner_turn", "tool_called", "tool_returned", "tool_called", "tool_returned", "tool_called",
        "tool_returned",
        "planner_turn", "run_finished",
    ]
    assert [e.call_id for e in events if e.kind == "tool_called"] == ["c1", "c2", "c3", "c4", "c5"]
    assert events[7].arguments == '{"a": 1, "b": '  # the raw text is kept for the record
    assert all(e.duration_s >= 0 for e in events if e.kind == "tool_returned")
    assert events[-1].status == "completed" and events[-1].answer == "2 + 3 = 5"


def test_a_bug_stops_the_run_and_propagates(tmp_path):
    turns = [Turn(tool_calls=[call(1, "crash", {}), call(2, "add", {"a": 1, "b": 1})])]
    path = tmp_path / "transcript.jsonl"
    with TranscriptWriter(path) as writer, pytest.raises(RuntimeError, match="index out of range"):
        Runner(REGISTRY, ToolContext(), writer).run(ScriptedPlanner(turns), run_started=STARTED)
    events = read_transcript(path)
    assert [e.kind for e in events] == ["run_started", "planner_turn", "tool_called", "error", "run_finished"]
    err = events[3]
    assert err.message == "RuntimeError: index out of range in the sampler" and err.where == "tool crash"
    assert "Traceback" in err.traceback and "_crash" in err.traceback
    assert events[-1].status == "error"


def test_planner_error_ends_the_run_without_raising(tmp_path):
    result, events = run(tmp_path, [Turn(reasoning="one turn only", tool_calls=[call(1, "add", {"a": 1, "b": 1})])])
    assert result.status == "error" and result.n_turns == 1
    assert [e.kind for e in events][-2:] == ["error", "run_finished"]
    assert events[-2].message == "the script has only 1 turns" and events[-2].where == "planner scripted"


def test_keyboard_interrupt_leaves_a_valid_transcript(tmp_path):
    def interrupt(events):
        raise KeyboardInterrupt

    path = tmp_path / "transcript.jsonl"
    with TranscriptWriter(path) as writer, pytest.raises(KeyboardInterrupt):
        planner = ScriptedPlanner([Turn(tool_calls=[call(1, "add", {"a": 1, "b": 1})]), interrupt])
        Runner(REGISTRY, ToolContext(), writer).run(planner, run_started=STARTED)
    assert verify_transcript(path).ok
    events = read_transcript(path)
    assert events[-1].kind == "run_finished" and events[-1].status == "interrupted"


def test_max_turns(tmp_path):
    keep_adding = [Turn(tool_calls=[call(i, "add", {"a": i, "b": i})]) for i in range(10)]
    result, events = run(tmp_path, keep_adding, max_turns=3)
    assert (result.status, result.n_turns) == ("max_turns", 3)
    assert [e.kind for e in events].count("planner_turn") == 3 and events[-1].status == "max_turns"


def test_a_spent_budget_ends_the_run_cleanly(tmp_path):
    """A turn whose every call is refused for want of images ends the run as budget_spent, not as an error after
    the planner's retries; a turn with one refused call among others goes on."""
    turns = [Turn(tool_calls=[call(1, "add", {"a": 1, "b": 2}), call(2, "spent", {})]),
             Turn(tool_calls=[call(3, "spent", {}), call(4, "spent", {})]),
             Turn(tool_calls=[call(5, "add", {"a": 1, "b": 1})])]
    result, events = run(tmp_path, turns, LIMITS)
    assert (result.status, result.n_turns) == ("budget_spent", 2)
    assert events[-1].kind == "run_finished" and events[-1].status == "budget_spent"
    # Another refusal (not the budget) is the planner's to fix: the run goes on.
    result, _ = run(tmp_path / "other", [Turn(tool_calls=[call(1, "refuse", {})]), Turn(final="done")], LIMITS)
    assert (result.status, result.n_turns) == ("completed", 2)


def test_max_seconds_ends_the_run_after_the_turn_that_crosses_it(tmp_path):
    slow = [Turn(tool_calls=[call(i, "slow", {})]) for i in range(50)]
    result, events = run(tmp_path, slow, LIMITS, max_seconds=0.12)
    # Each turn sleeps 0.05 s, so the third has crossed 0.12 s at the latest (a loaded machine crosses sooner).
    assert result.status == "time_limit" and 1 <= result.n_turns <= 3, result
    assert events[-1].status == "time_limit"


def test_a_tool_can_finish_the_run(tmp_path):
    turns = [Turn(tool_calls=[call(1, "finish", {"summary": "nothing found"}), call(2, "add", {"a": 1, "b": 1})])]
    result, events = run(tmp_path, turns)
    assert (result.status, result.answer) == ("completed", "nothing found")
    # The call after finish is not run.
    assert [e.kind for e in events] == ["run_started", "planner_turn", "tool_called", "tool_returned",
                                        "run_finished"]


def test_artifact_refs_are_collected_from_image_fields(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")
    refs = [store.put_image(np.full((4, 4, 3), i, dtype=np.uint8)) for i in range(4)]
    result = {
        "image": refs[0],
        "failure_images": [refs[1], "mem:0", refs[0]],
        "edits": [{"edited_image": refs[2], "note": refs[3]}],
        "caption": refs[3],  # not an image field
        "image_refs": ["0" * 64],  # not in the store
    }
    assert artifact_refs(result, store) == refs[:3]
    assert artifact_refs(result, None) == []

    def image_tool(args, ctx):
        return ImageResult(best_image=refs[3])

    class ImageResult(BaseModel):
        best_image: str

    registry = Registry([tool_from_module(tool_module("show", "Shows.", NoArgs, ImageResult, image_tool))])
    path = tmp_path / "transcript.jsonl"
    with TranscriptWriter(path) as writer:
        Runner(registry, ToolContext(artifacts=store), writer).run(
            ScriptedPlanner([Turn(tool_calls=[call(1, "show", {})]), Turn(final="ok")]))
    events = read_transcript(path)
    assert events[0].kind == "planner_turn"  # no run_started given: none written
    assert events[2].artifacts == [refs[3]]


def test_scripted_planner_exhaustion_is_a_planner_error():
    planner = ScriptedPlanner([Turn(final="x")])
    assert planner.next_turn([]).final == "x"
    with pytest.raises(PlannerError):
        planner.next_turn([])
