"""What the loop hands every tool call: the investigation, the artifact store, an LLM for text, a way to report
findings and a way to end the run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the agent's start-up imports this module; numpy and scipy wait until an investigation exists
    from sleuth.tools.artifacts import ArtifactStore
    from sleuth.tools.findings import Finding
    from sleuth.tools.investigation import Investigation


@dataclass
class ToolContext:
    """Shared by all tool calls of one run."""

    investigation: Investigation | None = None
    """The class under audit and everything its tools share; None in a run without one."""
    artifacts: ArtifactStore | None = None
    llm: Callable[[str], str] | None = None
    """A language model for tools that write text (caption perturbations); None offline."""
    on_finding: Callable[[Finding], None] | None = None
    """Called with each finding a tool records; the agent writes it to the transcript."""
    finished: bool = False
    """Set by a tool (``finish``) to end the run after the current call."""
    final_answer: str | None = None
