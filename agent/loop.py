"""The run loop: ask the planner for a turn, run its tool calls, write every step. The whole error policy is here.

- ``ToolError`` (bad arguments, unknown tool, malformed JSON, exhausted budget) is the planner's to fix: it is
  written as a failed ``tool_returned`` and the planner reads it on its next turn.
- ``PlannerError`` (the planner's model misbehaved beyond its retries) ends the run with status ``error``.
- Anything else is a bug: it is written as an ``error`` event with its traceback, the run is closed, and the
  exception propagates. ``KeyboardInterrupt`` closes the run as ``interrupted`` and propagates.

Every path ends with a ``run_finished`` event, so an interrupted transcript is still complete and valid.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence
from typing import Any, Protocol

from pydantic import BaseModel, Field

from sleuth.agent.events import (
    ErrorEvent,
    Event,
    PlannerTurn,
    RunFinished,
    RunStarted,
    Status,
    ToolCall,
    ToolCalled,
    ToolReturned,
    Usage,
)
from sleuth.agent.transcript import TranscriptWriter
from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.context import ToolContext
from sleuth.tools.registry import Registry, ToolError


class PlannerError(Exception):
    """The planner's model misbehaved beyond its retries (no usable turn); ends the run with status error."""


class Turn(BaseModel):
    reasoning: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    final: str | None = None
    model: str | None = None
    usage: Usage | None = None
    cost_usd: float | None = None


class Planner(Protocol):
    name: str

    def next_turn(self, events: Sequence[Event]) -> Turn:
        """The next turn, given every event of the transcript so far."""
        ...


class RunResult(BaseModel):
    status: Status
    answer: str | None = None
    n_turns: int = 0
    events: int = Field(default=0, description="Events in the transcript when the run ended.")


def _is_image_key(key: str) -> bool:
    return key in ("image", "images", "image_ref", "image_refs") or key.endswith(("_image", "_images"))


def artifact_refs(result: Any, store: ArtifactStore | None) -> list[str]:
    """Refs held in image-named fields of a result that the store really holds, in order of appearance."""
    found: list[str] = []

    def walk(node: Any, image_field: bool, store: ArtifactStore) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, isinstance(k, str) and _is_image_key(k), store)
        elif isinstance(node, list):
            for v in node:
                walk(v, image_field, store)
        elif image_field and isinstance(node, str) and node not in found and store.exists(node):
            found.append(node)

    if store is not None:
        walk(result, False, store)
    return found


def _call_tool(call: ToolCall, registry: Registry, ctx: ToolContext, writer: TranscriptWriter) -> None:
    writer.append(ToolCalled(call_id=call.id, name=call.name, arguments=call.arguments))
    t0 = time.perf_counter()
    try:
        result = registry.call(call.name, call.arguments, ctx).model_dump(mode="json")
    except ToolError as e:
        writer.append(ToolReturned(call_id=call.id, name=call.name, ok=False, error=str(e),
                                   duration_s=time.perf_counter() - t0))
        return
    writer.append(ToolReturned(call_id=call.id, name=call.name, ok=True, result=result,
                               duration_s=time.perf_counter() - t0, artifacts=artifact_refs(result, ctx.artifacts)))


def run_loop(planner: Planner, registry: Registry, ctx: ToolContext, writer: TranscriptWriter, *,
             max_turns: int = 100, run_started: RunStarted | None = None) -> RunResult:
    """Run ``planner`` until it answers, a tool finishes the run, or ``max_turns`` turns have been taken."""
    n_turns = 0

    def finish(status: Status, answer: str | None = None) -> RunResult:
        n_findings = sum(1 for e in writer.events if e.kind == "finding")
        writer.append(RunFinished(status=status, answer=answer, n_findings=n_findings))
        return RunResult(status=status, answer=answer, n_turns=n_turns, events=len(writer.events))

    where = "loop"
    status: Status = "max_turns"
    answer: str | None = None
    try:
        if run_started is not None:
            writer.append(run_started)
        while n_turns < max_turns:
            where = f"planner {planner.name}"
            turn = planner.next_turn(tuple(writer.events))
            n_turns += 1
            writer.append(PlannerTurn(**turn.model_dump()))
            for call in turn.tool_calls:
                where = f"tool {call.name}"
                _call_tool(call, registry, ctx, writer)
                if ctx.finished:
                    break
            if ctx.finished:
                status, answer = "completed", ctx.final_answer
                break
            if turn.final is not None and not turn.tool_calls:
                status, answer = "completed", turn.final
                break
    except PlannerError as e:
        writer.append(ErrorEvent(message=str(e), where=where))
        status = "error"
    except KeyboardInterrupt:
        finish("interrupted")
        raise
    except Exception as e:  # a bug, ours: recorded so the transcript explains the stop, then re-raised
        writer.append(ErrorEvent(message=f"{type(e).__name__}: {e}", where=where, traceback=traceback.format_exc()))
        finish("error")
        raise
    return finish(status, answer)
