"""Terminal rendering of transcript events, shared by `sleuth replay` and the live terminal.

``render_event`` turns one event into a rich renderable (or ``None`` when there is nothing to show). Recorded text
(captions, the model's words, errors) goes in as ``Text``, never as markup: "[n=800]" must print as typed. A tool result
is read back into its tool's ``Result`` and drawn from the lines its module's ``render`` gives (styles as named in
``sleuth.tools.text``); a result no tool reads (another version's) gets a compact key/value summary.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError
from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from sleuth.agent.events import (
    ErrorEvent,
    Event,
    Finding,
    ModePlaced,
    PlannerTurn,
    RunFinished,
    RunStarted,
    ToolCalled,
    ToolReturned,
    UserMessage,
)
from sleuth.agent.modes import FOUNDED
from sleuth.tools import investigation_tools, record_finding
from sleuth.tools.findings import Finding as FindingModel
from sleuth.tools.text import Line

STYLES = {"key": "cyan", "dim": "dim", "bold": "bold", "good": "bold green", "warn": "yellow", "bad": "red"}
"""Terminal styles of the span styles tools name."""
MAX_ITEMS = 6
MAX_TEXT = 100
STATUS_STYLE = {"completed": "bold green", "budget_spent": "bold green", "interrupted": "bold yellow",
                "max_turns": "bold yellow", "time_limit": "bold yellow", "error": "bold red"}


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
            table.add_row(Text(str(k)), "")
            for sub, w in v.items():
                if not _is_empty(w):
                    table.add_row(Text(f"  {sub}"), Text(compact(w)))
        else:
            table.add_row(Text(str(k)), Text(compact(v)))
    return table


def styled(lines: list[Line]) -> RenderableType:
    return Group(*[Text.assemble(*[(text, STYLES.get(style, style)) for text, style in line]) for line in lines])


def format_result(name: str, result: dict[str, Any]) -> RenderableType:
    reg = investigation_tools()
    typed = reg.result(name, result)
    render = reg.get(name).render if name in reg else None
    if typed is None or render is None:
        # Transcripts outlive result shapes: an older result must still render, if only generically.
        return key_values(result)
    return styled(render(typed))


def _arguments(arguments: dict[str, Any] | str) -> str:
    if isinstance(arguments, str):
        return _truncate(arguments, 120) + "  (unparsed)"
    return ", ".join(f"{k}={compact(v, 60) if not isinstance(v, str) else repr(_truncate(v, 60))}"
                     for k, v in arguments.items())


def _run_started(e: RunStarted) -> RenderableType:
    rows = Table.grid(padding=(0, 2))
    rows.add_column(style="cyan", no_wrap=True)
    rows.add_column(overflow="fold")
    rows.add_row("command", Text(e.command))
    rows.add_row("planner", Text(e.planner))
    if e.backends:
        rows.add_row("backends", Text(", ".join(f"{k}={v}" for k, v in e.backends.items())))
    if e.seeds:
        rows.add_row("seeds", Text(", ".join(f"{k}={v}" for k, v in e.seeds.items())))
    draw = e.config.get("confirmation_draw") if e.config else None
    if draw:
        rows.add_row("confirmation", Text(f"draw {draw}: confirmation seeds of its own, the discovery images of seed "
                                          f"{e.config.get('seed', 0)}"))
    if e.config:
        rows.add_row("config", Text(compact(e.config, 200)))
    return Panel(rows, title=Text(f"run {e.run_id}"), subtitle=Text(e.ts) if e.ts else None, border_style="blue")


def _planner_turn(e: PlannerTurn) -> RenderableType | None:
    parts: list[RenderableType] = []
    if e.reasoning:
        meta = [m for m in (e.model,) if m]
        if e.usage is not None:
            meta.append(f"{e.usage.prompt_tokens}+{e.usage.completion_tokens} tokens")
        if e.cost_usd is not None:
            meta.append(f"${e.cost_usd:.4f}")
        parts.append(Panel(Text(e.reasoning), title="planner", subtitle=Text(" · ".join(meta)) if meta else None,
                           border_style="dim", title_align="left"))
    if e.final is not None:
        parts.append(Panel(Text(e.final), title="answer", border_style="green", title_align="left"))
    return Group(*parts) if parts else None


def _tool_returned(e: ToolReturned) -> RenderableType:
    if not e.ok:
        return Text(f"✗ {e.name}: {e.error}", style="red")
    head = Text.assemble(("← ", "green"), (e.name, "bold"), (f"  {e.duration_s:.2f} s", "dim"))
    if e.name == record_finding.NAME:
        return head  # the finding event just before it shows the finding: once is enough
    if e.artifacts:
        head.append(f"  {len(e.artifacts)} image{'s' * (len(e.artifacts) != 1)}", style="dim")
    body = format_result(e.name, e.result or {})
    return Group(head, Padding(body, (0, 0, 0, 2)))


def _finding(e: Finding) -> RenderableType:
    try:
        return styled(record_finding.render(FindingModel.model_validate(e.finding)))
    except ValidationError:
        caption = e.finding.get("caption")
        title = Text(f"finding {e.finding_id}" + (f": {caption}" if isinstance(caption, str) else ""),
                     style="bold magenta")
        table = Table(show_header=False)
        table.add_column(style="cyan", no_wrap=True)
        table.add_column(overflow="fold")
        for k, v in e.finding.items():
            table.add_row(Text(str(k)), Text(compact(v, 160)))
        return Group(title, table)


def _mode(e: ModePlaced) -> RenderableType:
    """One line: a mode formed by a finding (what its failures show, else the label they go to), or a finding
    joining a mode as another phrasing of its cause, with the reason."""
    head = Text.assemble(("mode ", "bold magenta"), (e.mode_id, "bold magenta"))
    if e.reason.startswith(FOUNDED.split(":", 1)[0]):  # "a cause of its own", whatever detail follows
        what = e.idea or (f"fails as {', '.join(e.labels)}" if e.labels else "")
        head.append(f" formed by {e.finding_id}" + (f": {what}" if what else ""))
    else:
        head.append(f": {e.finding_id} joins — {e.reason}")
    return head


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
    if isinstance(event, ModePlaced):
        return _mode(event)
    if isinstance(event, RunFinished):
        return _run_finished(event)
    if isinstance(event, ErrorEvent):
        return _error(event)
    return None
