"""Rebuild an investigation from its transcript by running the recorded tool calls again, and check their results.

Tools are deterministic given the backends, the prompt and the seed, and an investigation hands out seeds in call
order, so running the recorded calls again, in order, on a fresh investigation reproduces both its state (images
spent, baselines, the family of tests, findings) and every result. ``verify_run`` compares those results with the
recorded ones; resuming and forking (``agent.resume``) use the rebuilt state to continue.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from agent.events import ErrorEvent, Event, Finding, RunStarted, ToolCalled, ToolReturned, json_safe
from agent.session import Session, registry
from agent.transcript import TranscriptError, read_transcript, verify_transcript
from tools.backends.base import Backends
from tools.backends.specs import BackendSpecs
from tools.registry import Registry, ToolError

REL_TOL = 1e-6
"""Floats may differ this much (relatively) between a recording and a re-run: BLAS kernels and thread counts change
the last bits of a logit, never a count or a label."""
ABS_TOL = 1e-12
MAX_PATHS = 5
"""Differences reported per call; the first few say what changed."""

Progress = Callable[[str, int, int], None]


class RebuildError(Exception):
    """The recorded run cannot be rebuilt faithfully (changed backends, a result that no longer reproduces)."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(f"line {line}: {message}" if line is not None else message)
        self.line = line


class Mismatch(BaseModel):
    line: int = Field(description="1-based transcript line of the recorded outcome.")
    tool: str
    call_id: str
    path: str = Field(description="Where the results differ, e.g. result.hypothesis.failures.k.")
    recorded: Any = None
    replayed: Any = None

    def describe(self) -> str:
        return (f"line {self.line}: {self.tool} ({self.call_id}): {self.path}: recorded {_short(self.recorded)}, "
                f"re-run gives {_short(self.replayed)}")


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


@dataclass
class Outcome:
    """What running a call again gave."""

    ok: bool
    result: dict[str, Any] | None = None
    error: str | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    """Items the tool emitted (``{"finding_id", "finding"}``), in order."""
    bug: str | None = None
    duration_s: float = 0.0


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


def skip_reason(call: RecordedCall) -> str | None:
    """Why a recorded call is not run again (its recorded result stands), or None."""
    if call.called is None:
        return "no tool_called event: nothing was run"
    r = call.returned.result if call.returned is not None else None
    if call.name == "perturb_caption" and isinstance(r, dict) and r.get("source") == "llm":
        # The edits came from a language model: not reproducible offline, and they change no state.
        return "perturbations came from an LLM; the recorded result stands"
    return None


def execute(reg: Registry, ctx: Any, name: str, arguments: dict[str, Any] | str, *,
            expect_bug: bool = False) -> Outcome:
    """Run one call with the tool's findings collected instead of written; ``ToolError`` is an outcome."""
    emitted: list[dict[str, Any]] = []

    def collect(item: Any) -> None:
        if isinstance(item, dict) and "finding_id" in item:
            emitted.append({"finding_id": item["finding_id"], "finding": json_safe(item["finding"])})

    previous = ctx.emit
    ctx.emit = collect
    t0 = time.perf_counter()
    try:
        # As the transcript holds it: non-finite numbers are strings there ("Infinity").
        result = json_safe(reg.call(name, arguments, ctx).model_dump(mode="json"))
        return Outcome(ok=True, result=result, findings=emitted, duration_s=time.perf_counter() - t0)
    except ToolError as e:
        return Outcome(ok=False, error=str(e), findings=emitted, duration_s=time.perf_counter() - t0)
    except Exception as e:
        if not expect_bug:
            raise
        # The recording says this call raised a bug; reproducing it is the faithful outcome.
        return Outcome(ok=False, bug=f"{type(e).__name__}: {e}", findings=emitted,
                       duration_s=time.perf_counter() - t0)
    finally:
        ctx.emit = previous


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def diff_values(recorded: Any, replayed: Any, path: str, out: list[tuple[str, Any, Any]]) -> None:
    """Append (path, recorded, replayed) for every difference; floats compare within ``REL_TOL``."""
    if len(out) >= MAX_PATHS:
        return
    if isinstance(recorded, bool) or isinstance(replayed, bool):
        if recorded is not replayed:
            out.append((path, recorded, replayed))
    elif isinstance(recorded, (int, float)) and isinstance(replayed, (int, float)):
        if isinstance(recorded, int) and isinstance(replayed, int):
            if recorded != replayed:
                out.append((path, recorded, replayed))
        elif not math.isclose(recorded, replayed, rel_tol=REL_TOL, abs_tol=ABS_TOL):
            out.append((path, recorded, replayed))
    elif isinstance(recorded, dict) and isinstance(replayed, dict):
        for k in list(recorded) + [k for k in replayed if k not in recorded]:
            if k not in recorded or k not in replayed:
                out.append((f"{path}.{k}", recorded.get(k, "<absent>"), replayed.get(k, "<absent>")))
            else:
                diff_values(recorded[k], replayed[k], f"{path}.{k}", out)
            if len(out) >= MAX_PATHS:
                return
    elif isinstance(recorded, list) and isinstance(replayed, list):
        if len(recorded) != len(replayed):
            out.append((f"{path}.length", len(recorded), len(replayed)))
            return
        for i, (a, b) in enumerate(zip(recorded, replayed, strict=True)):
            diff_values(a, b, f"{path}[{i}]", out)
    elif recorded != replayed:
        out.append((path, recorded, replayed))


