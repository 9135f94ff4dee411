"""Budgets an audit enforces around a planner: wall time and LLM cost (images are the investigation's own budget).

``BudgetedPlanner`` asks the wrapped planner for turns while the budgets last; once one is spent it answers in the
planner's place with a ``finish`` turn (``model="budget"``), so the run ends cleanly, with every finding recorded so
far kept. Budgets are checked between turns: a tool call under way is never cut.

``Clock`` keeps each class's active seconds in its class directory, so time spent dead after a crash is not charged
to the resumed audit.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sleuth.agent.events import Event, ToolCall
from sleuth.agent.runner import Planner, Turn
from sleuth.agent.view import BUDGET_MODEL, InvestigationView


def cost_of(events: Sequence[Event]) -> float:
    """LLM cost of a run: the planner's turns and the tools' own requests (e.g. perturbations)."""
    return float(InvestigationView.from_events(events).cost_usd or 0.0)


class BudgetedPlanner:
    """``wrapped`` plans; this stops it when the class's wall time or LLM cost is spent."""

    def __init__(self, wrapped: Planner, *, seconds_left: Callable[[], float | None] = lambda: None,
                 cost_limit: float | None = None) -> None:
        self.wrapped = wrapped
        self.name = wrapped.name
        self.seconds_left = seconds_left
        self.cost_limit = cost_limit
        """Most this class's turns may cost (already the lesser of the class and the audit's remaining limit)."""
        self._view: InvestigationView | None = None

    def exhausted(self, events: Sequence[Event]) -> str | None:
        left = self.seconds_left()
        if left is not None and left <= 0:
            return "the wall-time budget is spent"
        if self.cost_limit is not None and float(self.view(events).cost_usd or 0.0) >= self.cost_limit:
            return f"the LLM cost budget (${self.cost_limit:.4g}) is spent"
        return None

    def view(self, events: Sequence[Event]) -> InvestigationView:
        self._view = self._view.extend(events) if self._view is not None else InvestigationView.from_events(events)
        return self._view

    def next_turn(self, events: Sequence[Event]) -> Turn:
        reason = self.exhausted(events)
        if reason is None:
            return self.wrapped.next_turn(events)
        n = self.view(events).finding_events
        summary = (f"Stopped early: {reason}. {n} finding{'s' * (n != 1)} recorded before the stop stand; "
                   "hypotheses not yet confirmed were not recorded.")
        return Turn(reasoning=summary, model=BUDGET_MODEL,
                    tool_calls=[ToolCall(id=f"budget_stop_{len(events)}", name="finish",
                                         arguments={"summary": summary})])


def stopped_by(events: Sequence[Event]) -> str | None:
    """The budget that ended a run, from the turn written in the planner's place, or None."""
    return InvestigationView.from_events(events).budget_stop


class Clock:
    """Active seconds per class, each kept in its class directory (``RUN_DIR/<class>/clock.json``) and saved
    atomically at most once a second, so a crash loses at most a second.

    One file per class, because classes may run at once in several processes (``--executor ray``): each writes only
    its own. ``RUN_DIR/clock.json``, where audits kept every class's seconds before, is still read.
    """

    def __init__(self, run_dir: Path, now: Callable[[], float] = time.monotonic) -> None:
        self.run_dir = run_dir
        self.now = now
        self.seconds: dict[str, float] = {}
        self.refresh()
        self._key: str | None = None
        self._start = 0.0
        self._before = 0.0
        self._saved = 0.0

    def refresh(self) -> None:
        """Read every class's seconds from disk (another process may have written them)."""
        legacy = self.run_dir / "clock.json"
        if legacy.is_file():
            self.seconds.update({str(k): float(v) for k, v in json.loads(legacy.read_text()).items()})
        for path in sorted(self.run_dir.glob("*/clock.json")):
            self.seconds[path.parent.name] = float(json.loads(path.read_text())["seconds"])

    def _path(self, key: str) -> Path:
        return self.run_dir / key / "clock.json"

    def start(self, key: str) -> None:
        path = self._path(key)
        if path.is_file():  # the class may have run (and been killed) in another process
            self.seconds[key] = float(json.loads(path.read_text())["seconds"])
        self._key, self._start, self._before = key, self.now(), self.seconds.get(key, 0.0)

    def stop(self) -> None:
        self.tick(force=True)
        self._key = None

    def of(self, key: str) -> float:
        if key == self._key:
            return self._before + self.now() - self._start
        return self.seconds.get(key, 0.0)

    def total(self) -> float:
        return sum(self.of(k) for k in {*self.seconds, *([self._key] if self._key else [])})

    def tick(self, *_: object, force: bool = False) -> None:
        if self._key is None:
            return
        self.seconds[self._key] = self.of(self._key)
        if force or self.now() - self._saved >= 1.0:
            path = self._path(self._key)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps({"seconds": self.seconds[self._key]}))
            os.replace(tmp, path)
            self._saved = self.now()
