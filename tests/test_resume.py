"""Resuming a cut transcript: the rebuilt state and the continued run equal an uninterrupted run, event for event."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sleuth.agent.audit.budget import BudgetedPlanner, stopped_by
from sleuth.agent.errors import PlannerError
from sleuth.agent.events import ErrorEvent, Event, RunFinished, ToolCall
from sleuth.agent.planners.protocol_v1 import ProtocolV1Planner
from sleuth.agent.planners.replay import BUDGET_MODEL, ReplayPlanner, fast_forward, holds_state, recorded_turns
from sleuth.agent.replay.rebuild import RebuildError
from sleuth.agent.replay.resume import continue_run
from sleuth.agent.runner import Turn
from sleuth.agent.session import Session
from sleuth.agent.transcript import TranscriptWriter, read_transcript, verify_transcript
from tests.fakeworld import fake_backends, new_session

CAT = "a realistic photograph of a cat"
VOLATILE = {"ts", "hash", "prev_hash", "duration_s"}


def session(parent: Path, backends=None) -> Session:
    # The same leaf name everywhere, so run_started (its run_id is the directory name) compares equal; the same
    # confirmation draw, as a resume in the run's own directory claims (here each copy is another directory).
    return new_session(backends or fake_backends(), parent / "run", confirmation_draw=0)


def planner() -> ProtocolV1Planner:
    return ProtocolV1Planner("cat", CAT, baseline_n=1000)


def payloads(events: list[Event]) -> list[dict]:
    out = []
    for e in events:
        d = e.model_dump(mode="json", exclude=VOLATILE)
        if d["kind"] == "run_started":
            d.pop("versions")
        out.append(d)
    return out


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """An uninterrupted protocol run on the fake world (it confirms 'cat in the snow')."""
    s = session(tmp_path_factory.mktemp("full"))
    result = s.run(planner())
    events = read_transcript(s.transcript)
    assert result.status == "completed" and sum(e.kind == "finding" for e in events) == 1
    return s, events, s.transcript.read_bytes().split(b"\n")[:-1]


def cut_points(events: list[Event]) -> dict[str, tuple[int, bool]]:
    """Named (lines kept, tear the next line) crash points, one of each kind of moment."""
    kinds = [e.kind for e in events]
    finding = kinds.index("finding")
    first_call = kinds.index("tool_called")
    return {
        "nothing written": (0, False),
        "torn run_started": (0, True),
        "after run_started": (1, False),
        "mid call (tool_called written)": (first_call + 1, False),
        "torn first result": (first_call + 1, True),
        "between turns": (kinds.index("planner_turn", first_call) , False),
        "torn planner turn": (kinds.index("planner_turn", first_call), True),
        "mid run": (len(events) // 2, False),
        "finding written, result not": (finding + 1, False),
        "finding's call returned, its mode not placed": (kinds.index("mode"), False),
        "torn finding": (finding, True),
        "finish returned, run_finished not": (len(events) - 1, False),
        "torn run_finished": (len(events) - 1, True),
    }


@pytest.mark.e2e
def test_resume_at_each_kind_of_crash_point_equals_the_uninterrupted_run(full, tmp_path):
    s0, events, lines = full
    reference = payloads(events)
    for name, (keep, tear) in cut_points(events).items():
        parent = tmp_path / name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")
        (parent / "run").mkdir(parents=True)
        data = b"".join(line + b"\n" for line in lines[:keep])
        torn = lines[keep][: len(lines[keep]) // 2] if tear else b""
        (parent / "run" / "transcript.jsonl").write_bytes(data + torn)
        s = session(parent)
        done = continue_run(s, planner())
        got = read_transcript(s.transcript)
        assert payloads(got) == reference, name
        assert verify_transcript(s.transcript).ok, name
        assert s.investigation.findings == s0.investigation.findings, name
        assert s.investigation.budget.used == s0.investigation.budget.used, name
        assert done.result.status == "completed" and done.result.events == len(events), name
        assert done.recovered_events == keep, name
        # The torn bytes are kept beside the transcript, never silently dropped.
        if tear:
            assert done.torn_path is not None and done.torn_path.read_bytes() == torn, name
        else:
            assert done.torn_path is None, name


def test_a_finished_run_is_rebuilt_without_writing(full, tmp_path):
    s0, events, lines = full
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "transcript.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    s = session(tmp_path)
    done = continue_run(s, planner())
    assert done.already_finished and done.result.status == "completed"
    assert done.rerun_calls == sum(e.kind == "tool_called" for e in events)
    assert s.transcript.read_bytes() == b"".join(line + b"\n" for line in lines)
    assert s.investigation.findings == s0.investigation.findings
    assert [t.adjusted_p for t in s.investigation.tests] == [t.adjusted_p for t in s0.investigation.tests]


def test_an_interrupted_run_continues_after_its_interrupted_marker(full, tmp_path):
    s0, events, lines = full
    keep = len(events) // 3
    (tmp_path / "run").mkdir()
    path = tmp_path / "run" / "transcript.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines[:keep]))
    with TranscriptWriter(path, resume=True) as w:  # what Ctrl-C leaves behind
        w.append(RunFinished(status="interrupted"))
    s = session(tmp_path)
    done = continue_run(s, planner())
    got = read_transcript(path)
    assert done.result.status == "completed" and len(got) == len(events) + 1
    # The marker stays (the transcript is append-only); every other event is the uninterrupted run's.
    def rest(evs: list[Event]) -> list[dict]:
        return [{k: v for k, v in e.items() if k != "seq"} for e in payloads(evs) if e["kind"] != "run_finished"]

    assert rest(got) == rest(events) and [e.kind for e in got].count("run_finished") == 2
    assert s.investigation.findings == s0.investigation.findings


def test_a_run_cut_after_its_error_event_is_closed_as_error(full, tmp_path):
    _, events, lines = full
    (tmp_path / "run").mkdir()
    path = tmp_path / "run" / "transcript.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines[:5]))
    with TranscriptWriter(path, resume=True) as w:
        w.append(ErrorEvent(message="PlannerError: the model sent nothing", where="planner llm"))
    done = continue_run(session(tmp_path), planner())
    got = read_transcript(path)
    assert done.result.status == "error" and got[-1].kind == "run_finished" and len(got) == 7


def _rehash(lines: list[bytes]) -> bytes:
    from sleuth.agent.events import event_hash

    prev, out = "", []
    for raw in lines:
        obj = json.loads(raw)
        obj["prev_hash"] = prev
        obj["hash"] = prev = event_hash(obj)
        out.append(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")
    return b"".join(out)


def test_resume_refuses_a_prefix_whose_results_do_not_reproduce(full, tmp_path):
    _, events, lines = full
    line = next(i for i, e in enumerate(events) if e.kind == "tool_returned" and e.name == "measure_rate")
    obj = json.loads(lines[line])
    obj["result"]["hypothesis"]["failures"]["k"] += 1
    forged = [*lines[:line], json.dumps(obj).encode(), *lines[line + 1: line + 3]]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "transcript.jsonl").write_bytes(_rehash(forged))
    with pytest.raises(RebuildError) as err:
        continue_run(session(tmp_path), planner())
    assert err.value.line == line + 1 and "result.hypothesis.failures.k" in str(err.value)


def test_resume_refuses_a_planner_that_does_not_reproduce_its_turns(full, tmp_path):
    _, events, lines = full
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "transcript.jsonl").write_bytes(b"".join(line + b"\n" for line in lines[:8]))
    with pytest.raises(RebuildError) as err:
        continue_run(session(tmp_path), ProtocolV1Planner("cat", CAT, baseline_n=500))
    assert err.value.line == 2 and "does not reproduce" in str(err.value)


def test_fast_forward_replays_a_protocol_planner_to_the_recorded_point(full):
    _, events, _ = full
    p = planner()
    n, divergence = fast_forward(p, events[:20])
    assert divergence is None and n == sum(e.kind == "planner_turn" for e in events[:20])
    # The planner now continues exactly as the recorded run did.
    nxt = next(i for i, e in enumerate(events) if i >= 20 and e.kind == "planner_turn")
    assert recorded_turns(events[nxt: nxt + 1])[0][1].tool_calls == p.next_turn(events[:nxt]).tool_calls


def test_replay_planner_plays_recorded_turns_then_hands_over_or_stops(full):
    _, events, _ = full
    turns = [t for _, t in recorded_turns(events)]
    r = ReplayPlanner(turns[:2])
    assert r.next_turn(()) == turns[0] and r.next_turn(()) == turns[1]
    with pytest.raises(PlannerError, match="no turn after its 2 recorded"):
        r.next_turn(())
    after = Turn(final="done")
    handed = ReplayPlanner(turns[:1], then=type("P", (), {"name": "x", "next_turn": lambda self, e: after})())
    assert handed.next_turn(()) == turns[0] and handed.next_turn(()) is after
    assert not holds_state(r) and holds_state(planner())


def test_budgeted_planner_stops_on_time_and_cost_and_replays_without_asking():
    class Counting:
        name = "counting"
        deterministic = True

        def __init__(self) -> None:
            self.asked = 0

        def next_turn(self, events):
            self.asked += 1
            return Turn(tool_calls=[ToolCall(id=f"c{self.asked}", name="finish", arguments={"summary": "x"})])

    left = [5.0]
    inner = Counting()
    p = BudgetedPlanner(inner, seconds_left=lambda: left[0], cost_limit=0.5)
    assert p.next_turn(()).tool_calls[0].id == "c1" and p.name == "counting"
    left[0] = 0.0
    stop = p.next_turn(())
    assert stop.model == BUDGET_MODEL and stop.tool_calls[0].name == "finish" and inner.asked == 1
    assert "wall-time budget" in stop.reasoning
    from sleuth.agent.events import PlannerTurn

    costly = [PlannerTurn(reasoning="", cost_usd=0.3), PlannerTurn(reasoning="", cost_usd=0.25)]
    left[0] = 10.0
    assert "cost budget" in BudgetedPlanner(Counting(), seconds_left=lambda: 1.0, cost_limit=0.5).next_turn(
        costly).reasoning
    # A recorded budget stop is never asked of the planner when it is fast-forwarded.
    recorded = [PlannerTurn(reasoning="", tool_calls=[ToolCall(id="c1", name="finish", arguments={"summary": "x"})]),
                PlannerTurn(reasoning=stop.reasoning, tool_calls=stop.tool_calls, model=BUDGET_MODEL)]
    fresh = Counting()
    assert fast_forward(BudgetedPlanner(fresh), recorded) == (1, None) and fresh.asked == 1
    assert stopped_by(recorded) == stop.reasoning
