"""Rebuild an investigation from its transcript by running the recorded tool calls again, and check their results.

Tools are deterministic given the backends, the prompt and the seed, and an investigation hands out seeds in call
order, so running the recorded calls again, in order, on a fresh investigation reproduces both its state (images
spent, baselines, the family of tests, findings) and every result. ``verify_run`` compares those results with the
recorded ones; resuming and forking (``replay.resume``) use the rebuilt state to continue.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from sleuth.agent.config import RunConfig
from sleuth.agent.errors import RebuildError
from sleuth.agent.events import ErrorEvent, Event, Finding, RunStarted, ToolCalled, ToolReturned
from sleuth.agent.replay.verify import (
    ACCEPTED,
    MAX_REPORTED,
    ORDER,
    Difference,
    Found,
    ImageStores,
    Kind,
    compare_outcomes,
    diff_values,
    inconsistencies,
    short,
    worst,
)
from sleuth.agent.runner import Outcome, execute
from sleuth.agent.session import Session
from sleuth.agent.transcript import TranscriptError, artifacts_dir, read_transcript, verify_transcript
from sleuth.tools import investigation_tools
from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.backends.base import Backends
from sleuth.tools.backends.specs import BackendSpecs
from sleuth.tools.registry import Registry, ToolError

Progress = Callable[[str, int, int], None]


class Skipped(BaseModel):
    line: int
    tool: str
    call_id: str
    reason: str


@dataclass
class RecordedCall:
    """One tool call as the transcript holds it: its start, the findings it reported, and how it ended."""

    called: ToolCalled | None
    returned: ToolReturned | None = None
    findings: list[Finding] = field(default_factory=list)
    bug: ErrorEvent | None = None
    """The call raised a bug: the run ended with this error event and no result."""

    @property
    def name(self) -> str:
        return self.called.name if self.called is not None else self.returned.name  # type: ignore[union-attr]

    @property
    def call_id(self) -> str:
        return self.called.call_id if self.called is not None else self.returned.call_id  # type: ignore[union-attr]

    @property
    def line(self) -> int:
        end = self.returned or self.bug or self.called
        return end.seq + 1  # type: ignore[union-attr]

    @property
    def complete(self) -> bool:
        return self.returned is not None or self.bug is not None


def recorded_calls(events: Sequence[Event]) -> list[RecordedCall]:
    """The tool calls of a transcript in execution order, each with the events that belong to it."""
    calls: list[RecordedCall] = []
    open_call: RecordedCall | None = None
    for e in events:
        if isinstance(e, ToolCalled):
            open_call = RecordedCall(called=e)
            calls.append(open_call)
        elif isinstance(e, Finding) and open_call is not None:
            open_call.findings.append(e)
        elif isinstance(e, ToolReturned):
            if open_call is not None and open_call.called is not None and open_call.called.call_id == e.call_id:
                open_call.returned = e
            else:  # a result without its start (a call the loop refused before running it)
                calls.append(RecordedCall(called=None, returned=e))
            open_call = None
        elif isinstance(e, ErrorEvent) and open_call is not None:
            open_call.bug = e
            open_call = None
        elif e.kind == "planner_turn":
            open_call = None
    return calls


def skip_reason(call: RecordedCall, reg: Registry) -> str | None:
    """Why a recorded call is not run again (its recorded result stands), or None."""
    if call.called is None:
        return "no tool_called event: nothing was run"
    if call.returned is None or not call.returned.ok or call.name not in reg:
        return None
    tool = reg.get(call.name)
    result = reg.result(call.name, call.returned.result)
    if tool.replayable is not None and result is not None and not tool.replayable(result):
        return "its output came from an LLM (a language model); the recorded result stands"
    return None


def _conclusions(reg: Registry, name: str) -> Any:
    """The tool's check of its conclusions on recorded and re-run results (validated into its ``Result``)."""
    tool = reg.get(name)
    if tool.conclusions is None:
        return None

    def check(recorded: dict[str, Any], replayed: dict[str, Any]) -> list[tuple[str, Any, Any]]:
        try:
            a, b = tool.result_model.model_validate(recorded), tool.result_model.model_validate(replayed)
        except ValidationError as e:
            return [("result", "<not a valid result>", e.errors()[0]["msg"])]
        return tool.conclusions(a, b)  # type: ignore[misc]

    return check


