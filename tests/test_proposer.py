"""--proposer llm: a language model adds candidates to the protocol planner's screen, one request per class, against
the scripted OpenAI-compatible stub; a malformed reply leaves the vocabulary's candidates standing."""

from __future__ import annotations

import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest
from llm_stub import StubServer, text_reply
from pydantic import ValidationError

from sleuth.agent.config import PlannerConfig
from sleuth.agent.planners.protocol import ProtocolPlanner
from sleuth.agent.transcript import read_transcript
from sleuth.tools.cache import PredictionCache
from tests.fakeworld import fake_backends, new_session

KEY_ENV = "SLEUTH_STUB_API_KEY"
CAT = "a realistic photograph of a cat"
NEW = CAT + " in the snow on the sand"
"""Two attributes at once: no single-attribute perturbation of the vocabulary says it."""


def run(stub: StubServer, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-stub-not-a-real-key-000000")
    planner = {"name": "protocol", "proposer": "llm",
               "llm": {"model": "openai/stub-model", "api_base": stub.api_base, "api_key_env": KEY_ENV,
                       "retries": 0}}
    sess = new_session(fake_backends(), tmp_path / "run", cache=PredictionCache(), budget=4000, planner=planner)
    p = sess.planner()
    assert isinstance(p, ProtocolPlanner) and p.proposer == "llm"
    result = sess.run(p)
    events = list(read_transcript(sess.transcript))
    turns = [e.reasoning or "" for e in events if e.kind == "planner_turn"]
    perturbs = [e for e in events if e.kind == "tool_returned" and e.name == "perturb_caption"
                and e.result["caption"] == CAT]
    return result, events, turns, perturbs


def test_the_models_candidates_are_screened_and_their_fate_reported(tmp_path, monkeypatch):
    reply = {"edits": [
        {"type": "background", "edit": "in the snow on the sand", "caption": NEW},
        {"type": "object", "edit": "a dog", "caption": "a realistic photograph of a dog"},  # drops the class
    ]}
    with StubServer([text_reply(json.dumps(reply))]) as stub:
        result, events, turns, perturbs = run(stub, tmp_path, monkeypatch)
        requests = list(stub.requests)
    assert result.status == "completed"
    # One request for the class, with the failure captions as data.
    assert len(requests) == 1
    sent = requests[0].text()
    assert "<<<FAILURES" in sent and "FAILURES>>>" in sent and "snow" in sent.split("<<<FAILURES")[1]
    (pert,) = perturbs
    assert pert.result["source"] == "llm+vocabulary"
    edits = pert.result["edits"]
    assert [e["caption"] for e in edits if e["source"] == "llm"] == [NEW]
    assert any("a realistic photograph of a dog" in r for r in pert.result["rejected"])
    # What it added, in a turn of its own, then what became of it, in the answer.
    said = next(t for t in turns if t.startswith("The language model proposed"))
    assert said == ("The language model proposed 1 edit the generator can render; 1 is a candidate the vocabulary "
                    f"does not have: {NEW!r}.")
    screened = [e for e in events if e.kind == "tool_called" and e.name == "generate_and_classify"
                and e.arguments.get("prompt") == NEW]
    assert screened, "the model's candidate was screened"
    final = events[-2].final if events[-2].kind == "planner_turn" else turns[-1]
    assert "Of the language model's 1 candidate, 1 was screened," in (final or turns[-1])


def test_a_malformed_proposal_leaves_the_vocabularys_candidates(tmp_path, monkeypatch):
    with StubServer([text_reply("Sure! Here are some ideas: snow, sand.")]) as stub:
        result, events, turns, perturbs = run(stub, tmp_path, monkeypatch)
    assert result.status == "completed"
    (pert,) = perturbs
    assert pert.result["source"] == "vocabulary" and pert.result["edits"]
    assert any("could not be used" in n for n in pert.result["notes"])
    assert any(t.startswith("The language model's proposals: the LLM's perturbations could not be used (the LLM's "
                            "perturbations were not valid JSON") and t.endswith("; these are the vocabulary's.")
               for t in turns)
    # The investigation goes on as without a model: the snow failure is still found.
    recorded = [e for e in events if e.kind == "finding"]
    assert any("snow" in e.finding["caption"] for e in recorded)


def test_the_proposer_needs_a_model_and_the_protocol_planner():
    cfg = PlannerConfig.model_validate({"name": "protocol+llm:openai/qwen"})
    assert cfg.name == "protocol" and cfg.proposer == "llm" and cfg.llm is not None and cfg.llm.model == "openai/qwen"
    # As the benchmark builds it: the name carries the model, the flag-named keys the server.
    bench = PlannerConfig.model_validate({"name": "protocol+llm:openai/qwen", "api_base": "http://127.0.0.1:9/v1",
                                          "llm_timeout": 30.0})
    assert bench.llm is not None and bench.llm.api_base == "http://127.0.0.1:9/v1" and bench.llm.timeout_s == 30.0
    with pytest.raises(ValidationError, match="the llm proposer needs a model"):
        PlannerConfig.model_validate({"name": "protocol", "proposer": "llm"})
    with pytest.raises(ValidationError, match="adds candidates to the protocol planner, not to 'wiles'"):
        PlannerConfig.model_validate({"name": "wiles", "proposer": "llm", "llm": "openai/qwen"})
    with pytest.raises(ValidationError, match="choose the llm planner, or the llm proposer"):
        PlannerConfig.model_validate({"name": "protocol", "llm": "openai/qwen"})
