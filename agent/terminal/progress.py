"""Progress bars for long tool work, fed by the (task, done, total) callbacks tools report."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn


class ProgressBars:
    """One bar per task name; a bar restarts when a new piece of work of that name begins."""

    def __init__(self, console: Console, *, enabled: bool = True) -> None:
        self.console = console
        self.enabled = enabled
        self._progress = Progress(
            TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, transient=True, disable=not enabled,
        )
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> ProgressBars:
        self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._progress.stop()

    def update(self, task: str, done: int, total: int, *, key: str | None = None) -> None:
        """Advance the bar of ``task`` (or of ``key``, whose description becomes ``task``: a bar whose words
        change as it goes)."""
        if not self.enabled:
            return
        name = key or task
        tid = self._tasks.get(name)
        if tid is None:
            tid = self._tasks[name] = self._progress.add_task(task, total=total)
        self._progress.update(tid, completed=done, total=total, visible=done < total, description=task)

    def print(self, renderable: RenderableType) -> None:
        self._progress.console.print(renderable)
