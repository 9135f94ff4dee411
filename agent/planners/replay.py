"""Recorded planner turns: a planner that plays them back, and the fast-forward of a live planner through them.

``ReplayPlanner`` returns the turns a transcript recorded, in order, then hands over to another planner (or stops),
so a recorded session, LLM sessions included, runs again without any model or API key.

``fast_forward`` brings a live planner to the point a transcript reached. Planners with a procedure of their own
(the protocol planner's generator, a script) hold state that only replaying the history rebuilds: they are asked
for each recorded turn again, and their answer must match the recording. Planners that read everything from the
events (an LLM's conversation) need nothing, and asking them would call the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sleuth.agent.errors import PlannerError
from sleuth.agent.events import Event, PlannerTurn
from sleuth.agent.runner import Planner, Turn
from sleuth.agent.view import BUDGET_MODEL

OFFLINE_MODULES = ("sleuth.agent.planners.protocol", "sleuth.agent.planners.protocol_v1",
                   "sleuth.agent.planners.protocol_v2", "sleuth.agent.planners.scripted",
                   "sleuth.agent.planners.random_perturb")


def turn_of(event: PlannerTurn) -> Turn:
    return Turn(reasoning=event.reasoning, tool_calls=list(event.tool_calls), final=event.final, model=event.model,
                usage=event.usage, cost_usd=event.cost_usd)


def recorded_turns(events: Sequence[Event]) -> list[tuple[int, Turn]]:
    """(event index, turn) of every planner turn."""
    return [(i, turn_of(e)) for i, e in enumerate(events) if isinstance(e, PlannerTurn)]


def holds_state(planner: Planner) -> bool:
    """Whether ``planner`` must be driven through recorded turns to reach their state.

    A planner says so with a boolean ``deterministic`` attribute; otherwise the offline planners of this package do,
    and any other planner (an LLM planner rebuilding its conversation from the events) does not.
    """
    flag = getattr(planner, "deterministic", None)
    if isinstance(flag, bool):
        return flag
    return type(planner).__module__ in OFFLINE_MODULES


def same_turn(a: Turn, b: Turn) -> bool:
    """Turns that act alike: the same calls (id, tool, arguments) and the same final answer; wording may differ."""
    calls_a = [(c.id, c.name, c.arguments) for c in a.tool_calls]
    calls_b = [(c.id, c.name, c.arguments) for c in b.tool_calls]
    return calls_a == calls_b and (a.final is None) == (b.final is None)


@dataclass
class Divergence:
    line: int
    """1-based transcript line of the recorded turn the planner did not reproduce."""
    recorded: Turn
    produced: Turn

    def describe(self) -> str:
        def calls(t: Turn) -> str:
            return ", ".join(f"{c.name}({c.arguments})" for c in t.tool_calls)[:160] or f"final {t.final!r}"[:160]
        return f"line {self.line}: recorded {calls(self.recorded)}; the planner now says {calls(self.produced)}"


def innermost(planner: Planner) -> Planner:
    """The planner behind any wrappers (a wrapper names what it wraps in ``wrapped``)."""
    while getattr(planner, "wrapped", None) is not None:
        planner = planner.wrapped  # type: ignore[attr-defined]
    return planner


def fast_forward(planner: Planner, events: Sequence[Event]) -> tuple[int, Divergence | None]:
    """Ask a state-holding planner for every recorded turn again; returns (turns replayed, first divergence).

    Wrappers (budget guards) are looked through: their checks belong to the live run, not to its replay. Turns the
    audit wrote for a planner (budget stops) are not asked. A planner that holds no state is left alone. At a
    divergence the planner's state no longer matches the transcript: the caller decides what to do.
    """
    planner = innermost(planner)
    if not holds_state(planner):
        return 0, None
    n = 0
    for index, recorded in recorded_turns(events):
        if recorded.model == BUDGET_MODEL:
            continue
        produced = planner.next_turn(tuple(events[:index]))
        if not same_turn(recorded, produced):
            return n, Divergence(line=index + 1, recorded=recorded, produced=produced)
        n += 1
    return n, None


class ReplayPlanner:
    """Plays recorded turns in order, then hands over to ``then`` (or ends: a ``PlannerError`` after the last)."""

    deterministic = False
    """Its turns come from the recording it was given, not from the history: nothing to fast-forward."""

    def __init__(self, turns: Sequence[Turn], then: Planner | None = None, *, name: str = "replay") -> None:
        self.turns = list(turns)
        self.then = then
        self.position = 0
        self.name = name

    @classmethod
    def from_events(cls, events: Sequence[Event], *, after: int = 0, then: Planner | None = None) -> ReplayPlanner:
        """Replay the turns recorded at event index ``after`` or later."""
        return cls([t for i, t in recorded_turns(events) if i >= after], then)

    @property
    def remaining(self) -> int:
        return len(self.turns) - self.position

    def next_turn(self, events: Sequence[Event]) -> Turn:
        if self.position < len(self.turns):
            turn = self.turns[self.position]
            self.position += 1
            return turn
        if self.then is None:
            raise PlannerError(f"the recording has no turn after its {len(self.turns)} recorded ones")
        return self.then.next_turn(events)
