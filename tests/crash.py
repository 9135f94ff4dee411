"""Fault injection for crash tests: run the sleuth command line and SIGKILL it at a chosen transcript write.

    SLEUTH_CRASH_AT=MODE:KIND:N python -m tests.crash audit CONFIG --out DIR

The N-th event of kind KIND (``any`` counts every event) written by this process ends it:

- ``after``: the line is written and synced, then the process is killed (the crash falls between two events);
- ``torn``: only the first half of the line is written, then the process is killed (a write cut short);
- ``unsynced``: the whole line is written but not synced, then the process is killed.

With ``SLEUTH_CRASH_ONCE=PATH``, only the first process that reaches its crash point is killed (it creates PATH);
the others, such as the worker Ray starts in a killed one's place, run on. ``install_from_env`` installs the plan in
Ray's worker processes (``runtime_env={"worker_process_setup_hook": "tests.crash.install_from_env"}``).

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
ONCE = "SLEUTH_CRASH_ONCE"
MODES = ("after", "torn", "unsynced")


@dataclass
class CrashPlan:
    mode: str
    kind: str
    nth: int
    seen: int = 0
    once: str | None = None

    @classmethod
    def parse(cls, spec: str) -> CrashPlan:
        parts = spec.split(":")
        if len(parts) != 3 or parts[0] not in MODES or not parts[2].isdigit() or int(parts[2]) < 1:
            raise ValueError(f"{ENV} must be MODE:KIND:N with MODE one of {', '.join(MODES)}, got {spec!r}")
        return cls(parts[0], parts[1], int(parts[2]), once=os.environ.get(ONCE) or None)

    def due(self, data: bytes) -> bool:
        if self.kind != "any" and json.loads(data).get("kind") != self.kind:
            return False
        self.seen += 1
        return self.seen == self.nth

    def first(self) -> bool:
        """Whether this process is the one to crash (always, unless the plan is once and another process was)."""
        if self.once is None:
            return True
        try:
            with open(self.once, "x") as f:
                f.write(str(os.getpid()))
        except FileExistsError:
            return False
        return True

    def install(self) -> None:
        """Make every transcript write of this process go through the plan."""
        write = TranscriptWriter._write_line
        plan = self

        def crashing(writer: TranscriptWriter, data: bytes) -> None:
            if not plan.due(data) or not plan.first():
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


def install_from_env() -> None:
    """Install the plan ``SLEUTH_CRASH_AT`` names in this process (a Ray worker's set-up hook); none if unset."""
    spec = os.environ.get(ENV, "")
    if spec:
        CrashPlan.parse(spec).install()


def main(argv: list[str]) -> int:
    spec = os.environ.get(ENV, "")
    if spec:
        CrashPlan.parse(spec).install()
    from sleuth.agent.cli import main as sleuth_main

    return sleuth_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
