"""What the loop hands every tool call: the artifact store, a way to end the run, and a channel for reports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sleuth.tools.artifacts import ArtifactStore


@dataclass
class ToolContext:
    """Shared by all tool calls of one run. A plain dataclass: later layers add their own attributes."""

    artifacts: ArtifactStore | None = None
    finished: bool = False
    """Set by a tool (``finish``) to end the run after the current call."""
    final_answer: str | None = None
    emit: Callable[[object], None] | None = None
    """Lets a tool report progress or ask for a finding to be recorded; the agent decides what to do with it."""
    extra: dict[str, Any] = field(default_factory=dict)
