"""Prompt-token estimates (``agent.llm.tokens``) against counts measured on a real tokenizer.

``data/token_calibration.json`` holds real sleuth requests (the system prompt, tool schemas and the results of a
toyworld investigation of "fox") with the prompt tokens Qwen2.5's tokenizer gave them through llama.cpp's chat template
(``/apply-template`` then ``/tokenize``). ``tests/test_local_llm_slow.py`` re-measures live requests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sleuth.agent.llm.context import estimate_tokens
from sleuth.agent.llm.tokens import estimate_prompt_tokens, message_tokens, text_tokens, tool_schema_tokens

DATA = json.loads((Path(__file__).parent / "data" / "token_calibration.json").read_text())


def test_text_is_split_as_bpe_pre_tokenizers_split_it():
    assert text_tokens("") == 0
    assert text_tokens("12345") == 5  # one token a digit, as Qwen's tokenizer does
    assert text_tokens("the fox is on the road") == 6
    assert text_tokens('{"k":37,"n":120}') == text_tokens('{"k":') + 2 + text_tokens(',"n":') + 3 + 1
    # An image ref is dense: far more than 4 characters a token.
    assert text_tokens("img:3fa2b9c01d2e") >= 10


@pytest.mark.parametrize("name", sorted(DATA["texts"]))
def test_text_estimates_are_at_most_8_percent_high_and_never_low(name):
    item = DATA["texts"][name]
    assert 1.0 <= text_tokens(item["text"]) / item["measured"] <= 1.08, (text_tokens(item["text"]), item["measured"])


def test_tool_schemas_are_counted():
    tools = DATA["tools"]
    measured = DATA["tools_measured"]  # what the tool list adds to the prompt, by the server's count
    assert measured > 1400
    assert 1.0 <= tool_schema_tokens(tools) / measured <= 1.08
    messages = DATA["requests"][0]["messages"]
    assert estimate_prompt_tokens(messages, tools) - estimate_prompt_tokens(messages) >= measured


@pytest.mark.parametrize("index", range(len(DATA["requests"])))
def test_request_estimates_never_fall_short_and_stay_within_8_percent(index):
    request = DATA["requests"][index]
    estimate = estimate_prompt_tokens(request["messages"], DATA["tools"])
    assert 1.0 <= estimate / request["measured"] <= 1.08, (request["name"], estimate, request["measured"])
    # The context builder budgets with the same estimate, tool schemas included (4 characters a token, messages only,
    # was about half the real count).
    assert estimate_tokens(request["messages"], DATA["tools"]) == estimate
    assert sum(len(str(m.get("content") or "")) for m in request["messages"]) / 4 / request["measured"] < 0.6


def test_scaffolding_of_messages_calls_results_and_images():
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "measure_rate", "arguments": '{"caption": "a fox."}'}}]}
    assert message_tokens(call) > message_tokens({"role": "assistant", "content": None}) + 10
    assert message_tokens({"role": "tool", "content": "x"}) > message_tokens({"role": "user", "content": "x"})
    image = {"role": "user", "content": [{"type": "text", "text": "look"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}
    assert message_tokens(image) == message_tokens({"role": "user", "content": "look"}) + 255
