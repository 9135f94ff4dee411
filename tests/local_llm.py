"""A real local LLM for slow tests: Qwen2.5-Coder-1.5B-Instruct behind llama.cpp's ``llama-server``, on 127.0.0.1.

``scripts/local_llm.py setup`` downloads the model and builds the server once (about 10 min on 2 cores); these
fixtures start the server from that cache and skip, saying what to run, when it is not there. Use::

    from local_llm import local_llm_fixture  # noqa: F401  (the fixture, named local_llm)

    @pytest.mark.slow
    def test_something(local_llm):
        local_llm.base_url  # "http://127.0.0.1:PORT/v1", for litellm's api_base

One server serves the whole test session (loading the model takes seconds, and its prompt cache is worth keeping).
``SLEUTH_LLM_URL=http://127.0.0.1:PORT`` points the fixture at a server that is already running instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    # scripts/ is no package, and its module shares this file's name: load it under a name of its own.
    name = "sleuth_scripts_local_llm"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "local_llm.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


script = _script()

USER_CACHE = script.cache_dir()
"""Read when this module is imported, at collection: before conftest points $SLEUTH_CACHE at a private directory for
the tests' prediction caches. The model and the server are the user's, built once, and only read here."""

MODEL_NAME = "openai/qwen2.5-coder-1.5b"
"""The litellm model string: the server serves one model whatever the name; ``openai/`` selects the wire format."""


@dataclass
class RunningLLM:
    base_url: str
    """``http://127.0.0.1:PORT/v1``."""
    url: str
    """``http://127.0.0.1:PORT``, for llama.cpp's own endpoints (/tokenize, /apply-template, /props)."""
    load_seconds: float
    model: str = MODEL_NAME

    def post(self, path: str, body: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
        """POST JSON to the server (``path`` relative to ``url``, e.g. ``/v1/chat/completions``)."""
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as r:
            result: dict[str, Any] = json.loads(r.read())
        return result

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` by the model's own tokenizer (special tokens such as ``<|im_start|>`` count as one)."""
        return len(self.post("/tokenize", {"content": text, "parse_special": True})["tokens"])


def missing_reason(paths: Any) -> str | None:
    if not paths.model_ready():
        return f"no verified local model in {paths.root}: run `python scripts/local_llm.py setup`"
    if not paths.server_ready():
        return f"no llama-server in {paths.root}: run `python scripts/local_llm.py setup`"
    return None


@pytest.fixture(scope="session", name="local_llm")
def local_llm_fixture() -> Iterator[RunningLLM]:
    running = os.environ.get("SLEUTH_LLM_URL")
    if running:  # a server the user already runs (``scripts/local_llm.py start``): its prompt cache is warm
        url = running.rstrip("/").removesuffix("/v1")
        yield RunningLLM(base_url=url + "/v1", url=url, load_seconds=0.0)
        return
    paths = script.Paths(USER_CACHE)
    reason = missing_reason(paths)
    if reason:
        pytest.skip(reason)
    ctx = int(os.environ.get("SLEUTH_LLM_CTX", "16384"))
    server = script.LocalServer(paths, script.ServerOptions(ctx_size=ctx),
                                log_file=Path(os.environ.get("SLEUTH_LLM_LOG", paths.root / "server-tests.log")))
    server.start()
    try:
        yield RunningLLM(base_url=server.base_url, url=server.url, load_seconds=server.load_seconds or 0.0)
    finally:
        server.stop()
