"""Tool calls written in a model's text, and tool results it made up.

Servers parse tool calls only in the format of the model's chat template, and small models often write them some other
way: a fenced ```json block, ``<tool_call>`` tags left unclosed when the reply ran out of tokens, a bare
``{"name": ..., "arguments": ...}`` object in the middle of prose, OpenAI's ``{"function": {...}}`` shape, or
``"parameters"`` instead of ``"arguments"``. ``extract_tool_calls`` finds them all, in order, and keeps those naming a
known tool.

Having written a call, such models often go on to write its result themselves (a ``<tool_response>`` block, a JSON
object with a ``test_id`` and a ``verdict``, a "Result:" line) and then reason, and call again, on numbers nobody
measured. Everything from the first invented result to the end of the reply is cut: the calls before it stand, the calls
after it are dropped (they rest on the made-up result), and the caller is told so, to ask the model to call the tool
and not to write its result.

Pure text in, data out: no I/O, nothing of the planner.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

Source = Literal["tag", "fence", "bare"]

RESULT_KEYS = frozenset({
    # Keys of sleuth's tool results that no tool's arguments have (tests keep this in step with the registry).
    "test_id", "verdict", "p_value", "adjusted_p", "rate_ratio", "family_size", "adjust_method", "looks", "baseline",
    "finding_id", "confirmed", "n_findings", "hypotheses", "n_failures", "failure_images", "success_images",
    "mcnemar", "to_failure", "to_correct", "edits", "rejected",
    # How made-up results are commonly wrapped.
    "result", "results", "output", "observation", "tool_result", "tool_response",
})
"""Top-level keys that make a JSON object in a reply a tool result rather than a call."""

NAME_KEYS = ("name", "function", "tool_name")
ARG_KEYS = ("arguments", "parameters", "args", "input")

_TAG = re.compile(r"<(tool_call|function_call|tools)>(.*?)(?:</\1>|(?=<(?:tool_call|function_call)>)|\Z)", re.DOTALL)
_FUNCTION_TAG = re.compile(r"<function=([\w.\-]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
_FENCE = re.compile(r"```[ \t]*([\w+\-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_RESULT_TAG = re.compile(r"<\|im_start\|>|<\|start_header_id\|>|</?(?:tool_result|tool_response|tool_output|"
                         r"function_result|observation)\b", re.IGNORECASE)
_RESULT_FENCE = frozenset({"output", "result", "results", "response", "observation", "tool_result", "tool_response"})
_RESULT_LINE = re.compile(r"^[ \t>*_#-]*(?:tool[ _]+)?(?:result|results|output|observation|response|returns?|"
                          r"returned)[ \t*_]*:", re.IGNORECASE | re.MULTILINE)
_NAME_IN_RAW = re.compile(r'"(?:name|function)"\s*:\s*"([^"]+)"')
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class TextCall:
    """A tool call found in text."""

    name: str
    arguments: str
    """The arguments as a JSON object's text, or the raw text when it is not valid JSON (the caller reports that)."""
    source: Source
    valid: bool = True
    """False when the arguments could not be read as a JSON object."""


@dataclass(frozen=True)
class Extracted:
    calls: list[TextCall]
    """Calls naming a known tool, in the order written, up to the first invented result."""
    text: str
    """The reasoning: the reply without its calls and without anything from the first invented result on."""
    invented_result: str = ""
    """The text that was cut because it imitates a tool result ('' when none was)."""
    dropped_calls: list[TextCall] = field(default_factory=list)
    """Calls written after the invented result: they rest on it, so they are not run."""
    unknown: list[TextCall] = field(default_factory=list)
    """Call-shaped objects naming no known tool (the caller may pass them on for a 'did you mean' error)."""

    @property
    def stripped(self) -> list[str]:
        """What was removed, for the transcript and the nudge: ``invented_result``, ``calls_after_invented_result``."""
        out = ["invented_result"] if self.invented_result else []
        return out + (["calls_after_invented_result"] if self.dropped_calls else [])


@dataclass
class _Piece:
    start: int
    end: int
    calls: list[TextCall] = field(default_factory=list)
    unknown: list[TextCall] = field(default_factory=list)
    invented: bool = False
    remove: bool = True


def _decode_all(body: str) -> Iterator[tuple[int, int, Any]]:
    """Every JSON value that starts with '{' or '[' in ``body``, outermost first, as (start, end, value)."""
    i = 0
    while i < len(body):
        if body[i] in "{[":
            try:
                value, end = _DECODER.raw_decode(body, i)
            except json.JSONDecodeError:
                i += 1
                continue
            yield i, end, value
            i = end
        else:
            i += 1


