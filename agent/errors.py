"""The errors the agent side raises for people and planners to act on (bugs are plain exceptions)."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user (a flag, a config, a class name): printed as one line, exit code 2, no traceback."""


class PlannerError(Exception):
    """The planner's model misbehaved beyond its retries (no usable turn); ends a run with status error."""


class RebuildError(Exception):
    """A recorded run cannot be rebuilt faithfully (changed backends, a result that no longer reproduces)."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(f"line {line}: {message}" if line is not None else message)
        self.line = line


class AuditError(Exception):
    """An audit's run directory cannot be started or resumed as asked."""
