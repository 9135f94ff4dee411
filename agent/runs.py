"""The runs under a folder, one row each, read from their transcripts without rebuilding them.

A row reads a transcript's first line (``run_started``: class, command, planner, budget), its ``mode`` lines (the
failure modes), its ``tool_returned`` lines' images left (the images used) and its last line (``run_finished``:
status and findings). Only those lines are parsed, so a 20,000-image transcript is read in a fraction of a second.
Investigations and chats sit at ``ROOT/<run>/transcript.jsonl``, audit classes at ``ROOT/<audit>/<class>/...``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

TRANSCRIPT = "transcript.jsonl"


@dataclass(frozen=True)
class RunRow:
    path: str
    """The run's directory."""
    label: str
    command: str
    planner: str
    status: str
    """The run's end (completed, budget_spent, error, ...), or 'running / cut' when it has none yet."""
    modes: int
    findings: int
    images: int
    budget: int | None
    started: str
    """When it started (ISO 8601, UTC)."""
    seconds: float | None
    """From its first line to its last."""
    audit: str | None = None
    """The audit (directory name) a class run belongs to."""

    def json(self) -> dict[str, Any]:
        return asdict(self)


def read_run(transcript: Path, audit: str | None = None) -> RunRow | None:
    """The row of one transcript, or None when its first line is not a run's start."""
    first: dict[str, Any] | None = None
    finished: dict[str, Any] | None = None
    modes: set[str] = set()
    found: set[str] = set()
    left: int | None = None
    ts: str | None = None
    try:
        with open(transcript, "rb") as f:
            for raw in f:
                if not raw.endswith(b"\n"):
                    break  # a line a crash tore
                head = raw[:40]
                ts = _ts(raw) or ts
                try:
                    if first is None:
                        first = json.loads(raw)
                    elif head.startswith(b'{"kind":"mode"'):
                        modes.add(str(json.loads(raw).get("mode_id", "")))
                    elif head.startswith(b'{"kind":"finding"'):
                        found.add(str(json.loads(raw).get("finding_id", "")))
                    elif head.startswith(b'{"kind":"tool_returned"') and b'"images_left":' in raw:
                        left = json.loads(raw).get("images_left", left)
                    finished = json.loads(raw) if head.startswith(b'{"kind":"run_finished"') else None
                except json.JSONDecodeError:
                    continue
    except OSError:
        return None
    if first is None or first.get("kind") != "run_started":
        return None
    config = first.get("config") or {}
    budget = config.get("budget")
    return RunRow(
        path=str(transcript.parent), label=str(config.get("class", "?")), command=str(first.get("command", "?")),
        planner=str(first.get("planner", "?")),
        status=str(finished["status"]) if finished is not None else "running / cut",
        modes=len(modes), findings=int(finished.get("n_findings", 0)) if finished is not None else len(found),
        images=(budget - left) if isinstance(budget, int) and isinstance(left, int) else 0, budget=budget,
        started=str(first.get("ts", "")), seconds=_seconds(first.get("ts"), ts), audit=audit)


def _ts(raw: bytes) -> str | None:
    """A line's timestamp, read without parsing the line (events write ``"ts":"..."`` among their first fields)."""
    i = raw.find(b'"ts":"')
    if i < 0:
        return None
    end = raw.find(b'"', i + 6)
    return raw[i + 6:end].decode() if end > 0 else None


def _seconds(start: str | None, end: str | None) -> float | None:
    try:
        a, b = (datetime.fromisoformat(str(x).replace("Z", "+00:00")) for x in (start, end))
    except (TypeError, ValueError):
        return None
    return max(0.0, (b - a).total_seconds())


def find_runs(root: Path) -> list[RunRow]:
    """Every run under ``root`` (runs, chats, and the classes of audits), newest first."""
    rows: list[RunRow] = []
    if not root.is_dir():
        return rows
    for d in root.iterdir():
        if not d.is_dir():
            continue
        if (d / TRANSCRIPT).is_file():
            row = read_run(d / TRANSCRIPT)
            if row is not None:
                rows.append(row)
            continue
        for c in d.iterdir() if (d / "audit.json").is_file() or (d / "summary.json").is_file() else ():
            if c.is_dir() and (c / TRANSCRIPT).is_file():
                row = read_run(c / TRANSCRIPT, audit=d.name)
                if row is not None:
                    rows.append(row)
    return sorted(rows, key=lambda r: (r.started, r.path), reverse=True)
