"""How many tokens a chat request's prompt will take: its messages *and* its tool schemas.

Four characters a token undercounts sleuth's prompts badly: JSON results are dense in punctuation, digits (several
tokenizers, Qwen's among them, give every digit its own token) and hex image refs, and the tool schemas, which the chat
template writes into the prompt, are about 1,500 tokens before any message. So text is counted the way BPE tokenizers
split it before merging (words, single digits, runs of punctuation, whitespace), each piece priced by its length, plus
what the chat template adds around every message, tool call and the tool list. The prices were fitted to the token
counts of Qwen2.5's tokenizer as served by llama.cpp for real sleuth requests (docs/llm.md has the calibration);
other modern tokenizers (GPT-4o's, Llama 3's) group digits and split no finer, so for them the estimate errs high, which
is the safe side for a context budget.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# One piece per match, as a GPT-4 / Qwen2-style pre-tokenizer splits text (without the \p{L} classes ``re`` lacks).
_PIECES = re.compile(
    r"'(?:s|t|re|ve|m|ll|d)\b"                      # contractions
    r"|[^\r\n\w]?[^\W\d_]+"                         # a word, with one leading space or symbol
    r"|\d"                                          # every digit alone
    r"| ?[^\s\w]+[\r\n]*"                           # a run of punctuation
    r"|\s*[\r\n]+"                                  # line breaks
    r"|\s+(?!\S)|\s+"                               # other whitespace
    r"|_+",
    re.UNICODE,
)


@dataclass(frozen=True)
class TokenCosts:
    """Prices of the pieces of text and of the chat template's scaffolding (fitted to Qwen2.5; see the module doc)."""

    word_letters: int = 8
    """A word of up to this many letters is one token (with its leading space)..."""
    word_chars: float = 3.0
    """...and longer ones, rarer and so split more, cost one more token per this many further letters."""
    punct_chars: float = 3.0
    """A run of punctuation costs one token per this many characters, at least one."""
    per_message: int = 5
    """``<|im_start|>role\\n ... <|im_end|>\\n`` and the like."""
    per_tool_call: int = 12
    """The wrapper of one call in an assistant message (``<tool_call>``, name and arguments keys)."""
    per_tool_result: int = 6
    """The wrapper of one tool message (``<tool_response>`` tags; some templates add a user turn)."""
    tools_preamble: int = 75
    """The template's instructions around the tool list ('You may call one or more functions...')."""
    per_tool: int = 1
    image: int = 255
    """One small image in a vision model's context (OpenAI's low-detail price)."""
    margin: float = 1.0
    """A factor on the total, for head-room. None is needed for sleuth's requests: word prices were chosen so that
    rare words and names are not undercounted, which puts sleuth's own prompts 4-7% above the true count."""


QWEN = TokenCosts()


def text_tokens(text: str, costs: TokenCosts = QWEN) -> int:
    """Tokens of plain text."""
    n = 0
    for m in _PIECES.finditer(text):
        piece = m.group(0)
        c = piece[-1]
        if c.isalpha():
            letters = len(piece) - (0 if piece[0].isalpha() else 1)
            n += 1 + max(0, math.ceil((letters - costs.word_letters) / costs.word_chars))
        elif c.isdigit() or c.isspace() or c == "'":
            n += 1
        else:
            ascii_part = sum(1 for ch in piece.strip() if ord(ch) < 128)
            # Byte-level BPE rarely merges symbols outside ASCII (×, –, ≤): about a token each.
            n += max(1, math.ceil(ascii_part / costs.punct_chars) + len(piece.strip()) - ascii_part)
    return n


def _content_tokens(content: Any, costs: TokenCosts) -> int:
    if isinstance(content, str):
        return text_tokens(content, costs)
    n = 0
    for part in content or []:
        if isinstance(part, Mapping) and part.get("type") == "text":
            n += text_tokens(str(part.get("text", "")), costs)
        else:
            n += costs.image
    return n


def tool_schema_tokens(tools: Sequence[Mapping[str, Any]] | None, costs: TokenCosts = QWEN) -> int:
    """What the tool list adds to a prompt: templates write each schema as JSON, with instructions around them."""
    if not tools:
        return 0
    body = sum(text_tokens(json.dumps(t, ensure_ascii=False), costs) + costs.per_tool for t in tools)
    return costs.tools_preamble + body


def message_tokens(message: Mapping[str, Any], costs: TokenCosts = QWEN) -> int:
    """One chat message with its scaffolding."""
    n = costs.per_message + _content_tokens(message.get("content"), costs)
    if message.get("role") == "tool":
        n += costs.per_tool_result
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        n += costs.per_tool_call + text_tokens(str(fn.get("name", "")), costs)
        n += text_tokens(str(fn.get("arguments", "")), costs)
    return n


def estimate_prompt_tokens(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                           costs: TokenCosts = QWEN) -> int:
    """The prompt tokens a server will count for this request (messages, tool calls, tool schemas), rounded up."""
    n = sum(message_tokens(m, costs) for m in messages) + tool_schema_tokens(tools, costs)
    n += costs.per_message  # the generation prompt: "<|im_start|>assistant\n"
    return math.ceil(n * costs.margin)