def compare(call: RecordedCall, outcome: Outcome) -> list[Mismatch]:
    """How a re-run differs from the recording of the same call (empty when it reproduces)."""
    found: list[tuple[str, Any, Any]] = []
    if call.bug is not None:
        diff_values(call.bug.message, outcome.bug or "<no error>", "error", found)
    elif call.returned is not None:
        if outcome.bug is not None:
            found.append(("error", "<no error>", outcome.bug))
        elif call.returned.ok != outcome.ok:
            found.append(("ok", call.returned.ok, outcome.ok))
        elif outcome.ok:
            diff_values(call.returned.result or {}, outcome.result or {}, "result", found)
        else:
            diff_values(call.returned.error, outcome.error, "error", found)
    recorded = [{"finding_id": f.finding_id, "finding": f.finding} for f in call.findings]
    if call.complete or len(outcome.findings) < len(recorded):
        diff_values(recorded, outcome.findings, "findings", found)
    else:  # a call cut short may have written only some of its findings
        diff_values(recorded, outcome.findings[: len(recorded)], "findings", found)
    return [Mismatch(line=call.line, tool=call.name, call_id=call.call_id, path=p, recorded=a, replayed=b)
            for p, a, b in found]


# -- sessions from recordings ----------------------------------------------------------------------------------


def backend_specs(config: dict[str, Any]) -> BackendSpecs:
    """The backends a run recorded: ``config["backends"]`` (a ``BackendSpecs``), else the specs' fields found at the
    top level of the config (``world`` in the simplest case), else toyworld's defaults."""
    fields = set(BackendSpecs.model_fields)
    settings = {k: v for k, v in config.items() if k in fields}
    if isinstance(config.get("backends"), dict):
        settings.update(config["backends"])
    try:
        return BackendSpecs.model_validate(settings)
    except ValidationError as e:
        raise RebuildError(f"the recorded backend settings are not valid: {e.errors()[0]['msg']}", line=1) from None


def backends_from_config(config: dict[str, Any], progress: Progress | None = None) -> Backends:
    """The backends a recorded run used, loaded now."""
    return backend_specs(config).build(progress, load=True)


def check_backends(started: RunStarted, backends: Backends) -> None:
    for role, recorded in started.backends.items():
        now = backends.ids.get(role)
        if now is not None and now != recorded:
            raise RebuildError(f"the run used {role} {recorded!r}, these backends have {now!r}; "
                               "results would not reproduce", line=1)


def session_for(started: RunStarted, run_dir: Path, *, backends: Backends | None = None,
                progress: Progress | None = None, command: str | None = None) -> Session:
    """A fresh session configured as the recorded one (class, seed, budget, criterion, alpha, backends)."""
    config = started.config
    if "class" not in config:
        raise RebuildError("run_started records no class under audit", line=1)
    if backends is None:
        backends = backends_from_config(config, progress)
    check_backends(started, backends)
    try:
        return Session(backends=backends, label=config["class"], run_dir=run_dir, config=config,
                       seed=int(config.get("seed", started.seeds.get("seed", 0))),
                       budget=int(config.get("budget", 20_000)), criterion=config.get("criterion", "top1"),
                       alpha=float(config.get("alpha", 0.05)), progress=progress,
                       command=command or started.command)
    except ToolError as e:
        raise RebuildError(str(e), line=1) from None


