"""Keep secrets out of transcripts: mask values under secret-looking keys and strings that look like API keys.

Key rule (case-insensitive; a key is split into words at ``_``, ``-``, ``.``, spaces and camelCase humps):

- any word is one of ``secret``, ``password``, ``passwd``, ``passphrase``, ``credential(s)``, ``authorization``,
  ``apikey``, ``cookie`` -> secret (``client_secret``, ``db_password``, ``x-authorization``);
- the last word is ``auth``, ``bearer`` or ``token`` (singular) -> secret (``auth``, ``hf_token``, ``accessToken``);
  plural ``tokens`` counts tokens and is kept (``n_tokens``, ``prompt_tokens``, ``max_tokens``);
- the last word is ``key`` and at least one word precedes it -> secret (``api_key``, ``openai_key``, ``apiKey``);
  a key that merely starts with ``key`` (``key_attribute``) or contains a ``k`` (``top_k``) is kept.

``None`` and empty strings under a secret key are kept: they reveal nothing and show that no secret was set.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted]"

_ANYWHERE = frozenset({"secret", "password", "passwd", "passphrase", "credential", "credentials", "authorization",
                       "apikey", "cookie"})
_LAST = frozenset({"auth", "bearer", "token"})

_WORD_SPLIT = re.compile(r"[_\-.\s]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")

# Known key formats. The lookbehind keeps e.g. "task-..." from matching "sk-...".
_KEY_PATTERNS = [
    r"sk-(?:ant-|proj-|or-)?[A-Za-z0-9_\-]{20,}",  # OpenAI, Anthropic, OpenRouter
    r"xai-[A-Za-z0-9_\-]{20,}",
    r"hf_[A-Za-z0-9]{20,}",
    r"gh[pousr]_[A-Za-z0-9]{20,}",
    r"github_pat_[A-Za-z0-9_]{20,}",
    r"(?:AKIA|ASIA)[0-9A-Z]{16}",
    r"AIza[0-9A-Za-z_\-]{35}",
    r"gsk_[A-Za-z0-9]{20,}",
    r"r8_[A-Za-z0-9]{20,}",
    r"xox[abprs]-[A-Za-z0-9\-]{10,}",
]
_KEY_RE = re.compile(r"(?<![A-Za-z0-9_\-])(?:" + "|".join(_KEY_PATTERNS) + r")")
# A bearer token has a digit or is long; this spares prose such as "the bearer of bad news".
_BEARER_RE = re.compile(r"\b([Bb]earer)\s+(?:(?=\S*\d)[A-Za-z0-9._~+/=\-]{8,}|[A-Za-z0-9._~+/=\-]{20,})")

# "api_key=...", "password: ..." inside free text such as error messages and tracebacks.
_ASSIGN_RE = re.compile(r"\b(api[_\-]?key|access[_\-]?token|token|secret|password|passwd)"
                        r"([\"']?\s*[:=]\s*[\"']?)([^\s\"',;&]{6,})", re.IGNORECASE)

MIN_SECRET_LENGTH = 6
"""Registered values shorter than this are ignored: masking every occurrence of a short string garbles text."""

_registered: set[str] = set()


def register_secret(value: str | None) -> None:
    """Mask ``value`` wherever it appears in anything redacted from now on (e.g. the configured API key)."""
    if value and len(value) >= MIN_SECRET_LENGTH:
        _registered.add(value)


def clear_secrets() -> None:
    """Forget every registered value."""
    _registered.clear()


def key_words(key: str) -> list[str]:
    return [w.lower() for w in _WORD_SPLIT.split(_CAMEL.sub("_", key)) if w]


def is_secret_key(key: str) -> bool:
    words = key_words(key)
    if not words:
        return False
    if any(w in _ANYWHERE for w in words):
        return True
    if words[-1] in _LAST:
        return True
    return words[-1] == "key" and len(words) > 1


def mask_string(text: str) -> str:
    """``text`` with registered secrets and strings in known API-key formats replaced by ``[redacted]``."""
    # Longest first, so a registered value that contains another is masked whole.
    for secret in sorted(_registered, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    text = _BEARER_RE.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _ASSIGN_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    return _KEY_RE.sub(REDACTED, text)


def redact(obj: Any) -> Any:
    """A deep copy of a JSON-like value with secrets masked (see the module docstring for the rule)."""
    if isinstance(obj, dict):
        out: dict[Any, Any] = {}
        for k, v in obj.items():
            if isinstance(k, str) and is_secret_key(k) and v is not None and v != "":
                out[k] = REDACTED
            else:
                out[k] = redact(v)
        return out
    if isinstance(obj, (list, tuple)):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return mask_string(obj)
    return obj
