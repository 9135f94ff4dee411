"""Terminal rendering of transcript events, shared by `sleuth replay` and the live terminal.

``render_event`` turns one event into a rich renderable (or ``None`` when there is nothing to show). Tool results
go through ``FORMATTERS`` by tool name; tools without one get a compact key/value summary.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from sleuth.agent.events import (
    ErrorEvent,
    Event,
    Finding,
    PlannerTurn,
    RunFinished,
    RunStarted,
    ToolCalled,
    ToolReturned,
    UserMessage,
)

Formatter = Callable[[dict[str, Any]], RenderableType]

FORMATTERS: dict[str, Formatter] = {}
"""Result formatters by tool name; a tool module's owner may register one here."""

MAX_ITEMS = 6
MAX_TEXT = 100
STATUS_STYLE = {"completed": "bold green", "interrupted": "bold yellow", "max_turns": "bold yellow",
                "budget": "bold yellow", "error": "bold red"}


def _truncate(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _is_rate(d: dict[str, Any]) -> bool:
    return {"k", "n", "low", "high"} <= d.keys()


def _is_ratio(d: dict[str, Any]) -> bool:
    return {"ratio", "low", "high"} <= d.keys()


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, (str, list, dict)) and not value)


def compact(value: Any, limit: int = MAX_TEXT) -> str:
    """One-line summary of a JSON value: rounded floats, rates as k/n [low–high], long lists cut short."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, str):
        return _truncate(value, limit)
    if isinstance(value, dict):
        if _is_rate(value):
            return f"{value['k']}/{value['n']} [{100 * value['low']:.1f}–{100 * value['high']:.1f}%]"
        if _is_ratio(value):
            return f"{value['ratio']:.3g}× [{value['low']:.3g}, {value['high']:.3g}]"
        parts = [f"{k}: {compact(v, 40)}" for k, v in list(value.items())[:MAX_ITEMS]]
        more = f", … +{len(value) - MAX_ITEMS}" if len(value) > MAX_ITEMS else ""
        return _truncate("{" + ", ".join(parts) + more + "}", limit)
    if isinstance(value, list):
        parts = [compact(v, 40) for v in value[:MAX_ITEMS]]
        more = f", … +{len(value) - MAX_ITEMS}" if len(value) > MAX_ITEMS else ""
        return _truncate("[" + ", ".join(parts) + more + "]", limit)
    return _truncate(str(value), limit)


def key_values(d: dict[str, Any]) -> Table:
    """The generic result formatter: a row per key (nested objects one level deep), empty values left out."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="cyan", no_wrap=True)
    table.add_column(overflow="fold")
    for k, v in d.items():
        if _is_empty(v):
            continue
        if isinstance(v, dict) and not (_is_rate(v) or _is_ratio(v)):
            table.add_row(str(k), "")
            for sub, w in v.items():
                if not _is_empty(w):
                    table.add_row(f"  {sub}", compact(w))
        else:
            table.add_row(str(k), compact(v))
    return table


def _finish(result: dict[str, Any]) -> RenderableType:
    return Text(str(result.get("summary", "")))


FORMATTERS["finish"] = _finish


# -- the investigation tools: counts with intervals, ratios, p-values, verdicts ------------------------------------

VERDICT_STYLE = {"supported": "bold green", "not supported": "dim", "inconclusive": "yellow"}


def _kn(rate: dict[str, Any] | None) -> str:
    """``k/n = 7.5% [5.3–10.5%]``: a rate is never shown without its count and interval."""
    if not rate or not rate.get("n"):
        return "0/0"
    low, high = rate.get("low"), rate.get("high")
    interval = f" [{100 * low:.1f}–{100 * high:.1f}%]" if low is not None and high is not None else ""
    return f"{rate['k']}/{rate['n']} = {100 * rate['k'] / rate['n']:.1f}%{interval}"


def _x(value: float | None) -> str:
    return "∞" if value is None else f"{value:.3g}"


def _ratio_text(r: dict[str, Any] | None) -> str:
    return "n/a" if not r else f"{_x(r.get('ratio'))}× [{_x(r.get('low'))}, {_x(r.get('high'))}]"


def _p(p: float | None) -> str:
    return "n/a" if p is None else f"{p:.2g}"


def _confusions(summary: dict[str, Any], limit: int = 3) -> str:
    conf = summary.get("confusions") or []
    return ", ".join(f"{c['label']} {c['count']}" for c in conf[:limit])


