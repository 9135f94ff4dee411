"""Reaching language models through litellm: the client (retries, costs, secrets), the context a planner sends,
and the one-line summaries that keep long runs within a model's context window."""

from __future__ import annotations

from collections.abc import Callable

from sleuth.agent.llm.client import ContextTooLong, LLMClient, LLMConfig, LLMError, LLMReply, RawToolCall
from sleuth.tools.registry import ToolError

__all__ = ["ContextTooLong", "LLMClient", "LLMConfig", "LLMError", "LLMReply", "RawToolCall", "ToolLLM", "tool_llm"]


class ToolLLM:
    """The ``ctx.llm`` callable tools use for text (e.g. caption perturbations): a failed request becomes a tool
    error the planner reads, not a crash. It meters what it spends, so the loop can charge each tool call's tokens
    and cost to its ``tool_returned`` event (and an audit's cost limit counts them)."""

    def __init__(self, client: LLMClient) -> None:
        self.client = client
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cost_usd = 0.0

    def __call__(self, prompt: str) -> str:
        try:
            reply = self.client.complete([{"role": "user", "content": prompt}])
        except LLMError as e:
            raise ToolError(f"the LLM did not answer: {e}") from None
        self.prompt_tokens += reply.usage.prompt_tokens
        self.completion_tokens += reply.usage.completion_tokens
        self.cost_usd += reply.cost_usd or 0.0
        return reply.content

    def spent(self) -> tuple[int, int, float]:
        return self.prompt_tokens, self.completion_tokens, self.cost_usd


def tool_llm(client: LLMClient) -> Callable[[str], str]:
    return ToolLLM(client)
