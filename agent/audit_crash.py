"""Fault injection for crash tests: kill the process with SIGKILL at a chosen transcript write.

Set ``SLEUTH_CRASH_AT=MODE:KIND:N`` and the N-th event of kind KIND (``any`` counts every event) written by this
process ends it:

- ``after``: the line is written and synced, then the process is killed (the crash falls between two events);
- ``torn``: only the first half of the line is written, then the process is killed (a write cut short);
- ``unsynced``: the whole line is written but not synced, then the process is killed.

Without the variable nothing changes. Audits read it, so a test can crash a real ``sleuth audit`` subprocess at an
exact point and resume it.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sleuth.agent.transcript import TranscriptWriter

ENV = "SLEUTH_CRASH_AT"
MODES = ("after", "torn", "unsynced")


@dataclass
class CrashPlan:
    mode: str
    kind: str
    nth: int
    seen: int = 0

    @classmethod
    def parse(cls, spec: str) -> CrashPlan:
        parts = spec.split(":")
        if len(parts) != 3 or parts[0] not in MODES or not parts[2].isdigit() or int(parts[2]) < 1:
            raise ValueError(f"{ENV} must be MODE:KIND:N with MODE one of {', '.join(MODES)}, got {spec!r}")
        return cls(parts[0], parts[1], int(parts[2]))

    def due(self, data: bytes) -> bool:
        if self.kind != "any" and json.loads(data).get("kind") != self.kind:
            return False
        self.seen += 1
        return self.seen == self.nth

    def writer(self, path: str | Path, **kwargs: Any) -> TranscriptWriter:
        return _CrashingWriter(self, path, **kwargs)


class _CrashingWriter(TranscriptWriter):
    def __init__(self, plan: CrashPlan, path: str | Path, **kwargs: Any) -> None:
        self.plan = plan
        super().__init__(path, **kwargs)

    def _write_line(self, data: bytes) -> None:
        if not self.plan.due(data):
            super()._write_line(data)
            return
        if self.plan.mode == "torn":
            self._file.write(data[: len(data) // 2])
            self._file.flush()
        elif self.plan.mode == "unsynced":
            self._file.write(data)
            self._file.flush()
        else:
            super()._write_line(data)
        os.kill(os.getpid(), signal.SIGKILL)


def from_env() -> CrashPlan | None:
    spec = os.environ.get(ENV, "")
    return CrashPlan.parse(spec) if spec else None