def _sample_line(summary: dict[str, Any]) -> Text:
    t = Text.assemble(("failures ", "cyan"), _kn(summary.get("failures")))
    if summary.get("target_label"):
        t.append(f"; {summary['target_label']} {summary.get('target_hits', 0)}")
    if summary.get("confusions"):
        t.append(f"; wrong answers: {_confusions(summary)}", style="dim")
    if summary.get("unrendered"):
        t.append(f"; not rendered: {', '.join(summary['unrendered'])}", style="yellow")
    return t


def _generate_and_classify(r: dict[str, Any]) -> RenderableType:
    s = r["summary"]
    head = Text.assemble((f"{r['measurement_id']} ", "bold"), _truncate(s["prompt"], 80), style="")
    return Group(head, _sample_line(s))


def _caption_failures(r: dict[str, Any]) -> RenderableType:
    lines: list[RenderableType] = [Text(f"{len(r['hypotheses'])} hypotheses from {r['n_failures']} failures of "
                                        f"{r['measurement_id']}", style="bold")]
    for h in r["hypotheses"][:MAX_ITEMS]:
        lines.append(Text.assemble(f"• {_truncate(h['caption'], 90)} ",
                                   (f"({h['n_images']} images, predicted {h['predicted_label']})", "dim")))
    if len(r["hypotheses"]) > MAX_ITEMS:
        lines.append(Text(f"… +{len(r['hypotheses']) - MAX_ITEMS}", style="dim"))
    return Group(*lines)


def _perturb_caption(r: dict[str, Any]) -> RenderableType:
    edits, refs = r.get("edits", []), r.get("refinements", [])
    lines: list[RenderableType] = [Text(f"{len(edits)} edits, {len(refs)} refinements ({r.get('source', '?')})",
                                        style="bold")]
    for e in [*edits, *refs][:MAX_ITEMS]:
        lines.append(Text.assemble((f"{e['type']}: ", "cyan"), e["edit"]))
    if len(edits) + len(refs) > MAX_ITEMS:
        lines.append(Text(f"… +{len(edits) + len(refs) - MAX_ITEMS}", style="dim"))
    if r.get("rejected"):
        lines.append(Text(f"{len(r['rejected'])} refused (dropped the class or named another)", style="dim"))
    return Group(*lines)


def _mcnemar(m: dict[str, Any] | None) -> str:
    return "" if not m else f"McNemar: {m['b']} flipped to failure, {m['c']} back, p={_p(m['p_value'])}"


def _edit_image(r: dict[str, Any]) -> RenderableType:
    n = len(r.get("edits", []))
    t = Text(f"{n} image{'s' * (n != 1)} edited: {r['to_failure']} now fail, {r['to_correct']} now pass")
    if r.get("mcnemar"):
        t.append(f"; {_mcnemar(r['mcnemar'])}", style="dim")
    return t


def _measure_rate(r: dict[str, Any]) -> RenderableType:
    verdict = r.get("verdict", "")
    head = Text.assemble((f"{r['test_id']} ", "bold"), (verdict, VERDICT_STYLE.get(verdict, "")),
                         (f"  {r['purpose']}" + (", counterfactual" if r.get("mode") == "counterfactual" else ""),
                          "dim"))
    rows = Table.grid(padding=(0, 2))
    rows.add_column(style="cyan", no_wrap=True)
    rows.add_column(overflow="fold")
    if r.get("hypothesis"):
        rows.add_row("hypothesis", _sample_line(r["hypothesis"]))
    if r.get("mcnemar"):
        rows.add_row("edits", _mcnemar(r["mcnemar"]))
    rows.add_row("baseline", _kn(r.get("baseline")))
    rows.add_row("rate ratio", _ratio_text(r.get("rate_ratio")))
    looks = f"; looks at n={', '.join(map(str, r['looks']))}, stopped: {r['stopped']}" if r.get("looks") else ""
    rows.add_row("p", f"{_p(r.get('p_value'))}, {r.get('adjust_method', 'adjusted')}-adjusted {_p(r.get('adjusted_p'))}"
                      f" over {r.get('family_size', '?')} tests{looks}")
    for note in r.get("notes", []):
        rows.add_row("note", Text(note, style="yellow"))
    return Group(head, rows)


FORMATTERS.update({"generate_and_classify": _generate_and_classify, "caption_failures": _caption_failures,
                   "perturb_caption": _perturb_caption, "edit_image": _edit_image, "measure_rate": _measure_rate})


