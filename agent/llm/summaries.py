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
from collections.abc import Callable
from typing import Any

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


def _num(x: Any) -> str:
    if x is None:
        return "inf"
    try:
        return f"{float(x):.3g}"
    except (TypeError, ValueError):
        return str(x)


def rate(r: dict[str, Any] | None) -> str:
    if not r:
        return "n/a"
    return f"{r['k']}/{r['n']} [{100 * r['low']:.1f}%, {100 * r['high']:.1f}%]"


def ratio(r: dict[str, Any] | None) -> str:
    if not r:
        return "n/a"
    return f"{_num(r['ratio'])}x [{_num(r['low'])}, {_num(r['high'])}]"


def _generate(r: dict[str, Any]) -> str:
    s = r["summary"]
    conf = ", ".join(f"{c['label']} ({c['count']})" for c in s.get("confusions", [])[:3]) or "none"
    return f"{r['measurement_id']}: prompt {quote(s['prompt'])} failures {rate(s['failures'])}; confusions: {conf}"


def _caption(r: dict[str, Any]) -> str:
    hyps = "; ".join(f"{quote(h['caption'])} ({h['n_images']} images, predicted {h['predicted_label']})"
                     for h in r.get("hypotheses", [])[:5])
    return f"{r['measurement_id']}: {r['n_failures']} failures captioned; hypotheses: {hyps or 'none'}"


def _perturb(r: dict[str, Any]) -> str:
    edits = [quote(e["caption"]) for e in (r.get("edits", []) + r.get("refinements", []))[:6]]
    total = len(r.get("edits", [])) + len(r.get("refinements", []))
    return f"{total} rewrites of {quote(r['caption'])}: {'; '.join(edits) or 'none'}"


def _measure(r: dict[str, Any]) -> str:
    hyp = (r.get("hypothesis") or {}).get("failures")
    mode = ", counterfactual" if r.get("mode") == "counterfactual" else ""
    mc = r.get("mcnemar")
    paired = f", McNemar b={mc['b']} c={mc['c']}" if mc else ""
    return (f"{r['test_id']} ({r['purpose']}{mode}) {quote(r['caption'])}: {rate(hyp) if hyp else 'edits'} vs baseline "
            f"{rate(r['baseline'])}, ratio {ratio(r.get('rate_ratio'))}, p={_num(r['p_value'])}, "
            f"adjusted p={_num(r['adjusted_p'])}{paired}, {r['verdict']}")


def _edit(r: dict[str, Any]) -> str:
    mc = r.get("mcnemar")
    return (f"{len(r.get('edits', []))} images edited: {r['to_failure']} became failures, {r['to_correct']} became "
            f"correct" + (f", McNemar p={_num(mc['p_value'])}" if mc else ""))


def _finding(r: dict[str, Any]) -> str:
    return f"finding {r['finding_id']} recorded: {quote(r['caption'])}"


def _finish(r: dict[str, Any]) -> str:
    return f"finished: {quote(r.get('summary', ''))}"


SUMMARISERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "generate_and_classify": _generate,
    "caption_failures": _caption,
    "perturb_caption": _perturb,
    "measure_rate": _measure,
    "edit_image": _edit,
    "record_finding": _finding,
    "finish": _finish,
}


def summary_line(name: str, ok: bool, result: dict[str, Any] | None, error: str | None) -> str:
    """One line that keeps what later reasoning needs (ids, rates, verdicts), for results that aged out."""
    if not ok:
        text = error or "failed"
        return "error: " + quote(text if len(text) <= 300 else text[:299] + "…")
    fn = SUMMARISERS.get(name)
    if fn is not None and result is not None:
        try:
            return fn(result).replace("<", "\\u003c")
        except (KeyError, TypeError, ValueError, IndexError):
            pass  # an unfamiliar result shape: fall through to the generic form
    text = data_json(shape(result or {}, max_list=3))
    return text if len(text) <= 300 else text[:299] + "…"


def full(name: str, result: dict[str, Any] | None, error: str | None, ok: bool) -> str:
    if not ok:
        return data_json({"error": error or "failed"})
    return data_json(shape(result or {}))