def compare(call: RecordedCall, outcome: Outcome, reg: Registry, images: ImageStores | None = None
            ) -> list[Difference]:
    """How a re-run differs from the recording of the same call, each difference classed (empty: identical)."""
    images = images or ImageStores()
    found: Found = []
    if call.bug is not None:
        if outcome.bug != call.bug.message:
            found.append(("different", "error", call.bug.message, outcome.bug or "<no error>",
                          "the recorded bug did not happen again" if outcome.bug is None else ""))
    elif call.returned is not None:
        if outcome.bug is not None:
            found.append(("different", "error", "<no error>", outcome.bug, "the call now raises a bug"))
        else:
            conclusions = _conclusions(reg, call.name) if call.name in reg else None
            found += compare_outcomes(call.returned.ok, call.returned.result if call.returned.ok else
                                      call.returned.error, outcome.ok,
                                      outcome.result if outcome.ok else outcome.error, conclusions, images)
    recorded = [{"finding_id": f.finding_id, "finding": f.finding} for f in call.findings]
    replayed = [{"finding_id": f.finding_id, "finding": f.model_dump(mode="json")} for f in outcome.findings]
    replayed = replayed if call.complete else replayed[: len(recorded)]
    if len(recorded) != len(replayed):  # a call cut short may have written only some of its findings
        found.append(("different", "findings.length", len(recorded), len(replayed), "findings recorded by the call"))
    else:
        diff_values(recorded, replayed, "findings", images, found)
    found.sort(key=lambda f: -ORDER[f[0]])
    return [Difference(line=call.line, tool=call.name, call_id=call.call_id, kind=k, path=p, recorded=a,
                       replayed=b, note=n) for k, p, a, b, n in found]


# -- sessions from recordings ----------------------------------------------------------------------------------


def recorded_config(started: RunStarted) -> RunConfig:
    """The ``RunConfig`` a ``run_started`` recorded."""
    if "class" not in started.config:
        raise RebuildError("run_started records no class under audit", line=1)
    try:
        return RunConfig.recorded(started.config)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "config"
        raise RebuildError(f"the recorded config is not valid: {where}: {err['msg']}", line=1) from None


def backend_specs(started: RunStarted) -> BackendSpecs:
    """The backends a run recorded."""
    return recorded_config(started).backends


def check_backends(started: RunStarted, backends: Backends) -> None:
    for role, recorded in started.backends.items():
        now = backends.ids.get(role)
        if now is not None and now != recorded:
            raise RebuildError(f"the run used {role} {recorded!r}, these backends have {now!r}; "
                               "results would not reproduce", line=1)


def session_for(started: RunStarted, run_dir: Path, *, backends: Backends | None = None,
                progress: Progress | None = None, command: str | None = None) -> Session:
    """A fresh session configured as the recorded one (class, seed, budget, criterion, alpha, backends, planner)."""
    config = recorded_config(started)
    if backends is None:
        backends = config.backends.build(progress, load=True)
    check_backends(started, backends)
    try:
        session = Session(backends=backends, config=config, run_dir=run_dir, progress=progress,
                          command=command or started.command, fresh=False)
    except ToolError as e:
        raise RebuildError(str(e), line=1) from None
    session.join_transcript(started)
    return session


@dataclass
class Rebuilt:
    """What re-running a transcript's complete calls gave."""

    calls: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    by_call: dict[str, int] = field(default_factory=lambda: {k: 0 for k in ORDER if k != "tampered"})
    """Calls re-run, by the class of their worst difference."""
    tampered: list[str] = field(default_factory=list)
    """Recorded results whose numbers contradict each other ('line N: ...')."""
    pending: list[RecordedCall] = field(default_factory=list)
    """Calls started but not finished (the run was killed during them)."""


def _alias_images(session: Session, images: ImageStores) -> None:
    """Recorded refs of images that re-rendered with other bytes point at the re-run images, so later recorded
    calls that name them (edits of an earlier image) find them."""
    gens = session.investigation.generations
    for recorded, replayed in images.aliases.items():
        if recorded not in gens and replayed in gens:
            gens[recorded] = gens[replayed]


