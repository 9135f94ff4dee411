"""A local OpenAI-compatible chat-completions server with scripted replies, for driving the LLM planner over HTTP.

The server listens on 127.0.0.1 (a free port) in a background thread. Each POST to ``/v1/chat/completions`` takes
the next step of the script: a reply built with ``tool_reply`` / ``text_reply``, an ``HttpError`` (e.g. a 429), or a
callable given the request body that returns either. Every request is kept (body and headers) so tests can check
what the planner sent: the tool results it fed back, the key it authenticated with, the images it attached.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class HttpError:
    status: int
    message: str = "error"
    headers: dict[str, str] = field(default_factory=dict)


Reply = dict[str, Any] | HttpError
Step = Reply | Callable[[dict[str, Any]], Reply]


def tool_call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None) -> dict[str, Any]:
    """One tool call; a str ``arguments`` is sent verbatim (use it for malformed JSON)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id or f"call_{abs(hash((name, args))) % 10**8}", "type": "function",
            "function": {"name": name, "arguments": args}}


def tool_reply(*calls: dict[str, Any], content: str | None = None, usage: tuple[int, int] = (100, 20)) -> Reply:
    return {"message": {"role": "assistant", "content": content, "tool_calls": list(calls)},
            "finish_reason": "tool_calls", "usage": usage}


def text_reply(content: str, usage: tuple[int, int] = (100, 20)) -> Reply:
    return {"message": {"role": "assistant", "content": content}, "finish_reason": "stop", "usage": usage}


@dataclass
class Request:
    body: dict[str, Any]
    headers: dict[str, str]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.body.get("messages", [])

    def text(self) -> str:
        """Every message's text content joined, for asserting on what the model was shown."""
        out = []
        for m in self.messages:
            c = m.get("content")
            if isinstance(c, str):
                out.append(c)
            elif isinstance(c, list):
                out.extend(p.get("text", "") for p in c if isinstance(p, dict))
        return "\n".join(out)


class StubServer:
    """``with StubServer(script) as stub:`` then point litellm at ``stub.api_base``."""

    def __init__(self, script: list[Step], *, model: str = "stub-model", fallback: Step | None = None) -> None:
        self.script = list(script)
        self.fallback = fallback
        self.model = model
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                status, payload, headers = stub._respond(body, dict(self.headers))
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                data = json.dumps({"object": "list", "data": [{"id": stub.model, "object": "model"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def _respond(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any], dict[str, str]]:
        with self._lock:
            self.requests.append(Request(body, headers))
            if self.script:
                step = self.script.pop(0)
            elif self.fallback is not None:
                step = self.fallback
            else:
                step = HttpError(500, "the stub's script is exhausted")
        reply = step(body) if callable(step) else step
        if isinstance(reply, HttpError):
            return reply.status, {"error": {"message": reply.message, "type": "stub_error", "code": reply.status}}, \
                reply.headers
        prompt, completion = reply.get("usage", (100, 20))
        return 200, {
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [{"index": 0, "message": reply["message"], "finish_reason": reply["finish_reason"]}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }, {}

    def __enter__(self) -> StubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
