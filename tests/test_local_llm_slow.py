"""sleuth's requests against a real local model: Qwen2.5-Coder-1.5B-Instruct served by llama.cpp
(``tests/local_llm.py``).

Slow, and skipped unless ``python scripts/local_llm.py setup`` has fetched the model and built the server. Run with
``pytest -m slow tests/test_local_llm_slow.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from local_llm import RunningLLM, local_llm_fixture  # noqa: F401  (the fixture named local_llm)

from sleuth.agent.events import ToolCall, Turn
from sleuth.agent.llm import LLMClient, LLMConfig
from sleuth.agent.llm.context import build_messages
from sleuth.agent.llm.tokens import estimate_prompt_tokens, text_tokens, tool_schema_tokens
from sleuth.agent.llm.toolcalls import extract_tool_calls
from sleuth.agent.planners.llm import INVESTIGATE_TASK, system_prompt
from sleuth.agent.planners.scripted import ScriptedPlanner
from sleuth.agent.transcript import read_transcript
from sleuth.tools import investigation_tools as registry
from sleuth.tools.backends.toyworld import load_backends
from sleuth.tools.cache import PredictionCache
from tests.fakeworld import new_session

pytestmark = pytest.mark.slow

LABEL = "fox"  # a class of the default world with no planted bug


def first_request() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    backends = load_backends()
    system = system_prompt(label=LABEL, class_prompt=backends.prompt_for(LABEL), budget=6000, alpha=0.05,
                           labels=backends.classifier.labels.labels, mode="investigate")
    task = INVESTIGATE_TASK.replace("$label", LABEL)
    return build_messages([], system=system, own_model="x", task=task), registry().schemas()


def investigation_requests(tmp_path: Path) -> list[list[dict[str, Any]]]:
    """The messages an LLM planner would send at five points of a real toyworld investigation (baseline, captions,
    two measurements, a perturbation), each turn rendered as the model's own."""
    backends = load_backends()
    prompt = backends.prompt_for(LABEL)
    system = system_prompt(label=LABEL, class_prompt=prompt, labels=backends.classifier.labels.labels, budget=6000,
                           alpha=0.05, mode="investigate")
    task = INVESTIGATE_TASK.replace("$label", LABEL)
    road = f"{prompt}. it is on the road."
    steps = [("generate_and_classify", {"prompt": prompt, "n": 300}), ("caption_failures", {"measurement_id": "m1"}),
             ("measure_rate", {"caption": road, "max_n": 200}),
             ("perturb_caption", {"caption": road, "types": ["background", "domain"], "n": 2}),
             ("measure_rate", {"caption": f"a painting of a {LABEL}.", "max_n": 200})]
    turns = [Turn(reasoning=f"Step {i + 1}: {name}.", model="scripted",
                  tool_calls=[ToolCall(id=f"call_{i + 1}", name=name, arguments=args)])
             for i, (name, args) in enumerate(steps)]
    sess = new_session(backends, tmp_path / "run", cache=PredictionCache(), budget=6000, **{"class": LABEL})
    sess.run(ScriptedPlanner([*turns, Turn(final="done", model="scripted")]), max_turns=len(turns))
    events = read_transcript(sess.transcript)
    cuts = [i + 1 for i, e in enumerate(events) if e.kind == "tool_returned"]
    return [build_messages(events[:cut], system=system, own_model="scripted", task=task) for cut in cuts]


def served_prompt_tokens(llm: RunningLLM, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
    """The prompt the server builds with its chat template, counted by the model's tokenizer."""
    prompt = llm.post("/apply-template", {"messages": messages, "tools": tools})["prompt"]
    return llm.count_tokens(prompt)


def test_a_real_model_answers_a_sleuth_request_with_a_valid_tool_call(local_llm: RunningLLM) -> None:
    messages, tools = first_request()
    client = LLMClient(LLMConfig(model=local_llm.model, api_base=local_llm.base_url, timeout_s=1800, max_tokens=160))
    reply = client.complete(messages, tools)
    names = {t["function"]["name"] for t in tools}
    calls = [(c.name, c.arguments) for c in reply.tool_calls]
    if not calls:  # written in its text rather than in the server's format: sleuth's parser reads it
        calls = [(c.name, c.arguments) for c in extract_tool_calls(reply.content, names).calls]
    assert calls, f"no tool call in the reply: {reply.content[:500]!r}"
    reg = registry()
    for name, arguments in calls:
        reg.parse_args(name, arguments)  # raises if the arguments do not fit the tool's schema
    assert reply.usage.prompt_tokens > 2000 and reply.usage.completion_tokens > 0


def test_prompt_token_estimates_track_the_servers_count(local_llm: RunningLLM, tmp_path: Path) -> None:
    tools = registry().schemas()
    schema_only = served_prompt_tokens(local_llm, [{"role": "user", "content": "hi"}], tools) - \
        served_prompt_tokens(local_llm, [{"role": "user", "content": "hi"}], [])
    assert 1.0 <= tool_schema_tokens(tools) / schema_only <= 1.1, (tool_schema_tokens(tools), schema_only)
    for messages in [first_request()[0], *investigation_requests(tmp_path)]:
        measured = served_prompt_tokens(local_llm, messages, tools)
        estimate = estimate_prompt_tokens(messages, tools)
        # Never short of the real count (it budgets a context window), and not wasteful either.
        assert 1.0 <= estimate / measured <= 1.1, (estimate, measured)
    # Prose with rare words and names (this repository's README) is not undercounted by much either.
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert 0.93 <= text_tokens(readme) / local_llm.count_tokens(readme) <= 1.1


def test_a_real_model_drives_a_short_investigation_in_forced_call_mode(local_llm: RunningLLM,
                                                                        tmp_path: Path) -> None:
    """Four turns of the LLM planner with the real model, no shim: every turn is one schema-valid call that runs."""
    from sleuth.agent.events import PlannerTurn, ToolReturned
    from sleuth.agent.llm.context import ContextConfig
    from sleuth.agent.planners.llm import LLMPlanner

    backends = load_backends()
    sess = new_session(backends, tmp_path / "run", cache=PredictionCache(), budget=3000, **{"class": LABEL})
    client = LLMClient(LLMConfig(model=local_llm.model, api_base=local_llm.base_url, timeout_s=1800,
                                 max_tokens=200, call_format="json"))
    planner = LLMPlanner(client, registry(), label=LABEL, class_prompt=backends.prompt_for(LABEL),
                         labels=backends.classifier.labels.labels, budget=3000,
                         context=ContextConfig(max_tokens=12_000))
    result = sess.run(planner, max_turns=4)
    events = read_transcript(sess.transcript)
    turns = [e for e in events if isinstance(e, PlannerTurn)]
    returned = [e for e in events if isinstance(e, ToolReturned)]
    assert result.status in ("max_turns", "completed", "budget_spent"), result
    assert turns and all(len(t.tool_calls) == 1 for t in turns)
    assert all(r.ok for r in returned), [r.error for r in returned if not r.ok]
    assert all(t.latency_s and t.requests for t in turns)