def _lenient(raw: str) -> Any:
    """JSON, or failing that a Python-style literal (single quotes, True/None), which small models often write."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        pass
    try:
        fixed = re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", re.sub(r"\bnull\b", "None", raw)))
        return ast.literal_eval(fixed)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def _normalise(name: str, tools: Collection[str]) -> tuple[str, bool]:
    clean = name.strip().removeprefix("functions.").strip()
    if clean in tools:
        return clean, True
    lower = clean.lower()
    return (lower, True) if lower in tools else (clean, False)


def _as_call(obj: Any, tools: Collection[str], source: Source) -> tuple[TextCall | None, bool]:
    """(the call ``obj`` describes, whether it also carries a made-up result); (None, False) if it is no call."""
    if not isinstance(obj, dict):
        return None, False
    for wrapper in ("function", "call", "tool_call"):  # OpenAI's {"type": "function", "function": {...}}, or
        if isinstance(obj.get(wrapper), dict):       # {"call": {...}, "reasoning": ...} from a JSON-schema reply
            inner, _ = _as_call(obj[wrapper], tools, source)
            return inner, any(k in RESULT_KEYS for k in obj)
    name = next((obj[k] for k in NAME_KEYS if isinstance(obj.get(k), str)), None)
    if name is None:
        return None, False
    name, known = _normalise(name, tools)
    arg_key = next((k for k in ARG_KEYS if k in obj), None)
    if arg_key is None and not known:
        return None, False  # {"name": "..."} alone is ordinary data unless it names a tool
    args: Any = obj.get(arg_key, {}) if arg_key else {}
    if isinstance(args, dict) and args.get("type") == "object" and "properties" in args:
        return None, False  # a tool's schema echoed back, not a call
    valid = True
    if isinstance(args, str):  # arguments sent as a JSON string, as the OpenAI wire format has them
        decoded = _lenient(args) if args.strip() else {}
        args, valid = (decoded, True) if isinstance(decoded, dict) else (args, False)
    elif args is None:
        args = {}
    elif not isinstance(args, dict):
        args, valid = json.dumps(args), False
    text = json.dumps(args, ensure_ascii=False) if valid else str(args)
    return TextCall(name=name, arguments=text, source=source, valid=valid), any(k in RESULT_KEYS for k in obj)


def _is_result(obj: Any) -> bool:
    return isinstance(obj, dict) and any(k in RESULT_KEYS for k in obj)


def _scan_json(body: str, offset: int, tools: Collection[str], source: Source) -> list[_Piece]:
    """Calls and invented results among the JSON values of ``body`` (which starts at ``offset`` of the reply)."""
    pieces: list[_Piece] = []
    for start, end, value in _decode_all(body):
        piece = _Piece(offset + start, offset + end)
        for obj in value if isinstance(value, list) else [value]:
            call, with_result = _as_call(obj, tools, source)
            if call is None:
                piece.invented = piece.invented or _is_result(obj)
                continue
            (piece.calls if call.name in tools else piece.unknown).append(call)
            piece.invented = piece.invented or with_result
        if piece.calls or piece.unknown or piece.invented:
            pieces.append(piece)
    return pieces


def _tag_piece(match: re.Match[str], body: str, tools: Collection[str]) -> _Piece:
    """A ``<tool_call>`` block: its JSON objects, or one unreadable call when the JSON is cut off or malformed."""
    piece = _Piece(match.start(), match.end())
    for inner in _scan_json(body, 0, tools, "tag"):
        piece.calls += inner.calls
        piece.unknown += inner.unknown
        piece.invented = piece.invented or inner.invented
    if not (piece.calls or piece.unknown) and body.strip():
        piece.calls = [TextCall(c.name, c.arguments, "tag") for c in _python_calls(body, tools)]
    if not (piece.calls or piece.unknown) and body.strip():
        value = _lenient(body.strip())
        call, _ = _as_call(value, tools, "tag") if value is not None else (None, False)
        if call is None:
            named = _NAME_IN_RAW.search(body)
            if named:  # cut off by the token limit, or not JSON: pass it on so the model reads why it failed
                name, _ = _normalise(named.group(1), tools)
                call = TextCall(name=name, arguments=body.strip(), source="tag", valid=False)
        if call is not None:
            (piece.calls if call.name in tools else piece.unknown).append(call)
    return piece


def _function_tag_piece(match: re.Match[str], tools: Collection[str]) -> _Piece:
    name, known = _normalise(match.group(1), tools)
    body = match.group(2).strip()
    value = _lenient(body) if body else {}
    valid = isinstance(value, dict)
    call = TextCall(name=name, arguments=json.dumps(value) if valid else body, source="tag", valid=valid)
    return _Piece(match.start(), match.end(), calls=[call] if known else [], unknown=[] if known else [call])


def _fence_piece(match: re.Match[str], tools: Collection[str]) -> _Piece | None:
    """A fenced block holding calls (JSON, or Python calls of known tools) or a made-up result; None if neither."""
    start, end = match.span()
    lang = match.group(1).lower()
    if lang in _RESULT_FENCE:
        return _Piece(start, end, invented=True)
    found = _scan_json(match.group(2), match.start(2), tools, "fence")
    calls = [c for p in found for c in p.calls]
    unknown = [c for p in found for c in p.unknown]
    invented = any(p.invented for p in found)
    if not (calls or unknown or invented) and lang in ("", "python", "py", "tool_code"):
        calls = _python_calls(match.group(2), tools)
    if not (calls or unknown or invented):
        return None
    # The whole block leaves the reasoning; a result inside it still ends what is read.
    return _Piece(start, end, calls=calls, unknown=unknown, invented=invented)


def _python_calls(code: str, tools: Collection[str]) -> list[TextCall]:
    """``measure_rate(caption="...", max_n=200)`` lines, as code models write them; [] unless every statement is a
    call of a known tool with literal keyword arguments (an assignment of one, or a ``print``, is allowed)."""
    try:
        tree = ast.parse(code.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    calls: list[TextCall] = []
    for stmt in tree.body:
        value = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
        if not isinstance(value, ast.Call):
            return []
        func = value.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name == "print":
            continue
        if name not in tools or value.args or any(k.arg is None for k in value.keywords):
            return []
        try:
            kwargs = {str(k.arg): ast.literal_eval(k.value) for k in value.keywords}
        except (ValueError, SyntaxError, TypeError, RecursionError):
            return []
        calls.append(TextCall(name=name, arguments=json.dumps(kwargs, ensure_ascii=False), source="fence"))
    return calls


def _overlaps(spans: list[tuple[int, int]], start: int, end: int) -> bool:
    return any(start < e and s < end for s, e in spans)


def extract_tool_calls(text: str, tools: Collection[str]) -> Extracted:
    """The tool calls written in ``text`` and what is left of it as reasoning.

    ``tools`` are the known tool names. Calls are taken from ``<tool_call>`` tags (closed or not), ``<function=NAME>``
    tags, fenced code blocks and bare JSON objects, in the order written; several calls may share one reply or one
    JSON array. An invented tool result (a result tag, a JSON object with result keys such as ``test_id`` or
    ``verdict``, an ``output`` code block, or a "Result:" line after a call) ends what is read.
    """
    pieces: list[_Piece] = []
    taken: list[tuple[int, int]] = []
    for m in _TAG.finditer(text):
        pieces.append(_tag_piece(m, m.group(2), tools))
        taken.append(m.span())
    for m in _FUNCTION_TAG.finditer(text):
        if not _overlaps(taken, *m.span()):
            pieces.append(_function_tag_piece(m, tools))
            taken.append(m.span())
    for m in _FENCE.finditer(text):
        if not _overlaps(taken, *m.span()):
            piece = _fence_piece(m, tools)
            if piece is not None:
                pieces.append(piece)
                taken.append(m.span())
    gaps = _gaps(text, taken)
    for start, end in gaps:
        pieces += _scan_json(text[start:end], start, tools, "bare")
    for m in _RESULT_TAG.finditer(text):
        if not _overlaps(taken, m.start(), m.end()):
            pieces.append(_Piece(m.start(), m.start(), invented=True, remove=False))
    pieces.sort(key=lambda p: p.start)
    first_call = min((p.start for p in pieces if p.calls or p.unknown), default=None)
    if first_call is not None:  # "Result:" lines are only suspicious once a call has been written
        for m in _RESULT_LINE.finditer(text, first_call):
            if not _overlaps(taken, m.start(), m.end()):
                pieces.append(_Piece(m.start(), m.start(), invented=True, remove=False))
        pieces.sort(key=lambda p: p.start)
    return _assemble(text, pieces)


def _gaps(text: str, taken: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, pos = [], 0
    for s, e in sorted(taken):
        if s > pos:
            out.append((pos, s))
        pos = max(pos, e)
    if pos < len(text):
        out.append((pos, len(text)))
    return out


def _assemble(text: str, pieces: list[_Piece]) -> Extracted:
    calls: list[TextCall] = []
    unknown: list[TextCall] = []
    cut: int | None = None
    for p in pieces:
        if cut is not None:
            break
        calls += p.calls
        unknown += p.unknown
        if p.invented:
            # A call that carries its own result keeps its call; what follows the call is cut.
            cut = p.end if (p.calls or p.unknown) else p.start
    dropped = [c for p in pieces if cut is not None and p.start >= cut for c in p.calls]
    kept: list[str] = []
    pos = 0
    limit = len(text) if cut is None else cut
    for p in pieces:
        if p.start >= limit:
            break
        if p.remove and (p.calls or p.unknown or p.invented):
            kept.append(text[pos:p.start])
            pos = max(pos, p.end)
    kept.append(text[pos:limit])
    reasoning = re.sub(r"\n{3,}", "\n\n", "".join(kept)).strip()
    invented = text[cut:].strip() if cut is not None else ""
    if cut is not None and not invented:
        invented = next((text[p.start:p.end] for p in pieces if p.invented), "")
    return Extracted(calls=calls, text=reasoning, invented_result=invented, dropped_calls=dropped, unknown=unknown)
