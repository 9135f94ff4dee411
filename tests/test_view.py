"""The investigation view: built from a real run's events (the fake backends), it holds what the investigation
itself holds; it follows a growing log and names what it cannot read."""

from __future__ import annotations

import pytest

from sleuth.agent.events import ToolReturned
from sleuth.agent.planners.protocol_v1 import ProtocolV1Planner
from sleuth.agent.transcript import read_transcript
from sleuth.agent.view import InvestigationView
from sleuth.tools import generate_and_classify, measure_rate
from tests.fakeworld import fake_backends, new_session

CAT = "a realistic photograph of a cat"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    session = new_session(fake_backends(), tmp_path_factory.mktemp("view") / "run", budget=6_000)
    result = session.run(ProtocolV1Planner("cat", CAT, baseline_n=300, max_n=300, explore=False))
    return session, result, read_transcript(session.transcript)


def test_the_view_of_a_run_holds_what_its_investigation_holds(run):
    session, result, events = run
    inv = session.investigation
    view = InvestigationView.from_events(events)
    assert inv.findings and inv.tests  # the fake world's snow bug is found
    assert [t.test_id for t in view.tests] == [t.id for t in inv.tests]
    assert [(f.finding_id, f.caption) for f in view.findings] == [(f.finding_id, f.caption) for f in inv.findings]
    assert [f.finding_id for f in view.recorded] == [f.finding_id for f in inv.findings]
    assert view.finding_events == len(inv.findings)
    assert view.images_used == inv.budget.used and view.images_left == inv.budget.left
    assert view.confirmations == inv.confirmations_used
    assert view.declared_confirmations == inv.max_confirmations
    assert len(view.turns) == result.n_turns and view.finished is not None and view.finished.status == result.status
    assert view.started is not None and view.started.planner == "protocol-v1"
    assert view.finish_called and not view.warnings and view.budget_stop is None
    # Every measurement is known with its prompt, and the class prompt's failures were captioned into proposals.
    assert set(view.measured) == set(inv.measurements) and CAT in view.measured.values()
    assert any(p.parent == CAT and p.relation.startswith("caption of") for p in view.proposals)
    assert view.samples and all(isinstance(s, generate_and_classify.Result) for s in view.samples)
    # The turns' results are grouped under them; the latest are those of the final turn (finish).
    assert sum(len(x.results) for x in view.exchanges if hasattr(x, "results")) == len(view.returned)
    assert [r.event.name for r in view.latest] == ["finish"]
    assert set(view.images_at_findings) == {f.finding_id for f in inv.findings if f.confirmed}


def test_a_view_that_follows_the_log_equals_one_read_at_once(run):
    _, _, events = run
    whole = InvestigationView.from_events(events)
    follow = InvestigationView.from_events(events[:1])
    for n in range(2, len(events) + 1, 7):
        assert follow.extend(events[:n]) is follow
    follow = follow.extend(events)
    assert follow._read == len(events)
    for name in ("images_used", "images_left", "finding_events", "confirmations", "tool_errors", "cost_usd",
                 "latest_measurement"):
        assert getattr(follow, name) == getattr(whole, name), name
    assert [t.test_id for t in follow.tests] == [t.test_id for t in whole.tests]
    assert follow.proposals == whole.proposals and follow.images_at_findings == whole.images_at_findings
    # Another log (a fork's) is read from its start, into a new view.
    other = follow.extend(events[:5])
    assert other is not follow and other._read == 5 and len(other.turns) <= len(follow.turns)


def test_a_result_that_does_not_fit_its_tool_is_named_and_skipped(run):
    _, _, events = run
    i, bad = next((i, e) for i, e in enumerate(events) if isinstance(e, ToolReturned) and e.name == "measure_rate")
    broken = bad.model_copy(update={"result": {**(bad.result or {}), "verdict": 3}})
    view = InvestigationView.from_events([*events[:i], broken, *events[i + 1:]])
    assert len(view.tests) == len(InvestigationView.from_events(events).tests) - 1
    assert view.warnings == [f"line {bad.seq + 1} (measure_rate): skipped, the result does not match this sleuth's "
                             "tools (verdict: Input should be 'supported', 'not supported' or 'inconclusive')"]
    assert all(isinstance(t, measure_rate.Result) for t in view.tests)


def test_each_confirmed_finding_is_placed_in_a_mode_after_the_call_that_recorded_it(run):
    session, _, events = run
    kinds = [e.kind for e in events]
    placed = [e for e in events if e.kind == "mode"]
    confirmed = [f.finding_id for f in session.investigation.findings if f.confirmed]
    assert [e.finding_id for e in placed] == confirmed and placed[0].mode_id == "m1"
    for e in placed:  # right after the tool_returned of the call whose finding it places
        i = kinds.index("mode", events.index(e))
        assert events[i - 1].kind == "tool_returned" and events[i - 1].name == "record_finding"
    view = InvestigationView.from_events(events)
    assert not view.unplaced()
    got = view.mode_claims()
    assert [f.finding_id for c in got for f in c.findings] == confirmed
    # A transcript without mode events (written before modes were recorded) gets the same modes from the model.
    older = InvestigationView.from_events([e for e in events if e.kind != "mode"])
    assert [(c.mode.mode_id, [f.finding_id for f in c.findings], c.best.finding_id) for c in older.mode_claims()] == \
        [(c.mode.mode_id, [f.finding_id for f in c.findings], c.best.finding_id) for c in got]
    assert not older.modes.modes  # computed for the reader, not written into the view's own book