def rerun_calls(events: Sequence[Event], session: Session, *, strict: bool, progress: Progress | None = None,
                images: ImageStores | None = None) -> Rebuilt:
    """Run every complete recorded call again on ``session``, in order, comparing outcomes.

    ``strict``: a difference beyond *equivalent* raises ``RebuildError`` (resume and fork cannot continue from a
    state that does not reproduce the recorded counts); otherwise differences are collected (verify).
    """
    out = Rebuilt()
    reg = investigation_tools()
    images = images or ImageStores(replayed=session.artifacts)
    calls = recorded_calls(events)
    for i, call in enumerate(calls):
        if progress is not None:
            progress("re-running tool calls", i, len(calls))
        if not call.complete:
            out.pending.append(call)
            continue
        if call.returned is not None and call.returned.ok:
            out.tampered += [f"line {call.line}: {call.name} ({call.call_id}): {x}"
                             for x in inconsistencies(call.returned.result)]
        reason = skip_reason(call, reg)
        if reason is not None:
            out.skipped.append(Skipped(line=call.line, tool=call.name, call_id=call.call_id, reason=reason))
            continue
        assert call.called is not None
        outcome = execute(reg, session.ctx, call.name, call.called.arguments, expect_bug=call.bug is not None)
        out.calls += 1
        found = compare(call, outcome, reg, images)
        _alias_images(session, images)
        kind = worst(d.kind for d in found)
        if strict and ORDER[kind] > ORDER["equivalent"]:
            first = found[0]
            raise RebuildError(f"{first.tool} no longer reproduces its recorded result ({first.kind}: {first.path}: "
                               f"recorded {short(first.recorded)}, now {short(first.replayed)}); the tools or "
                               "backends changed since the run, or this machine computes differently", line=first.line)
        out.by_call[kind] += 1
        out.differences += found[:MAX_REPORTED]
    if progress is not None:
        progress("re-running tool calls", len(calls), len(calls))
    return out


class VerifyResult(BaseModel):
    transcript: str
    status: Kind = Field(description="identical, equivalent, drifted (every conclusion held), different (a "
                                     "conclusion changed) or tampered (hash chain broken, or recorded numbers that "
                                     "contradict each other).")
    ok: bool = Field(description="True for identical, equivalent and drifted (with --strict: identical only).")
    events: int
    calls: int = Field(0, description="Tool calls run again and compared.")
    by_call: dict[str, int] = Field(default_factory=dict, description="Calls by the class of their worst difference.")
    skipped: list[Skipped] = Field(default_factory=list)
    differences: list[Difference] = Field(default_factory=list)
    tampered: list[str] = Field(default_factory=list, description="Recorded numbers that contradict each other.")
    chain_error: str | None = Field(None, description="First break of the hash chain, 'line N: reason'.")
    chain_line: int | None = None
    unfinished: int = Field(0, description="Calls with no recorded outcome (the run was cut during them).")
    seconds: float = 0.0

    def summary(self) -> str:
        """One line: how the calls compared and what that means."""
        parts = [f"{n} {k}" for k, n in self.by_call.items() if n]
        held = {"identical": "bit for bit", "equivalent": "within tolerance",
                "drifted": "counts drifted, every conclusion held", "different": "a CONCLUSION CHANGED",
                "tampered": "TAMPERED"}[self.status]
        return f"{self.calls} tool calls re-run: {', '.join(parts) or 'none'} — {self.status} ({held})"


def verify_run(path: Path, *, backends: Backends | None = None, progress: Progress | None = None,
               strict: bool = False) -> VerifyResult:
    """Check the hash chain, then run every recorded tool call again with its recorded seeds and compare its result
    with the recording under the tolerance policy of ``agent.replay.verify``."""
    t0 = time.perf_counter()
    chain = verify_transcript(path)
    chain_error = None if chain.ok else f"line {chain.first_bad_line}: {chain.reason}"
    try:
        # A broken chain is reported, yet the content is still checked: a forger who re-hashed every line is
        # caught by the results.
        events = read_transcript(path, verify=False)
    except TranscriptError as e:
        return VerifyResult(transcript=str(path), status="tampered", ok=False, events=chain.n_events,
                            chain_error=chain_error or str(e), chain_line=chain.first_bad_line or e.line,
                            seconds=time.perf_counter() - t0)
    if not events or not isinstance(events[0], RunStarted):
        raise RebuildError("the transcript does not begin with run_started", line=1)
    kept = artifacts_dir(path)
    with tempfile.TemporaryDirectory(prefix="sleuth-verify-") as tmp:
        # Artifacts made by the re-run go to a scratch store: verifying never touches the recorded run.
        session = session_for(events[0], Path(tmp), backends=backends, progress=progress)
        images = ImageStores(recorded=ArtifactStore(kept) if kept.is_dir() else None, replayed=session.artifacts)
        rebuilt = rerun_calls(events, session, strict=False, progress=progress, images=images)
    status: Kind = worst(k for k, n in rebuilt.by_call.items() if n)
    if not chain.ok or rebuilt.tampered:
        status = "tampered"
    ok = status == "identical" if strict else status in ACCEPTED
    return VerifyResult(transcript=str(path), status=status, ok=ok, events=len(events), calls=rebuilt.calls,
                        by_call=rebuilt.by_call, skipped=rebuilt.skipped, differences=rebuilt.differences,
                        tampered=rebuilt.tampered, chain_error=chain_error, chain_line=chain.first_bad_line,
                        unfinished=len(rebuilt.pending), seconds=time.perf_counter() - t0)