def format_result(name: str, result: dict[str, Any]) -> RenderableType:
    formatter = FORMATTERS.get(name)
    if formatter is None:
        return key_values(result)
    try:
        return formatter(result)
    except (KeyError, TypeError, ValueError, IndexError):
        # Transcripts outlive result shapes: an older result must still render, if only generically.
        return key_values(result)


def _arguments(arguments: dict[str, Any] | str) -> str:
    if isinstance(arguments, str):
        return _truncate(arguments, 120) + "  (unparsed)"
    return ", ".join(f"{k}={compact(v, 60) if not isinstance(v, str) else repr(_truncate(v, 60))}"
                     for k, v in arguments.items())


def _run_started(e: RunStarted) -> RenderableType:
    rows = Table.grid(padding=(0, 2))
    rows.add_column(style="cyan", no_wrap=True)
    rows.add_column(overflow="fold")
    rows.add_row("command", e.command)
    rows.add_row("planner", e.planner)
    if e.backends:
        rows.add_row("backends", ", ".join(f"{k}={v}" for k, v in e.backends.items()))
    if e.seeds:
        rows.add_row("seeds", ", ".join(f"{k}={v}" for k, v in e.seeds.items()))
    if e.config:
        rows.add_row("config", compact(e.config, 200))
    return Panel(rows, title=f"run {e.run_id}", subtitle=e.ts or None, border_style="blue")


def _planner_turn(e: PlannerTurn) -> RenderableType | None:
    parts: list[RenderableType] = []
    if e.reasoning:
        meta = [m for m in (e.model,) if m]
        if e.usage is not None:
            meta.append(f"{e.usage.prompt_tokens}+{e.usage.completion_tokens} tokens")
        if e.cost_usd is not None:
            meta.append(f"${e.cost_usd:.4f}")
        parts.append(Panel(Text(e.reasoning), title="planner", subtitle=" · ".join(meta) or None,
                           border_style="dim", title_align="left"))
    if e.final is not None:
        parts.append(Panel(Text(e.final), title="answer", border_style="green", title_align="left"))
    return Group(*parts) if parts else None


def _tool_returned(e: ToolReturned) -> RenderableType:
    if not e.ok:
        return Text(f"✗ {e.name}: {e.error}", style="red")
    head = Text.assemble(("← ", "green"), (e.name, "bold"), (f"  {e.duration_s:.2f} s", "dim"))
    if e.artifacts:
        head.append(f"  {len(e.artifacts)} image{'s' * (len(e.artifacts) != 1)}", style="dim")
    body = format_result(e.name, e.result or {})
    return Group(head, Padding(body, (0, 0, 0, 2)))


def _finding(e: Finding) -> RenderableType:
    title = Text(f"finding {e.finding_id}", style="bold magenta")
    if "caption" in e.finding:
        title.append(f": {e.finding['caption']}", style="bold")
    table = Table(show_header=False)
    table.add_column(style="cyan", no_wrap=True)
    table.add_column(overflow="fold")
    for k, v in e.finding.items():
        if k != "caption":
            table.add_row(str(k), compact(v, 160))
    return Group(title, table)


def _error(e: ErrorEvent) -> RenderableType:
    where = f" in {e.where}" if e.where else ""
    parts: list[RenderableType] = [Text(f"error{where}: {e.message}", style="bold red")]
    if e.traceback:
        tail = e.traceback.rstrip().splitlines()[-6:]
        parts.append(Text("\n".join(tail), style="red dim"))
    return Group(*parts)


def _run_finished(e: RunFinished) -> RenderableType:
    # The answer itself was shown where it arose (the planner's final turn or the finish tool's result).
    return Text.assemble(("run finished: ", "bold"), (e.status, STATUS_STYLE.get(e.status, "bold")),
                         (f"  ({e.n_findings} finding{'s' * (e.n_findings != 1)})", "dim"))


def render_event(event: Event) -> RenderableType | None:
    """A renderable for one event, or None when the event has nothing to show."""
    if isinstance(event, RunStarted):
        return _run_started(event)
    if isinstance(event, PlannerTurn):
        return _planner_turn(event)
    if isinstance(event, ToolCalled):
        return Text.assemble(("→ ", "cyan"), (event.name, "bold cyan"), f"({_arguments(event.arguments)})")
    if isinstance(event, ToolReturned):
        return _tool_returned(event)
    if isinstance(event, UserMessage):
        return Text(f"› {event.text}", style="bold")
    if isinstance(event, Finding):
        return _finding(event)
    if isinstance(event, RunFinished):
        return _run_finished(event)
    if isinstance(event, ErrorEvent):
        return _error(event)
    return None
