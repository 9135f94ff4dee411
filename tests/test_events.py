"""Event models: the discriminated union, hashing and the schema-upgrade mechanism."""

from __future__ import annotations

import hashlib
import json
import typing

import pytest
from pydantic import ValidationError

from sleuth.agent import events as ev
from sleuth.agent.events import PlannerTurn, ToolCall, UserMessage, event_hash, parse_event


def test_every_kind_round_trips_through_json(sample_events):
    placed = ev.ModePlaced(mode_id="m1", finding_id="f1", reason="a cause of its own", idea="it is in the snow",
                           labels=["snow leopard"])
    events = [*sample_events, placed]
    kinds = [e.kind for e in events]
    assert set(kinds) == {"run_started", "planner_turn", "tool_called", "tool_returned", "user_message", "finding",
                          "mode", "run_finished", "error"}
    assert set(kinds) == {t.model_fields["kind"].default for t in typing.get_args(typing.get_args(ev.Event)[0])}
    for e in events:
        back = parse_event(json.loads(e.model_dump_json()))
        assert type(back) is type(e)
        assert back == e


def test_unparseable_tool_arguments_stay_text():
    turn = PlannerTurn(tool_calls=[ToolCall(id="1", name="add", arguments='{"a": 1,')])
    back = parse_event(json.loads(turn.model_dump_json()))
    assert back.tool_calls[0].arguments == '{"a": 1,'


def test_unknown_kind_and_extra_fields_are_refused():
    with pytest.raises(ValidationError):
        parse_event({"kind": "telepathy", "v": 1})
    with pytest.raises(ValidationError, match="extra"):
        parse_event({"kind": "user_message", "v": 1, "text": "hi", "colour": "red"})
    with pytest.raises(ValidationError):
        parse_event({"kind": "run_finished", "v": 1, "status": "exploded"})


def test_hash_is_sha256_of_canonical_json_without_hash():
    obj = {"kind": "user_message", "text": "é", "v": 1, "seq": 0, "ts": "", "prev_hash": "", "hash": "whatever"}
    expected = hashlib.sha256('{"kind":"user_message","prev_hash":"","seq":0,"text":"é","ts":"","v":1}'
                              .encode()).hexdigest()
    assert event_hash(obj) == expected
    # Key order and the hash field itself do not matter.
    assert event_hash(dict(reversed(list(obj.items())))) == expected
    assert event_hash({**obj, "hash": "other"}) == expected


def test_old_events_are_upgraded_through_numbered_functions(monkeypatch):
    def v0_to_v1(d):
        d["text"] = d.pop("content")
        return d

    monkeypatch.setattr(ev, "UPGRADES", {0: v0_to_v1})
    old = {"kind": "user_message", "v": 0, "content": "hello", "seq": 3}
    e = parse_event(old)
    assert isinstance(e, UserMessage)
    assert (e.text, e.v, e.seq) == ("hello", 1, 3)
    # A single model validates through the same hook.
    assert UserMessage.model_validate({"v": 0, "content": "hi"}).text == "hi"


def test_upgrades_chain_and_may_rename_kinds(monkeypatch):
    def v0_to_v1(d):
        d["kind"] = "user_message" if d["kind"] == "note" else d["kind"]
        return d

    def v1_to_v2(d):
        d["text"] = d["text"].upper()
        return d

    monkeypatch.setattr(ev, "SCHEMA_VERSION", 2)
    monkeypatch.setattr(ev, "UPGRADES", {0: v0_to_v1, 1: v1_to_v2})
    e = parse_event({"kind": "note", "v": 0, "text": "hi"})
    assert isinstance(e, UserMessage) and e.text == "HI" and e.v == 2


def test_missing_upgrade_and_newer_versions_are_errors(monkeypatch):
    monkeypatch.setattr(ev, "UPGRADES", {})
    with pytest.raises(ValueError, match="no upgrade from schema v0"):
        parse_event({"kind": "user_message", "v": 0, "text": "hi"})
    with pytest.raises(ValueError, match="newer"):
        parse_event({"kind": "user_message", "v": ev.SCHEMA_VERSION + 1, "text": "hi"})
