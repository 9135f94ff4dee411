"""Fault injection for crash tests: run the sleuth command line and SIGKILL it at a chosen transcript write.

    SLEUTH_CRASH_AT=MODE:KIND:N python -m tests.crash audit CONFIG --out DIR

The N-th event of kind KIND (``any`` counts every event) written by this process ends it:

- ``after``: the line is written and synced, then the process is killed (the crash falls between two events);
- ``torn``: only the first half of the line is written, then the process is killed (a write cut short);
- ``unsynced``: the whole line is written but not synced, then the process is killed.

This module lives with the tests: the command line itself has no crash hook.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass

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

    def install(self) -> None:
        """Make every transcript write of this process go through the plan."""
        write = TranscriptWriter._write_line
        plan = self

        def crashing(writer: TranscriptWriter, data: bytes) -> None:
            if not plan.due(data):
                write(writer, data)
                return
            if plan.mode == "torn":
                writer._file.write(data[: len(data) // 2])
                writer._file.flush()
            elif plan.mode == "unsynced":
                writer._file.write(data)
                writer._file.flush()
            else:
                write(writer, data)
            os.kill(os.getpid(), signal.SIGKILL)

        TranscriptWriter._write_line = crashing  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    spec = os.environ.get(ENV, "")
    if spec:
        CrashPlan.parse(spec).install()
    from sleuth.agent.cli import main as sleuth_main

    return sleuth_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
