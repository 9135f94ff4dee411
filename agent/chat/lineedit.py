"""Line editing and history for `sleuth chat` at a terminal, through the standard library's ``readline``.

With ``readline`` loaded, ``input()`` gives arrow-key editing and Up/Down through earlier lines (without it, Up
prints ``^[[A``). History persists in ``$SLEUTH_CHAT_HISTORY``, else ``$XDG_CACHE_HOME/sleuth/chat_history``, else
``~/.cache/sleuth/chat_history``, bounded to ``HISTORY_LINES`` lines and readable by its owner only. When stdin is
not a terminal (a pipe, a test) or ``readline`` is missing (Windows), lines are read plainly and no file is touched.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType

HISTORY_LINES = 1000


def history_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("SLEUTH_CHAT_HISTORY"):
        return Path(env["SLEUTH_CHAT_HISTORY"]).expanduser()
    cache = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return cache / "sleuth" / "chat_history"


def load_history(rl: ModuleType, path: Path, limit: int = HISTORY_LINES) -> int:
    """Put the lines of ``path`` into ``rl``'s history (none when the file is missing or unreadable); returns how many
    the history holds."""
    rl.set_history_length(limit)
    with contextlib.suppress(OSError):
        rl.read_history_file(str(path))
    return int(rl.get_current_history_length())


def save_history(rl: ModuleType, path: Path, limit: int = HISTORY_LINES) -> bool:
    """Write ``rl``'s history (its last ``limit`` lines) to ``path``; False when it cannot be written (the chat goes on
    without it)."""
    rl.set_history_length(limit)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        rl.write_history_file(str(path))
        os.chmod(path, 0o600)  # what a user typed is theirs alone
    except OSError:
        return False
    return True


def _readline() -> ModuleType | None:
    try:
        import readline
    except ImportError:
        return None
    return readline


@contextlib.contextmanager
def line_reader(fallback: Callable[[str], str], *, path: Path | None = None,
                interactive: bool | None = None) -> Iterator[Callable[[str], str]]:
    """A function reading one line after a prompt: ``input`` with readline's editing and a history file at a
    terminal, else ``fallback``. The history is saved on the way out."""
    tty = sys.stdin.isatty() if interactive is None else interactive
    rl = _readline() if tty else None
    if rl is None:
        yield fallback
        return
    where = history_path() if path is None else path
    load_history(rl, where)
    try:
        # input() itself, given the prompt, so readline knows where the line starts when it redraws it.
        yield input
    finally:
        save_history(rl, where)
