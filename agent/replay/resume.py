"""Continue a recorded run: resume its own transcript after a crash, or fork it into a new one from event N.

Both rebuild the investigation by running the recorded calls again (``replay.rebuild``), bring the planner to the
point the transcript reached (``planners.replay.fast_forward``), finish the turn a crash cut short, and then
hand over to the ordinary loop (``runner.Runner``). A resumed run writes exactly the events an uninterrupted run
would have written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sleuth.agent.errors import RebuildError
from sleuth.agent.events import ErrorEvent, Event, PlannerTurn, RunFinished, RunStarted, ToolReturned
from sleuth.agent.planners import max_turns as planner_max_turns
from sleuth.agent.planners.replay import Divergence, fast_forward
from sleuth.agent.replay.rebuild import RecordedCall, Skipped, compare, rerun_calls, session_for
from sleuth.agent.runner import Outcome, Planner, Runner, RunResult
from sleuth.agent.session import Session
from sleuth.agent.transcript import TranscriptWriter, read_transcript
from sleuth.tools.backends.base import Backends

FINAL = ("completed", "error", "max_turns", "budget_spent", "time_limit")
"""Statuses that end a run for good; an ``interrupted`` run (Ctrl-C) is resumed like a killed one."""


@dataclass
class Continued:
    """What continuing a run did."""

    transcript: Path
    result: RunResult
    recovered_events: int = 0
    """Events found in the transcript before continuing."""
    torn_path: Path | None = None
    """Where a torn last line (a write cut by the crash) was moved; its event was written again."""
    torn_bytes: int = 0
    rerun_calls: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    fast_forwarded: int = 0
    completed_calls: int = 0
    """Calls of the interrupted turn run after the rebuild."""
    already_finished: bool = False
    divergence: Divergence | None = None
    """Fork only: where the new planner stopped agreeing with the recording (it then started afresh)."""


def _run_result(events: Sequence[Event]) -> RunResult:
    last = events[-1]
    assert isinstance(last, RunFinished)
    return RunResult(status=last.status, answer=last.answer, n_turns=sum(e.kind == "planner_turn" for e in events),
                     events=len(events))


def _finished(events: Sequence[Event]) -> bool:
    return bool(events) and isinstance(events[-1], RunFinished) and events[-1].status in FINAL


def continue_run(session: Session, planner: Planner, *, max_turns: int | None = None,
                 fresh_planner: Callable[[], Planner] | None = None,
                 progress: Callable[[str, int, int], None] | None = None) -> Continued:
    """Run ``session`` to its end, continuing whatever its transcript already holds (possibly nothing).

    ``fresh_planner``: when given (forks), a planner that does not reproduce the recorded turns is replaced by a
    fresh one that starts from the rebuilt state; without it (resume) that is an error.
    """
    max_turns = max_turns or planner_max_turns(session.config.planner)
    with TranscriptWriter(session.transcript, resume=True) as writer:
        events = list(writer.events)
        info = Continued(transcript=session.transcript, result=RunResult(status="completed"),
                         recovered_events=len(events), torn_path=writer.torn_path,
                         torn_bytes=writer.torn_path.stat().st_size if writer.torn_path else 0)
        if events and not isinstance(events[0], RunStarted):
            raise RebuildError("the transcript does not begin with run_started", line=1)
        rebuilt = rerun_calls(events, session, strict=True, progress=progress)
        info.rerun_calls, info.skipped = rebuilt.calls, rebuilt.skipped
        runner = session.runner(writer)
        if _finished(events):
            info.already_finished = True
            info.result = _run_result(events)
            return info
        if not events:
            info.result = runner.run(planner, max_turns=max_turns, run_started=session.started_event(planner.name))
            return info
        if isinstance([e for e in events if not isinstance(e, RunFinished)][-1], ErrorEvent):
            # The run had already failed (a planner error or a bug) and was cut before it could say so.
            runner.finish("error")
            info.result = _run_result(writer.events)
            return info
        n_ff, divergence = fast_forward(planner, events)
        if divergence is not None:
            if fresh_planner is None:
                raise RebuildError("the planner does not reproduce the recorded turn; it cannot continue this run "
                                   f"({divergence.describe()})", line=divergence.line)
            planner, info.divergence = fresh_planner(), divergence
        info.fast_forwarded = n_ff
        with runner.guard():
            runner.place_modes()
            info.completed_calls = _finish_turn(events, rebuilt.pending, session, runner)
        done = _end_of_turn(events, session)
        if done is not None:
            runner.finish("completed", done)
            info.result = _run_result(writer.events)
            return info
        info.result = runner.run(planner, max_turns=max_turns, turns_taken=sum(isinstance(e, PlannerTurn)
                                                                               for e in events))
        return info


def _last_turn(events: Sequence[Event]) -> PlannerTurn | None:
    for e in reversed(events):
        if isinstance(e, PlannerTurn):
            return e
    return None


def _end_of_turn(events: Sequence[Event], session: Session) -> str | None:
    """The answer when the last recorded turn ended the run (``finish`` ran, or a final answer), else None."""
    if session.ctx.finished:
        return session.ctx.final_answer or ""
    last = _last_turn(events)
    if last is not None and last.final is not None and not last.tool_calls:
        return last.final
    return None


def _finish_turn(events: Sequence[Event], pending: list[RecordedCall], session: Session, runner: Runner) -> int:
    """Run the calls of the last planner turn that have no recorded result, as the loop would have. Returns how many.

    A call whose start was written gets only its result; findings it had written before the crash are not written
    twice (they must be reproduced, in order, by the re-run).
    """
    last = _last_turn(events)
    if last is None or session.ctx.finished:
        return 0
    index = events.index(last)
    returned = {e.call_id for e in events[index:] if isinstance(e, ToolReturned)}
    started = {p.called.call_id: p for p in pending if p.called is not None and p.called.seq > last.seq}
    n = 0
    for call in last.tool_calls:
        if call.id in returned:
            if session.ctx.finished:
                break
            continue
        partial = started.get(call.id)
        check = None
        if partial is not None:
            def check(outcome: Outcome, partial: RecordedCall = partial, name: str = call.name) -> None:
                found = [d for d in compare(partial, outcome, runner.registry)
                         if d.kind not in ("identical", "equivalent")]
                if found:
                    raise RebuildError(f"re-running the interrupted {name} call disagrees with what it had written "
                                       f"({found[0].path})", line=found[0].line)
        runner.call_tool(call, announced=partial is not None, findings_written=len(partial.findings) if partial else 0,
                         check=check)
        n += 1
        if session.ctx.finished:
            break
    return n


# -- forks -------------------------------------------------------------------------------------------------


def fork_point(events: Sequence[Event], n: int) -> int:
    """How many leading events a fork at line ``n`` keeps: ``n``, cut back so the prefix ends between turns.

    The new planner takes over at a planner turn, so a prefix never ends inside one; the run's own end
    (``run_finished``) is never kept.
    """
    if n < 1:
        raise ValueError(f"a fork keeps at least the first line (run_started), got {n}")
    starts = [i for i, e in enumerate(events) if isinstance(e, PlannerTurn) and i <= n]
    if starts:
        return starts[-1]
    first_other = next((i for i, e in enumerate(events) if isinstance(e, (RunFinished, ErrorEvent))), len(events))
    return max(1, min(n, first_other))


def fork_run(source: Path, n: int, out_dir: Path, make_planner: Callable[[Session], Planner], *,
             backends: Backends | None = None, max_turns: int | None = None,
             progress: Callable[[str, int, int], None] | None = None,
             subscribers: Sequence[Callable[[Any], None]] = ()) -> Continued:
    """Copy the first lines of ``source`` (cut back to a turn boundary) into ``out_dir`` and continue with a new
    planner. The prefix lines are copied byte for byte, so both transcripts share them, hash chain included."""
    events = read_transcript(source)
    if not events or not isinstance(events[0], RunStarted):
        raise RebuildError("the transcript does not begin with run_started", line=1)
    keep = fork_point(events, n)
    target = out_dir / "transcript.jsonl"
    if target.exists() and target.stat().st_size:
        raise FileExistsError(f"{target} already holds a transcript")
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = source.read_bytes().split(b"\n")[:keep]
    with open(target, "wb") as f:
        f.write(b"".join(line + b"\n" for line in lines))
        f.flush()
        os.fsync(f.fileno())
    session = session_for(events[0], out_dir, backends=backends, progress=progress)
    session.subscribers.extend(subscribers)
    planner = make_planner(session)
    _write_json(out_dir / "fork.json", {"source": str(source), "source_lines": len(events), "kept_lines": keep,
                                        "asked_line": n, "last_kept_hash": events[keep - 1].hash,
                                        "planner": planner.name})
    return continue_run(session, planner, max_turns=max_turns, progress=progress,
                        fresh_planner=lambda: make_planner(session))


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)
