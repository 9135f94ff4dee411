"""The run loop: ask the planner for a turn, run its tool calls, write every step. The whole error policy is here,
for every entry point (investigate, chat, audit, resume, fork).

- ``ToolError`` (bad arguments, unknown tool, malformed JSON, exhausted budget) is the planner's to fix: it is
  written as a failed ``tool_returned`` and the planner reads it on its next turn.
- ``PlannerError`` (the planner's model misbehaved beyond its retries) is written as an ``error`` event; a run then
  ends with status ``error``, a chat returns to the user's prompt.
- Anything else is a bug: it is written as an ``error`` event with its traceback, the run is closed, and the
  exception propagates. ``KeyboardInterrupt`` closes the run as ``interrupted`` and propagates; in a chat
  (``interrupt_stops_call``) it fails the tool call at work instead and raises ``Stopped``.

Every path of ``run`` ends with a ``run_finished`` event, so an interrupted transcript is still complete and valid.
``execute`` runs one call without writing anything; the runner writes around it, and verification (which compares
instead of writing) uses it alone.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Field

from sleuth.agent.errors import PlannerError
from sleuth.agent.events import (
    ErrorEvent,
    Event,
    Finding,
    ModePlaced,
    PlannerTurn,
    RunFinished,
    RunStarted,
    Status,
    ToolCall,
    ToolCalled,
    ToolReturned,
    Turn,
    Usage,
    json_safe,
)
from sleuth.agent.transcript import TranscriptWriter
from sleuth.tools.context import ToolContext
from sleuth.tools.defaults import BUDGET_EXHAUSTED
from sleuth.tools.registry import Registry, ToolError

if TYPE_CHECKING:
    from sleuth.agent.view import InvestigationView
    from sleuth.tools.artifacts import ArtifactStore
    from sleuth.tools.findings import Finding as FindingModel

STOPPED = "stopped by the user (Ctrl-C)"


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


class Stopped(Exception):
    """Ctrl-C stopped a tool call in a chat: the call is recorded as failed and the exchange ends, not the session."""


def _is_image_key(key: str) -> bool:
    return key in ("image", "images", "image_ref", "image_refs", "original", "edited") or key.endswith(
        ("_image", "_images"))


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


@dataclass
class Outcome:
    """What running one call gave: a result as the transcript holds it (or an error), and the findings it made."""

    ok: bool
    result: dict[str, Any] | None = None
    error: str | None = None
    findings: list[FindingModel] = field(default_factory=list)
    bug: str | None = None
    """The call raised a bug (only when the caller expected one, re-running a recording of it)."""
    duration_s: float = 0.0
    images_used: int = 0


def execute(registry: Registry, ctx: ToolContext, name: str, arguments: dict[str, Any] | str, *,
            expect_bug: bool = False) -> Outcome:
    """Run one call and collect the findings it reports instead of writing them. ``ToolError`` is an outcome; any
    other exception propagates, unless ``expect_bug`` (a recording says this call raised one)."""
    found: list[FindingModel] = []
    previous = ctx.on_finding
    ctx.on_finding = found.append
    budget = ctx.investigation.budget if ctx.investigation is not None else None
    used = budget.used if budget is not None else 0
    t0 = time.perf_counter()

    def done(**kw: Any) -> Outcome:
        spent = budget.used - used if budget is not None else 0
        return Outcome(findings=found, duration_s=time.perf_counter() - t0, images_used=spent, **kw)

    try:
        # As the transcript holds it: non-finite numbers are strings there ("Infinity").
        return done(ok=True, result=json_safe(registry.call(name, arguments, ctx).model_dump(mode="json")))
    except ToolError as e:
        return done(ok=False, error=str(e))
    except Exception as e:
        if not expect_bug:
            raise
        return done(ok=False, bug=f"{type(e).__name__}: {e}")
    finally:
        ctx.on_finding = previous


def _nothing(_: str) -> AbstractContextManager[None]:
    return nullcontext()


@dataclass
class Runner:
    """Writes one run's events: planner turns, tool calls and their results, findings, errors, the end."""

    registry: Registry
    ctx: ToolContext
    writer: TranscriptWriter
    shield: Callable[[], AbstractContextManager[None]] = nullcontext
    """Held around every write (a chat defers Ctrl-C there, so an interrupt never falls inside one)."""
    interrupt_stops_call: bool = False
    """Chat: Ctrl-C during a tool call fails that call and raises ``Stopped`` instead of ending the run."""
    thinking: Callable[[str], AbstractContextManager[None]] = _nothing
    """Held while a planner (named) thinks; a chat shows a spinner."""
    working: Callable[[str], AbstractContextManager[None]] = _nothing
    """Held while a tool (named) runs; a chat shows its progress bars."""
    bug_written: bool = field(default=False, init=False)
    """A bug's ``error`` event is written (the caller closes the run)."""
    last_outcomes: list[Outcome] = field(default_factory=list, init=False)
    """What the latest turn's calls returned."""
    _modes: InvestigationView | None = field(default=None, init=False)
    """The transcript as the failure modes read it (``place_modes``)."""
    _modes_read: int = field(default=0, init=False)

    def append(self, event: Event) -> Event:
        with self.shield():
            return self.writer.append(event)

    @property
    def n_findings(self) -> int:
        # A finding updated later (its counterfactual added) is written again under its id.
        return len({e.finding_id for e in self.writer.events if isinstance(e, Finding)})

    def finish(self, status: Status, answer: str | None = None) -> None:
        self.append(RunFinished(status=status, answer=answer, n_findings=self.n_findings))

    def _bug(self, e: BaseException, where: str) -> None:
        self.append(ErrorEvent(message=f"{type(e).__name__}: {e}", where=where, traceback=traceback.format_exc()))
        self.bug_written = True

    # -- one call ----------------------------------------------------------------------------------------------

    def call_tool(self, call: ToolCall, *, announced: bool = False, findings_written: int = 0,
                  check: Callable[[Outcome], None] | None = None) -> Outcome:
        """Write ``tool_called``, run the call, write its findings and ``tool_returned``.

        Resuming a call a crash cut short: ``announced`` (its ``tool_called`` is written), ``findings_written`` (that
        many of its findings are written and are not written again) and ``check`` (compares the re-run with what the
        recording holds, before anything more is written).
        """
        if not announced:
            self.append(ToolCalled(call_id=call.id, name=call.name, arguments=call.arguments))
        meter = getattr(self.ctx.llm, "spent", None)
        before = meter() if meter is not None else None
        try:
            with self.working(call.name):
                outcome = execute(self.registry, self.ctx, call.name, call.arguments)
        except KeyboardInterrupt:
            if not self.interrupt_stops_call:
                raise
            self.append(ToolReturned(call_id=call.id, name=call.name, ok=False, error=STOPPED))
            raise Stopped from None
        except Exception as e:
            self._bug(e, f"tool {call.name}")
            raise
        if check is not None:
            check(outcome)
        for f in outcome.findings[findings_written:]:
            self.append(Finding(finding_id=f.finding_id, finding=f.model_dump(mode="json")))
        inv = self.ctx.investigation
        usage, cost = None, None
        if meter is not None and before is not None:
            p, c, usd = (a - b for a, b in zip(meter(), before))
            if p or c:
                usage, cost = Usage(prompt_tokens=int(p), completion_tokens=int(c)), (float(usd) or None)
        self.append(ToolReturned(call_id=call.id, name=call.name, ok=outcome.ok, result=outcome.result,
                                 error=outcome.error, duration_s=outcome.duration_s,
                                 artifacts=artifact_refs(outcome.result, self.ctx.artifacts) if outcome.ok else [],
                                 images_used=outcome.images_used,
                                 images_left=inv.budget.left if inv is not None else None,
                                 usage=usage, cost_usd=cost))
        self.place_modes()
        return outcome

    def place_modes(self) -> None:
        """Writes a ``mode`` event for each confirmed finding no failure mode holds yet (agent/modes.py), after the
        call that recorded it; a resumed run calls it first, so a crash between the two loses nothing."""
        events = self.writer.events
        if events and isinstance(events[-1], ToolCalled | Finding):
            return  # inside a call a crash cut short: its findings are placed once its result is written
        fresh = any(isinstance(e, Finding) for e in events[self._modes_read:])
        self._modes_read = len(events)
        if not fresh:
            return
        from sleuth.agent.view import InvestigationView  # the tools' results, read only once a finding is made

        view = self._modes = (self._modes.extend(events) if self._modes is not None
                              else InvestigationView.from_events(events, self.registry))
        for p in view.place_modes():
            self.append(ModePlaced(mode_id=p.mode.mode_id, finding_id=p.finding_id, reason=p.reason,
                                   idea=p.mode.idea, labels=p.mode.labels))

    def run_calls(self, calls: Sequence[ToolCall]) -> list[Outcome]:
        outcomes = []
        for call in calls:
            outcomes.append(self.call_tool(call))
            if self.ctx.finished:
                break
        return outcomes

    # -- turns -------------------------------------------------------------------------------------------------

    def take_turn(self, planner: Planner) -> Turn | None:
        """One planner turn and its calls; None when the planner failed (its ``PlannerError`` is written)."""
        try:
            with self.thinking(planner.name):
                turn = planner.next_turn(tuple(self.writer.events))
        except PlannerError as e:
            self.append(ErrorEvent(message=str(e), where=f"planner {planner.name}"))
            return None
        except KeyboardInterrupt:
            raise
        except Exception as e:
            self._bug(e, f"planner {planner.name}")
            raise
        self.append(PlannerTurn(**turn.model_dump()))
        self.last_outcomes = self.run_calls(turn.tool_calls)
        return turn

    def budget_spent(self) -> bool:
        """The latest turn called tools and every call was refused for want of images: the budget is spent, and
        the run ends cleanly (its findings are recorded already) instead of failing turn after turn."""
        outs = self.last_outcomes
        return bool(outs) and all(not o.ok and (o.error or "").startswith(BUDGET_EXHAUSTED) for o in outs)

    def drive(self, planner: Planner, max_turns: int,
              max_seconds: float | None = None) -> tuple[Status, str | None, int]:
        """Turns until the planner answers, a tool finishes the run, it fails, ``max_turns`` are taken, the image
        budget is spent or ``max_seconds`` have passed; returns (status, answer, turns taken). Writes no
        ``run_finished``: a chat goes on after its planner is done."""
        if max_turns < 1:
            return "max_turns", None, 0
        start = time.monotonic()
        for n in range(1, max_turns + 1):
            turn = self.take_turn(planner)
            if turn is None:
                return "error", None, n - 1
            if self.ctx.finished:
                return "completed", self.ctx.final_answer, n
            if turn.final is not None and not turn.tool_calls:
                return "completed", turn.final, n
            if self.budget_spent():
                return "budget_spent", None, n
            if max_seconds is not None and time.monotonic() - start >= max_seconds:
                return "time_limit", None, n
        return "max_turns", None, max_turns

    @contextmanager
    def guard(self) -> Iterator[None]:
        """The run's end on the way out of an interrupt or a bug: ``run_finished`` is written, then it propagates."""
        try:
            yield
        except KeyboardInterrupt:
            self.finish("interrupted")
            raise
        except Exception as e:  # a bug, ours: recorded so the transcript explains the stop, then re-raised
            if not self.bug_written:
                self._bug(e, "loop")
            self.finish("error")
            raise

    def run(self, planner: Planner, *, max_turns: int = 100, run_started: RunStarted | None = None,
            turns_taken: int = 0, max_seconds: float | None = None) -> RunResult:
        """Run ``planner`` to the end of the run (see the module's error policy); always writes ``run_finished``.
        ``turns_taken``: turns a resumed run had already taken (they count towards ``max_turns``)."""
        with self.guard():
            if run_started is not None:
                self.append(run_started)
            status, answer, n = self.drive(planner, max_turns - turns_taken, max_seconds) \
                if turns_taken < max_turns else ("max_turns", None, 0)
        self.finish(status, answer)
        return RunResult(status=status, answer=answer, n_turns=n + turns_taken, events=len(self.writer.events))
