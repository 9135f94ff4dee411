"""`sleuth chat`: a conversation in the terminal over one investigation, written to one transcript.

Every line the user types is a ``user_message`` event. Slash commands become tool calls recorded as a turn of the
user (``planner_turn`` with model "user", then ``tool_called`` / ``tool_returned``). Words go to the LLM planner
when one is configured; ``/auto`` hands over to the protocol planner. Ctrl-C stops the tool or planner at work, not
the session: the stopped call is recorded as failed, and the prompt comes back.

Ctrl-C is deferred while an event is being written, so an interrupt can never tear the transcript's hash chain.
"""

from __future__ import annotations

import signal
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType

from rich.console import Console
from rich.table import Table
from rich.text import Text

from sleuth.agent.chat import commands as C
from sleuth.agent.events import ErrorEvent, Event, PlannerTurn, RunStarted, Status, ToolReturned, UserMessage
from sleuth.agent.mode_summary import mode_summaries
from sleuth.agent.runner import STOPPED, Planner, Runner, Stopped
from sleuth.agent.session import Session
from sleuth.agent.terminal.progress import ProgressBars
from sleuth.agent.terminal.render import render_event
from sleuth.agent.terminal.tables import findings_table
from sleuth.agent.transcript import TranscriptWriter
from sleuth.agent.view import InvestigationView

PROMPT = "sleuth> "


def auto_planner(session: Session, baseline_n: int | None = None) -> Planner:
    """The protocol planner ``/auto`` hands over to, going on from whatever the user did: the session's declared
    confirmation family, and the sizes, attempts and baseline of the user's own confirmations (the tools refuse
    any other sizes once the first confirmation has declared them)."""
    from sleuth.agent.config import PlannerConfig
    from sleuth.agent.planners import PlanFor, build_planner
    from sleuth.agent.planners.protocol import ProtocolPlanner

    inv, c = session.investigation, session.config
    declared = inv.confirmation_designs
    planner = build_planner(PlannerConfig(name="protocol", baseline_n=baseline_n), PlanFor(
        label=c.label, class_prompt=inv.class_prompt, labels=inv.labels.labels, budget=inv.budget.images,
        seed=c.seed, alpha=c.alpha, confirmations=inv.max_confirmations,
        designs=tuple(declared) if declared is not None else None))
    if declared is not None and isinstance(planner, ProtocolPlanner):
        drawn = inv.baselines.get("confirmation")
        planner.adopt(declared, {d.key: inv.design_attempts(d.key) for d in declared},
                      drawn.n if drawn is not None else None)
    return planner


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
    interrupts: Interrupts = field(default_factory=Interrupts)
    _calls: int = 0
    runner: Runner = field(init=False)

    def __post_init__(self) -> None:
        self.writer.subscribe(self._show)
        self.runner = self.session.runner(self.writer, shield=self.interrupts.shield, interrupt_stops_call=True,
                                          thinking=self._thinking, working=self._working)

    # -- events ----------------------------------------------------------------------------------------------

    def _show(self, event: Event) -> None:
        if isinstance(event, (UserMessage, RunStarted)):
            return  # the user's line is on the screen already; the banner says what run_started says
        renderable = render_event(event)
        if renderable is not None:
            self.console.print(renderable)

    @contextmanager
    def _thinking(self, name: str) -> Iterator[None]:
        if not self.bars:
            yield
            return
        with self.console.status(f"{name} is thinking…", spinner="dots"):
            yield

    @contextmanager
    def _working(self, name: str) -> Iterator[None]:
        with ProgressBars(self.console, enabled=self.bars) as bars:
            self.relay.bars = bars
            try:
                yield
            finally:
                self.relay.bars = None

    def start(self) -> None:
        """Write ``run_started`` (the session's command and config, e.g. command "chat")."""
        self.runner.append(self.session.started_event(self.planner.name if self.planner is not None else "user"))

    def finish(self, status: Status) -> None:
        self.runner.finish(status)

    # -- planners ----------------------------------------------------------------------------------------------

    def drive(self, planner: Planner, max_turns: int) -> str | None:
        """Let ``planner`` take turns until it answers, finishes, or runs out of turns; returns its answer."""
        ctx = self.session.ctx
        try:
            status, answer, _ = self.runner.drive(planner, max_turns)
            if status == "max_turns":
                self.console.print(Text(f"{planner.name} used its {max_turns} turns for this message; "
                                        "write again to let it go on.", style="yellow"))
            return answer
        except (Stopped, KeyboardInterrupt):
            self._say_stopped()
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
            view = InvestigationView.from_events(self.writer.events)
            self.console.print(findings_table(self.session.investigation, show_all=True,
                                              modes=mode_summaries(view)))
        elif p.name == "auto":
            if self.protocol is None:
                raise C.CommandError("/auto: no protocol planner in this session")
            self.drive(self.protocol(), max_turns=500)
        else:
            inv = self.session.investigation
            self._calls += 1
            call = C.tool_call(p, self.writer.events, inv.class_prompt, f"user_{self._calls}", inv.labels.labels)
            self.runner.append(PlannerTurn(tool_calls=[call], model="user"))
            try:
                self.runner.call_tool(call)
            except Stopped:
                self._say_stopped()
        return True

    def _say_stopped(self) -> None:
        """Say once that Ctrl-C stopped the work: not again after the stopped call's result, which said it."""
        last = self.writer.events[-1] if self.writer.events else None
        if not (isinstance(last, ToolReturned) and last.error == STOPPED):
            self.console.print(f"[yellow]{STOPPED}.[/]")

    def handle(self, line: str) -> bool:
        """One line from the user; False when the session should end."""
        line = line.strip()
        if not line:
            return True
        self.runner.append(UserMessage(text=line))
        if line.startswith("/"):
            try:
                return self.command(line)
            except C.CommandError as e:
                self.console.print(Text(str(e), style="red"))  # usage lines hold [brackets]: not markup
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
                if not self.runner.bug_written:
                    self.runner.append(ErrorEvent(message=f"{type(e).__name__}: {e}", where="chat",
                                                  traceback=traceback.format_exc()))
                self.finish("error")
                raise


def help_table(*, llm: bool) -> Table:
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for usage, what in C.HELP:
        # Text, not markup: rich would take "[n=800]" for a style tag and print nothing in its place.
        table.add_row(Text(usage), Text(what))
    table.caption = ("Words without a slash go to the LLM planner, which runs tools and answers with evidence."
                     if llm else "No LLM configured: words are not understood; start with --llm MODEL for that.")
    return table


def banner(label: str, budget: int, transcript: str, planner: str | None) -> Text:
    who = f"LLM planner: {planner}" if planner else "no LLM (slash commands)"
    return Text.assemble(("sleuth chat", "bold"), f" — class {label!r}, budget {budget:,} images, {who}.\n",
                         ("Type /help for commands, /quit to leave. Transcript: ", "dim"), (transcript, "dim"))

