"""Reaching language models through litellm: the client (retries, costs, secrets), the context a planner sends,
and the one-line summaries that keep long runs within a model's context window."""

from __future__ import annotations

from collections.abc import Callable

from sleuth.agent.llm.client import ContextTooLong, LLMClient, LLMConfig, LLMError, LLMReply, RawToolCall
from sleuth.tools.registry import ToolError

__all__ = ["ContextTooLong", "LLMClient", "LLMConfig", "LLMError", "LLMReply", "RawToolCall", "tool_llm"]


def tool_llm(client: LLMClient) -> Callable[[str], str]:
    """The ``ctx.llm`` callable tools use for text (e.g. caption perturbations): a failed request becomes a tool
    error the planner reads, not a crash."""

    def ask(prompt: str) -> str:
        try:
            return client.text(prompt)
        except LLMError as e:
            raise ToolError(f"the LLM did not answer: {e}") from None

    return ask
