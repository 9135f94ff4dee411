"""Planners written as a script: a generator that yields turns and is sent the typed results of their calls.

The offline planners (protocol, wiles, random) are procedures, so they read best as straight-line code: each
``yield`` is one turn, and its value is the list of what the turn's calls returned, each read back into its tool's
``Result`` (or a ``CallFailed`` with the tool's error). The same results give the same turns, so resume and fork can
fast-forward such a planner through a recording.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from sleuth.agent.errors import PlannerError
from sleuth.agent.events import Event, ToolCall
from sleuth.agent.runner import Turn
from sleuth.agent.view import InvestigationView


@dataclass(frozen=True)
class CallFailed:
    """A call of the turn that returned an error (or a result this sleuth cannot read)."""

    error: str


Results = list[Any]
"""What a turn's calls returned, in call order: tool ``Result`` models or ``CallFailed``."""
Script = Generator[Turn, Results, None]
R = TypeVar("R", bound=BaseModel)


def ok(result: Any, kind: type[R]) -> R | None:
    """``result`` when it is a ``kind`` (the call succeeded), else None."""
    return result if isinstance(result, kind) else None


def last_results(view: InvestigationView) -> Results:
    """Results of the calls made in the latest planner turn, in call order."""
    return [r.result if r.result is not None else CallFailed(r.event.error or "the result could not be read")
            for r in view.latest]


class ScriptPlanner:
    """Base of the scripted planners: subclasses write ``script()``."""

    deterministic = True
    """The same tool results give the same turns: resume and fork can fast-forward it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.model = name
        """Written as the turns' ``model``: which planner took them (its name in the planner registry)."""
        self._script: Script | None = None
        self._calls = 0
        self._view: InvestigationView | None = None

    def script(self) -> Script:
        raise NotImplementedError

    def images_left(self) -> int | None:
        """Images left in the budget after the latest call that reported it (None before any did)."""
        return self._view.images_left if self._view is not None else None

    def next_turn(self, events: Sequence[Event]) -> Turn:
        view = self._view = self._view.extend(events) if self._view is not None else \
            InvestigationView.from_events(events)
        if self._script is None:
            self._script = self.script()
            return next(self._script)
        try:
            return self._script.send(last_results(view))
        except StopIteration:  # e.g. its closing summary was refused: an error of the planner's, not a crash
            raise PlannerError(f"the {self.name} procedure has ended without a summary the tools accepted "
                               f"({'; '.join(r.error for r in last_results(view) if isinstance(r, CallFailed))})"
                               ) from None

    def call(self, name: str, **arguments: Any) -> ToolCall:
        self._calls += 1
        return ToolCall(id=f"call_{self._calls}", name=name, arguments=arguments)

    def turn(self, reasoning: str, *calls: ToolCall) -> Turn:
        return Turn(reasoning=reasoning, tool_calls=list(calls), model=self.model)

    def finish(self, summary: str) -> Turn:
        return self.turn(summary, self.call("finish", summary=summary))