@dataclass
class Rebuilt:
    """What re-running a transcript's complete calls gave."""

    calls: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)
    pending: list[RecordedCall] = field(default_factory=list)
    """Calls started but not finished (the run was killed during them)."""


def rerun_calls(events: Sequence[Event], session: Session, *, strict: bool,
                progress: Progress | None = None) -> Rebuilt:
    """Run every complete recorded call again on ``session``, in order, comparing outcomes.

    ``strict``: the first mismatch raises ``RebuildError`` (resume and fork cannot continue from a state that does
    not reproduce); otherwise mismatches are collected (verify).
    """
    out = Rebuilt()
    reg = registry()
    calls = recorded_calls(events)
    for i, call in enumerate(calls):
        if progress is not None:
            progress("re-running tool calls", i, len(calls))
        if not call.complete:
            out.pending.append(call)
            continue
        reason = skip_reason(call)
        if reason is not None:
            out.skipped.append(Skipped(line=call.line, tool=call.name, call_id=call.call_id, reason=reason))
            continue
        assert call.called is not None
        outcome = execute(reg, session.ctx, call.name, call.called.arguments, expect_bug=call.bug is not None)
        out.calls += 1
        found = compare(call, outcome)
        if found and strict:
            raise RebuildError(f"{found[0].tool} no longer reproduces its recorded result "
                               f"({found[0].path}: recorded {_short(found[0].recorded)}, now "
                               f"{_short(found[0].replayed)}); the tools or backends changed since the run",
                               line=found[0].line)
        out.mismatches += found
    if progress is not None:
        progress("re-running tool calls", len(calls), len(calls))
    return out


class VerifyResult(BaseModel):
    transcript: str
    ok: bool
    events: int
    calls: int = Field(0, description="Tool calls run again and compared.")
    skipped: list[Skipped] = Field(default_factory=list)
    mismatches: list[Mismatch] = Field(default_factory=list)
    chain_error: str | None = Field(None, description="First break of the hash chain, 'line N: reason'.")
    chain_line: int | None = None
    unfinished: int = Field(0, description="Calls with no recorded outcome (the run was cut during them).")
    seconds: float = 0.0


def verify_run(path: Path, *, backends: Backends | None = None, progress: Progress | None = None) -> VerifyResult:
    """Check the hash chain, then run every recorded tool call again with its recorded seeds and compare."""
    t0 = time.perf_counter()
    chain = verify_transcript(path)
    chain_error = None if chain.ok else f"line {chain.first_bad_line}: {chain.reason}"
    try:
        # A broken chain is reported, yet the content is still checked: a forger who re-hashed every line is
        # caught by the results.
        events = read_transcript(path, verify=False)
    except TranscriptError as e:
        return VerifyResult(transcript=str(path), ok=False, events=chain.n_events, chain_error=chain_error or str(e),
                            chain_line=chain.first_bad_line or e.line, seconds=time.perf_counter() - t0)
    if not events or not isinstance(events[0], RunStarted):
        raise RebuildError("the transcript does not begin with run_started", line=1)
    with tempfile.TemporaryDirectory(prefix="sleuth-verify-") as tmp:
        # Artifacts made by the re-run go to a scratch store: verifying never touches the recorded run.
        session = session_for(events[0], Path(tmp), backends=backends, progress=progress)
        rebuilt = rerun_calls(events, session, strict=False, progress=progress)
    ok = chain.ok and not rebuilt.mismatches
    return VerifyResult(transcript=str(path), ok=ok, events=len(events), calls=rebuilt.calls,
                        skipped=rebuilt.skipped, mismatches=rebuilt.mismatches, chain_error=chain_error,
                        chain_line=chain.first_bad_line, unfinished=len(rebuilt.pending),
                        seconds=time.perf_counter() - t0)
