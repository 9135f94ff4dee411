"""A planner that plays a fixed script: for tests and demonstrations of the loop without a model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sleuth.agent.errors import PlannerError
from sleuth.agent.events import Event
from sleuth.agent.runner import Turn

Step = Turn | Callable[[Sequence[Event]], Turn]


class ScriptedPlanner:
    """Returns its turns in order; a callable step is given the events so far and may inspect them."""

    name = "scripted"

    def __init__(self, turns: Sequence[Step]) -> None:
        self.turns = list(turns)
        self.position = 0

    def next_turn(self, events: Sequence[Event]) -> Turn:
        if self.position >= len(self.turns):
            raise PlannerError(f"the script has only {len(self.turns)} turns")
        step = self.turns[self.position]
        self.position += 1
        return step(events) if callable(step) else step
