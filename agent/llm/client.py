"""One way to talk to a language model: litellm's ``completion`` with retries, token and cost accounting, no leaks.

Rate limits, timeouts, dropped connections and server errors are retried with exponential backoff (the server's
``Retry-After`` is honoured, capped); a server that cannot be reached at all (connection refused, unknown host) and
other API errors (a bad key, an unknown model, a bad request) are not worth retrying and raise ``LLMError`` at once,
the unreachable one naming the URL. The API key is read from an environment variable, never from the command
line, and is registered with the redactor so neither transcripts nor log lines can carry it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from sleuth.agent.events import Usage
from sleuth.agent.redact import is_secret_key, mask_string, register_secret

log = logging.getLogger("sleuth.llm")

Completion = Callable[..., Any]
Sleep = Callable[[float], None]

# Loggers that litellm and the HTTP stack write to; each gets the masking filter.
_LIBRARY_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "openai", "httpx", "httpcore", "sleuth.llm")


class LLMError(Exception):
    """The model could not be reached or refused the request, after any retries."""


class ContextTooLong(LLMError):
    """The request did not fit the model's context window; the caller may shrink its messages and try again."""


OPENAI_COMPATIBLE = "openai/"
"""litellm's prefix for a model on an OpenAI-compatible server (what ``api_base`` names)."""


class LLMConfig(BaseModel):
    model: str = Field(description="Any litellm model string, e.g. 'gpt-4o-mini' or 'openai/qwen2.5' with api_base.")
    api_base: str | None = Field(None, description="Base URL of an OpenAI-compatible server (llama.cpp, vLLM, ...).")
    api_key_env: str | None = Field(None, description="Environment variable holding the API key; None: litellm's "
                                                      "provider default (OPENAI_API_KEY, ANTHROPIC_API_KEY, ...).")
    timeout_s: float = Field(120.0, gt=0, description="Seconds before one request times out.")
    retries: int = Field(4, ge=0, le=20, description="Retries of a rate-limited, timed-out or failed request.")
    backoff_s: float = Field(2.0, ge=0, description="First retry delay; it doubles on each retry.")
    max_backoff_s: float = Field(60.0, ge=0)
    timeout_retries: int = Field(1, ge=0, le=5, description=(
        "Retries of a timed-out request (at most this many; a request that timed out will mostly time out again at "
        "the same speed, so raise timeout_s instead)."))
    tool_choice: Literal["auto", "required"] | None = Field(None, description=(
        "Sent as the request's tool_choice: 'required' makes servers that support it (llama.cpp, vLLM, OpenAI) "
        "constrain every reply to a tool call (a forced-call mode for small local models); None: not sent."))
    call_format: Literal["tools", "json"] = Field("tools", description=(
        "'tools': tool schemas go in the request's tools and calls come back as tool_calls (or written in the text). "
        "'json': a forced-call mode for small local models: the tools are described in the system prompt and "
        "response_format makes the server's grammar constrain every reply to one JSON object {\"call\": {\"name\": "
        "..., \"arguments\": ...}, \"note\": ...}, the call first."))
    temperature: float | None = Field(0.0, description="None: the provider's default.")
    max_tokens: int | None = Field(2048, description="Most tokens per reply.")

    @model_validator(mode="before")
    @classmethod
    def _openai_compatible(cls, data: Any) -> Any:
        """A server named by ``api_base`` is spoken to as OpenAI-compatible: a bare model name gets litellm's
        ``openai/`` prefix (without it litellm cannot tell which provider to use and never reaches the server)."""
        if isinstance(data, dict) and data.get("api_base") and isinstance(data.get("model"), str) \
                and "/" not in data["model"]:
            data = {**data, "model": f"{OPENAI_COMPATIBLE}{data['model']}"}
        return data

    @field_validator("api_base")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL, got {url!r}")
        return url


class RawToolCall(BaseModel):
    id: str
    name: str
    arguments: str = Field(description="The arguments exactly as the model sent them (JSON text, maybe invalid).")


