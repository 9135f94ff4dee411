"""Tool results shaped for a model's context: whole (recent results) or as one line (older ones).

Text inside results (captions, edits, prompts, error messages) was produced by models or echoes them, so it is
data: results are JSON, placed between ``<tool_result>`` markers, and every ``<`` inside is escaped so no caption
can close the block and speak as the user. Image refs are shortened to ``img:`` plus 12 hex digits; the planner
expands them back when the model passes one to a tool.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from sleuth.tools import investigation_tools

REF_RE = re.compile(r"^[0-9a-f]{64}$")
ALIAS_RE = re.compile(r"^(?:img:)?([0-9a-f]{8,64})$")
ALIAS_LEN = 12
MAX_LIST = 8
MAX_STRING = 400


def alias(ref: str) -> str:
    return f"img:{ref[:ALIAS_LEN]}"


def expand_refs(value: Any, known: list[str]) -> Any:
    """``value`` with every ``img:<prefix>`` (or bare hex prefix) that names exactly one known ref made whole."""
    if isinstance(value, dict):
        return {k: expand_refs(v, known) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_refs(v, known) for v in value]
    if isinstance(value, str):
        m = ALIAS_RE.match(value.strip())
        if m:
            hits = [r for r in known if r.startswith(m.group(1))]
            if len(hits) == 1:
                return hits[0]
    return value


def shape(value: Any, max_list: int = MAX_LIST) -> Any:
    """A smaller copy of a result: refs aliased, floats to 4 significant digits, long lists and strings cut."""
    if isinstance(value, dict):
        return {k: shape(v, max_list) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        out = [shape(v, max_list) for v in value[:max_list]]
        if len(value) > max_list:
            out.append(f"... {len(value) - max_list} more")
        return out
    if isinstance(value, float):
        return value if not math.isfinite(value) or value == 0 else float(f"{value:.4g}")
    if isinstance(value, str):
        if REF_RE.match(value):
            return alias(value)
        return value if len(value) <= MAX_STRING else value[: MAX_STRING - 1] + "…"
    return value


def data_json(value: Any) -> str:
    """Compact JSON with ``<`` escaped, so the text cannot open or close a marker."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=True)
    return text.replace("<", "\\u003c")


def block(name: str, body: str, *, ok: bool, summarised: bool = False) -> str:
    extra = ' summarised="true"' if summarised else ""
    return f'<tool_result name="{name}" ok="{str(ok).lower()}"{extra}>\n{body}\n</tool_result>'


def quote(text: str) -> str:
    """A model-produced string as a JSON string literal (quoted, escaped)."""
    return data_json(text)


# -- one-line summaries -------------------------------------------------------------------------------------


def summary_line(name: str, ok: bool, result: dict[str, Any] | None, error: str | None) -> str:
    """One line that keeps what later reasoning needs (ids, rates, verdicts), for results that aged out: the tool's
    own ``summary`` of its typed result, else a short generic form."""
    if not ok:
        text = error or "failed"
        return "error: " + quote(text if len(text) <= 300 else text[:299] + "…")
    reg = investigation_tools()
    typed = reg.result(name, result)
    summarise = reg.get(name).summary if name in reg else None
    if typed is not None and summarise is not None:
        return summarise(typed).replace("<", "\\u003c")
    text = data_json(shape(result or {}, max_list=3))
    return text if len(text) <= 300 else text[:299] + "…"


def full(name: str, result: dict[str, Any] | None, error: str | None, ok: bool) -> str:
    if not ok:
        return data_json({"error": error or "failed"})
    return data_json(shape(result or {}))
