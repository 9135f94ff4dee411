"""`sleuth chat`: a conversation in the terminal over one investigation, written to one transcript.

Every line the user types is a ``user_message`` event. Slash commands become tool calls recorded as a turn of the
user (``planner_turn`` with model "user", then ``tool_called`` / ``tool_returned``). Words go to the LLM planner
when one is configured; ``/auto`` hands over to the protocol planner. Ctrl-C stops the tool or planner at work, not
the session: the stopped call is recorded as failed, and the prompt comes back.

Ctrl-C is deferred while an event is being written, so an interrupt can never tear the transcript's hash chain.
"""

from __future__ import annotations

import signal
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType

from rich.console import Console
from rich.table import Table
from rich.text import Text

from sleuth.agent import chat_commands as C
from sleuth.agent.events import (
    ErrorEvent,
    Event,
    Finding,
    PlannerTurn,
    RunFinished,
    RunStarted,
    Status,
    ToolCall,
    ToolCalled,
    ToolReturned,
    UserMessage,
)
from sleuth.agent.loop import Planner, PlannerError, artifact_refs
from sleuth.agent.progress import ProgressBars
from sleuth.agent.render import render_event
from sleuth.agent.report_table import findings_table
from sleuth.agent.session import Session, registry
from sleuth.agent.transcript import TranscriptWriter
from sleuth.tools.registry import Registry, ToolError

STOPPED = "stopped by the user (Ctrl-C)"
PROMPT = "sleuth> "


class _Stop(Exception):
    """The user pressed Ctrl-C during a tool call: end the exchange, keep the session."""