class LLMReply(BaseModel):
    content: str = ""
    tool_calls: list[RawToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float | None = None
    model: str = ""
    finish_reason: str | None = None
    attempts: int = Field(1, description="Requests sent, retries included.")
    latency_s: float = Field(0.0, description="Seconds from the first request to the reply, retries included.")


class _MaskFilter(logging.Filter):
    """Masks registered secrets and key-shaped strings in every record a library logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed record: leave it for logging's own error handling
            return True
        record.msg, record.args = mask_string(message), None
        return True


_FILTER = _MaskFilter()


def protect_logs() -> None:
    """Put the masking filter on the loggers litellm and its HTTP stack use (idempotent)."""
    for name in _LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


def register_environment_secrets(environ: Mapping[str, str] | None = None) -> None:
    """Register every environment value stored under a secret-looking name (OPENAI_API_KEY, HF_TOKEN, ...):
    litellm reads provider keys from the environment, so any of them may end up in an error message."""
    for name, value in (os.environ if environ is None else environ).items():
        if is_secret_key(name):
            register_secret(value)


def import_litellm() -> Any:
    """litellm, configured for sleuth. Its import takes seconds: commands may call this early, while models load."""
    # litellm fetches a cost map over the network at import unless told not to; sleuth works offline.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True  # otherwise it prints a help banner to stdout on every exception
    return litellm


def _usage(response: Any) -> Usage:
    u = getattr(response, "usage", None)
    return Usage(prompt_tokens=int(getattr(u, "prompt_tokens", 0) or 0),
                 completion_tokens=int(getattr(u, "completion_tokens", 0) or 0))


def _cost(response: Any) -> float | None:
    """litellm prices known models while answering; local and unknown models have no price (None, not 0)."""
    hidden = getattr(response, "_hidden_params", None) or {}
    cost = hidden.get("response_cost")
    return float(cost) if cost is not None else None


def _unreachable(error: BaseException) -> tuple[str, str | None] | None:
    """(why, URL) when ``error`` arose because no connection could be opened at all (refused, unknown host,
    unreachable network), else None. litellm reports a refused connection as a 500 "Connection error."; the cause
    chain holds the transport's own error and the URL it tried."""
    seen: set[int] = set()
    x: BaseException | None = error
    why: str | None = None
    url: str | None = None
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        if url is None and type(x).__module__.split(".")[0] == "httpx":
            with contextlib.suppress(AttributeError, RuntimeError):  # httpx raises RuntimeError when no request is set
                url = str(x.request.url)  # type: ignore[attr-defined]
        if isinstance(x, ConnectionRefusedError):
            why = "connection refused"
        elif isinstance(x, socket.gaierror):
            why = f"unknown host ({x})"
        elif why is None and type(x).__name__ == "ConnectError":  # httpx's and httpcore's: no connection opened
            why = str(x) or "no connection"
        x = x.__cause__ or x.__context__
    return (why, url) if why is not None else None


def _retry_after(error: Exception) -> float | None:
    headers = getattr(error, "litellm_response_headers", None) or {}
    value = headers.get("retry-after") if hasattr(headers, "get") else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date instead of seconds: fall back to our own backoff


class LLMClient:
    """Sends chat requests through litellm. ``completion`` and ``sleep`` are injectable so tests run fast."""

    def __init__(self, config: LLMConfig, *, completion: Completion | None = None, sleep: Sleep = time.sleep,
                 environ: dict[str, str] | None = None) -> None:
        self.config = config
        self._environ = os.environ if environ is None else environ
        self._completion = completion
        self._sleep = sleep
        self._litellm: Any = None
        self.total = Usage()
        self.total_cost_usd: float | None = None
        protect_logs()
        register_environment_secrets(self._environ)
        register_secret(self.api_key)

    @property
    def api_key(self) -> str | None:
        if self.config.api_key_env is not None:
            return self._environ.get(self.config.api_key_env)
        if self.config.api_base and self.config.model.startswith("openai/"):
            # A local OpenAI-compatible server usually wants no key, but the OpenAI client refuses to send a
            # request without one: use the user's OpenAI key if set, else a placeholder the server ignores.
            return self._environ.get("OPENAI_API_KEY") or "no-key"
        return None

    def _lib(self) -> Any:
        if self._litellm is None:
            self._litellm = import_litellm()
        return self._litellm

    def _send(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
              tool_choice: str | None = None, response_format: dict[str, Any] | None = None) -> Any:
        kwargs: dict[str, Any] = {"model": self.config.model, "messages": messages, "timeout": self.config.timeout_s,
                                  "max_retries": 0}  # retries are ours: one policy, one count
        if tools:
            kwargs["tools"] = tools
            if tool_choice:
                kwargs["tool_choice"] = tool_choice
        if response_format is not None:
            kwargs["response_format"] = response_format
        if self.config.api_base:
            kwargs["api_base"] = self.config.api_base
        if self.api_key:
            kwargs["api_key"] = self.api_key
        if self.config.temperature is not None:
            kwargs["temperature"] = self.config.temperature
        if self.config.max_tokens is not None:
            kwargs["max_tokens"] = self.config.max_tokens
        if self._completion is not None:
            return self._completion(**kwargs)
        return self._lib().completion(**kwargs)

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
                 tool_choice: str | None = None, response_format: dict[str, Any] | None = None) -> LLMReply:
        """One reply, retried on transient failures; raises ``ContextTooLong`` or ``LLMError``. ``tool_choice``
        overrides the config's for this request ('' sends none)."""
        lib = self._lib()
        from openai import APIError  # the base of litellm's errors; imported with litellm already

        retryable = (lib.RateLimitError, lib.Timeout, lib.APIConnectionError, lib.InternalServerError,
                     lib.ServiceUnavailableError, lib.BadGatewayError)
        choice = self.config.tool_choice if tool_choice is None else tool_choice
        attempt = 0
        timeouts = 0
        t0 = time.perf_counter()
        while True:
            attempt += 1
            try:
                response = self._send(messages, tools, choice or None, response_format)
                break
            except lib.ContextWindowExceededError as e:
                raise ContextTooLong(mask_string(f"the request is too long for {self.config.model}: {e}")) from None
            except lib.Timeout as e:
                # The same request at the same speed mostly times out again: retry it once, then say what to change.
                timeouts += 1
                if timeouts > self.config.timeout_retries or attempt > self.config.retries:
                    raise LLMError(mask_string(
                        f"{self.config.model} timed out {timeouts} times after {self.config.timeout_s:g} s: raise "
                        "--llm-timeout (a CPU server needs minutes for a long prompt) or lower the reply's token "
                        f"cap; last: {type(e).__name__}: {e}")) from None
                log.warning("%s: timed out after %g s; retrying once", self.config.model, self.config.timeout_s)
            except retryable as e:
                unreachable = _unreachable(e)
                if unreachable is not None:  # nobody listens there: retrying with backoff only delays the news
                    why, tried = unreachable
                    where = self.config.api_base or tried or f"the server of {self.config.model}"
                    hint = "; is the server running, and is --api-base right?" if self.config.api_base else ""
                    raise LLMError(mask_string(f"cannot reach {where} ({self.config.model}): {why}{hint}")) from None
                if attempt > self.config.retries:
                    raise LLMError(mask_string(f"{self.config.model} failed {attempt} times; last: "
                                               f"{type(e).__name__}: {e}")) from None
                delay = min(self.config.max_backoff_s, self.config.backoff_s * 2 ** (attempt - 1))
                hinted = _retry_after(e)
                if hinted is not None:
                    delay = min(self.config.max_backoff_s, max(delay, hinted))
                log.warning("%s: %s; retry %d of %d in %.1f s", self.config.model, type(e).__name__, attempt,
                            self.config.retries, delay)
                self._sleep(delay)
            except APIError as e:  # bad key, unknown model, bad request: retrying cannot help
                raise LLMError(mask_string(f"{self.config.model}: {type(e).__name__}: {e}")) from None
        reply = self._reply(response, attempt)
        reply.latency_s = round(time.perf_counter() - t0, 3)
        return reply

    def _reply(self, response: Any, attempts: int) -> LLMReply:
        choices = getattr(response, "choices", None) or []
        message = choices[0].message if choices else None
        calls: list[RawToolCall] = []
        for tc in getattr(message, "tool_calls", None) or []:
            fn = getattr(tc, "function", None)
            calls.append(RawToolCall(id=str(getattr(tc, "id", None) or ""), name=str(getattr(fn, "name", "") or ""),
                                     arguments=str(getattr(fn, "arguments", "") or "")))
        usage = _usage(response)
        cost = _cost(response)
        self.total = Usage(prompt_tokens=self.total.prompt_tokens + usage.prompt_tokens,
                           completion_tokens=self.total.completion_tokens + usage.completion_tokens)
        if cost is not None:
            self.total_cost_usd = (self.total_cost_usd or 0.0) + cost
        return LLMReply(content=str(getattr(message, "content", None) or ""), tool_calls=calls, usage=usage,
                        cost_usd=cost, model=str(getattr(response, "model", "") or self.config.model),
                        finish_reason=choices[0].finish_reason if choices else None, attempts=attempts)

    def text(self, prompt: str) -> str:
        """A plain completion of one user prompt (used by tools that ask the LLM for text, e.g. perturbations)."""
        return self.complete([{"role": "user", "content": prompt}]).content