class Interrupts:
    """A SIGINT handler that raises ``KeyboardInterrupt`` except inside ``shield()``, where it waits."""

    def __init__(self) -> None:
        self._depth = 0
        self._pending = False

    def handler(self, signum: int, frame: FrameType | None) -> None:
        if self._depth:
            self._pending = True
            return
        raise KeyboardInterrupt

    @contextmanager
    def shield(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth and self._pending:
                self._pending = False
                raise KeyboardInterrupt

    @contextmanager
    def installed(self) -> Iterator[None]:
        previous = signal.signal(signal.SIGINT, self.handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


@dataclass
class ProgressRelay:
    """Handed to the session as its progress callback before any bar exists; forwards to the bars of the moment."""

    bars: ProgressBars | None = None

    def update(self, task: str, done: int, total: int) -> None:
        if self.bars is not None:
            self.bars.update(task, done, total)


@dataclass
class Chat:
    session: Session
    writer: TranscriptWriter
    console: Console
    planner: Planner | None = None
    """The LLM planner, when one is configured: the user's words go to it."""
    protocol: Callable[[], Planner] | None = None
    """Makes the planner `/auto` hands over to."""
    relay: ProgressRelay = field(default_factory=ProgressRelay)
    bars: bool = True
    max_turns: int = 40
    """Most planner turns for one message (or one /auto)."""
    registry: Registry = field(default_factory=registry)
    interrupts: Interrupts = field(default_factory=Interrupts)
    _calls: int = 0

    def __post_init__(self) -> None:
        self.session.ctx.emit = lambda item: self._append(Finding(finding_id=item["finding_id"],  # type: ignore
                                                                  finding=item["finding"]))
        self.writer.subscribe(self._show)

    # -- events ----------------------------------------------------------------------------------------------

    def _append(self, event: Event) -> Event:
        with self.interrupts.shield():
            return self.writer.append(event)

    def _show(self, event: Event) -> None:
        if isinstance(event, (UserMessage, RunStarted)):
            return  # the user's line is on the screen already; the banner says what run_started says
        renderable = render_event(event)
        if renderable is not None:
            self.console.print(renderable)

    def start(self) -> None:
        """Write ``run_started`` (the session's command and config, e.g. command "chat")."""
        self._append(self.session.started_event(self.planner.name if self.planner is not None else "user"))

    def finish(self, status: Status) -> None:
        self._append(RunFinished(status=status, n_findings=len(self.session.investigation.findings)))

    # -- tools and planners -------------------------------------------------------------------------------------

    def _call_tool(self, call: ToolCall) -> None:
        ctx = self.session.ctx
        self._append(ToolCalled(call_id=call.id, name=call.name, arguments=call.arguments))
        t0 = time.perf_counter()
        try:
            with ProgressBars(self.console, enabled=self.bars) as bars:
                self.relay.bars = bars
                try:
                    result = self.registry.call(call.name, call.arguments, ctx).model_dump(mode="json")
                finally:
                    self.relay.bars = None
        except ToolError as e:
            self._append(ToolReturned(call_id=call.id, name=call.name, ok=False, error=str(e),
                                      duration_s=time.perf_counter() - t0))
            return
        except KeyboardInterrupt:
            self._append(ToolReturned(call_id=call.id, name=call.name, ok=False, error=STOPPED,
                                      duration_s=time.perf_counter() - t0))
            raise _Stop from None
        self._append(ToolReturned(call_id=call.id, name=call.name, ok=True, result=result,
                                  duration_s=time.perf_counter() - t0, artifacts=artifact_refs(result, ctx.artifacts)))

    def drive(self, planner: Planner, max_turns: int) -> str | None:
        """Let ``planner`` take turns until it answers, finishes, or runs out of turns; returns its answer."""
        ctx = self.session.ctx
        try:
            for _ in range(max_turns):
                try:
                    with self.console.status(f"{planner.name} is thinking…", spinner="dots") if self.bars \
                            else _nothing():
                        turn = planner.next_turn(tuple(self.writer.events))
                except PlannerError as e:
                    self._append(ErrorEvent(message=str(e), where=f"planner {planner.name}"))
                    return None
                self._append(PlannerTurn(**turn.model_dump()))
                for call in turn.tool_calls:
                    self._call_tool(call)
                    if ctx.finished:
                        break
                if ctx.finished:
                    return ctx.final_answer
                if turn.final is not None and not turn.tool_calls:
                    return turn.final
            self.console.print(f"[yellow]{planner.name} used its {max_turns} turns for this message; "
                               "write again to let it go on.[/]")
            return None
        except (_Stop, KeyboardInterrupt):
            self.console.print(f"[yellow]{STOPPED}.[/]")
            return None
        finally:
            # `finish` ends a planner's run, not the conversation.
            ctx.finished, ctx.final_answer = False, None

    def command(self, line: str) -> bool:
        """Run one slash command; False when the user asked to leave."""
        p = C.parse(line)
        if p.name in ("quit", "exit"):
            return False
        if p.name == "help":
            self.console.print(help_table(llm=self.planner is not None))
        elif p.name == "findings":
            self.console.print(findings_table(self.session.investigation, show_all=True))
        elif p.name == "auto":
            if self.protocol is None:
                raise C.CommandError("/auto: no protocol planner in this session")
            self.drive(self.protocol(), max_turns=500)
        else:
            inv = self.session.investigation
            self._calls += 1
            call = C.tool_call(p, self.writer.events, inv.class_prompt, f"user_{self._calls}", inv.labels.labels)
            self._append(PlannerTurn(tool_calls=[call], model="user"))
            try:
                self._call_tool(call)
            except _Stop:
                self.console.print(f"[yellow]{STOPPED}.[/]")
        return True

    def handle(self, line: str) -> bool:
        """One line from the user; False when the session should end."""
        line = line.strip()
        if not line:
            return True
        self._append(UserMessage(text=line))
        if line.startswith("/"):
            try:
                return self.command(line)
            except C.CommandError as e:
                self.console.print(f"[red]{e}[/]")
                return True
        if self.planner is None:
            self.console.print("No LLM is configured, so words go nowhere: use the slash commands (/help), "
                               "or start `sleuth chat` with --llm MODEL.")
            return True
        self.drive(self.planner, self.max_turns)
        return True

    def loop(self, read: Callable[[str], str]) -> Status:
        """Read lines until /quit or end of input; returns the run status. Bugs are recorded, then raised."""
        with self.interrupts.installed():
            try:
                while True:
                    try:
                        if not self.handle(read(PROMPT)):
                            return "completed"
                    except EOFError:
                        self.console.print()
                        return "completed"
                    except KeyboardInterrupt:
                        self.console.print("\n[dim](Ctrl-C stops a running tool; /quit or Ctrl-D leaves)[/]")
            except Exception as e:  # a bug, ours: recorded so the transcript explains the stop, then re-raised
                self._append(ErrorEvent(message=f"{type(e).__name__}: {e}", where="chat",
                                        traceback=traceback.format_exc()))
                self.finish("error")
                raise


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def help_table(*, llm: bool) -> Table:
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for usage, what in C.HELP:
        table.add_row(usage, what)
    table.caption = ("Words without a slash go to the LLM planner, which runs tools and answers with evidence."
                     if llm else "No LLM configured: words are not understood; start with --llm MODEL for that.")
    return table


def banner(label: str, budget: int, transcript: str, planner: str | None) -> Text:
    who = f"LLM planner: {planner}" if planner else "no LLM (slash commands)"
    return Text.assemble(("sleuth chat", "bold"), f" — class {label!r}, budget {budget:,} images, {who}.\n",
                         ("Type /help for commands, /quit to leave. Transcript: ", "dim"), (transcript, "dim"))

