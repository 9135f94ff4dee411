"""Append-only JSONL transcripts with a hash chain: writing (flushed and synced per event), reading, verifying.

Each line is one event as compact JSON; its hash is taken over the canonical form. Every event carries the hash of
the previous one, so a changed, removed or reordered line is caught and named by its line number. Secrets are masked
before anything reaches the file. Artifacts (images) live in ``artifacts/`` beside the transcript.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import BaseModel, ValidationError

from sleuth.agent.events import Event, event_hash, json_safe, parse_event
from sleuth.agent.redact import redact


class TranscriptError(Exception):
    """A transcript line that cannot be trusted: invalid JSON, wrong schema or a broken hash chain."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line
        self.reason = reason


class NotATranscript(TranscriptError):
    """A file that is no sleuth transcript at all: empty, or its first line is not an event."""

    def __init__(self, reason: str, *, empty: bool = False) -> None:
        super().__init__(1, reason)
        self.message = reason if empty else f"line 1 is {reason}"
        """The whole sentence, e.g. "empty file, not a transcript" or "line 1 is not a sleuth transcript event: …"."""


class VerifyReport(BaseModel):
    ok: bool
    n_events: int
    """Events that passed before the first bad line (all of them when ok)."""
    first_bad_line: int | None = None
    reason: str | None = None


def artifacts_dir(transcript: str | Path) -> Path:
    return Path(transcript).parent / "artifacts"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _schema_reason(e: ValueError) -> str:
    if isinstance(e, ValidationError):
        parts = [f"{'.'.join(str(p) for p in err['loc']) or 'event'}: {err['msg']}" for err in e.errors()[:3]]
        return "schema: " + "; ".join(parts)
    return f"schema: {e}"


def _check_line(lineno: int, raw: bytes, prev_hash: str, *, verify: bool, last: bool) -> Event:
    """Parse and check one line; ``lineno`` is 1-based and equals seq + 1."""
    torn = " (torn final line: the write was interrupted)" if last else ""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise TranscriptError(lineno, f"not UTF-8{torn}") from None
    except json.JSONDecodeError as e:
        raise TranscriptError(lineno, f"invalid JSON ({e.msg} at column {e.colno}){torn}") from None
    if not isinstance(obj, dict):
        raise TranscriptError(lineno, f"expected a JSON object, got {type(obj).__name__}")
    if verify:
        if obj.get("hash") != event_hash(obj):
            raise TranscriptError(lineno, "hash mismatch: the line was changed after it was written")
        if obj.get("seq") != lineno - 1:
            raise TranscriptError(lineno, f"seq is {obj.get('seq')!r}, expected {lineno - 1} "
                                          "(a line before it was removed, duplicated or reordered)")
        if obj.get("prev_hash") != prev_hash:
            raise TranscriptError(lineno, "prev_hash does not match the previous line's hash "
                                          "(a line before it was removed or changed)")
    try:
        return parse_event(obj)
    except ValueError as e:  # pydantic's ValidationError is a ValueError; so are refused schema versions
        raise TranscriptError(lineno, _schema_reason(e)) from None


def _split_lines(data: bytes) -> tuple[list[bytes], bytes]:
    """Complete lines (without their newline) and the trailing fragment after the last newline."""
    *lines, tail = data.split(b"\n")
    return lines, tail


def _first_line(raw: bytes) -> None:
    """Refuse a first line that is no event at all: a transcript's first line is a whole event (``kind``, ``seq``,
    ``hash``), so the torn-final-line reading, meant for a write cut short, does not apply to it."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        why = "not UTF-8 text"
    except json.JSONDecodeError as e:
        why = f"invalid JSON ({e.msg} at column {e.colno}): {raw[:60].decode('utf-8', 'replace')!r}"
    else:
        if isinstance(obj, dict) and isinstance(obj.get("kind"), str) and {"seq", "hash"} <= obj.keys():
            return
        keys = ", ".join(list(obj)[:6]) if isinstance(obj, dict) else ""
        why = f"a JSON object with keys {keys or 'none'}" if isinstance(obj, dict) else f"JSON {type(obj).__name__}"
    raise NotATranscript(f"not a sleuth transcript event: {why}")


def _scan(data: bytes, verify: bool, out: list[Event]) -> None:
    if not data.strip():
        raise NotATranscript("empty file, not a transcript" if not data else "blank file, not a transcript", empty=True)
    lines, tail = _split_lines(data)
    if tail:
        lines.append(tail)
    _first_line(lines[0])
    prev = ""
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            raise TranscriptError(i, "empty line")
        event = _check_line(i, raw, prev, verify=verify, last=(i == len(lines)))
        out.append(event)
        prev = event.hash


def read_transcript(path: str | Path, *, verify: bool = True) -> list[Event]:
    """All events of a transcript; raises ``TranscriptError`` naming the first bad line (1-based)."""
    events: list[Event] = []
    _scan(Path(path).read_bytes(), verify, events)
    return events


def verify_transcript(path: str | Path) -> VerifyReport:
    """Check a transcript's schema and hash chain without raising."""
    events: list[Event] = []
    try:
        _scan(Path(path).read_bytes(), True, events)
    except TranscriptError as e:
        return VerifyReport(ok=False, n_events=len(events), first_bad_line=e.line, reason=e.reason)
    except OSError as e:
        return VerifyReport(ok=False, n_events=0, reason=f"cannot read {path}: {e.strerror or e}")
    return VerifyReport(ok=True, n_events=len(events))


@contextlib.contextmanager
def _deferred_interrupt() -> Iterator[None]:
    """Hold SIGINT (delivered when the block ends) where the platform allows it, i.e. in the main thread."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class TranscriptWriter:
    """Appends events to a transcript, one synced line each; subscribers see every event once it is on disk.

    ``events`` holds every event of the transcript (including those found when resuming): the planner's view.
    """

    def __init__(self, path: str | Path, *, resume: bool = False) -> None:
        self.path = Path(path)
        self.events: list[Event] = []
        self.torn_path: Path | None = None
        """Where a torn final line found on resume was moved."""
        self._subscribers: list[Callable[[Event], None]] = []
        # Tools may report from worker threads; lines must never interleave.
        self._lock = threading.RLock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and self.path.stat().st_size > 0:
            if not resume:
                raise FileExistsError(f"{self.path} already holds a transcript; resume it or choose a new path")
            self._recover()
        self._file = open(self.path, "ab")

    @property
    def artifacts_dir(self) -> Path:
        return artifacts_dir(self.path)

    def _recover(self) -> None:
        """Verify the existing chain; move a torn final line aside so appending continues from the last good event."""
        data = self.path.read_bytes()
        lines, tail = _split_lines(data)
        good = 0  # bytes of verified lines
        prev = ""
        torn: bytes | None = None
        for i, raw in enumerate(lines, start=1):
            try:
                event = _check_line(i, raw, prev, verify=True, last=False)
            except TranscriptError as e:
                # Only the very end of the file may be damaged by a crash; anything earlier is refused.
                if i == len(lines) and not tail and e.reason.startswith(("invalid JSON", "not UTF-8")):
                    torn = raw + b"\n"
                    break
                raise
            self.events.append(event)
            prev = event.hash
            good += len(raw) + 1
        if tail and torn is None:
            try:
                event = _check_line(len(lines) + 1, tail, prev, verify=True, last=True)
            except TranscriptError:
                torn = tail
            else:
                # The event was written whole and only its newline is missing: keep it.
                with open(self.path, "ab") as f:
                    f.write(b"\n")
                    f.flush()
                    os.fsync(f.fileno())
                self.events.append(event)
                return
        if torn is not None:
            n = 1
            while (self.path.parent / f"{self.path.name}.torn-{n}").exists():
                n += 1
            self.torn_path = self.path.parent / f"{self.path.name}.torn-{n}"
            with open(self.torn_path, "xb") as f:
                f.write(torn)
                f.flush()
                os.fsync(f.fileno())
            with open(self.path, "r+b") as f:
                f.truncate(good)
                f.flush()
                os.fsync(f.fileno())

    def subscribe(self, callback: Callable[[Event], None]) -> None:
        self._subscribers.append(callback)

    def unsubscribe(self, callback: Callable[[Event], None]) -> None:
        self._subscribers.remove(callback)

    def append(self, event: Event) -> Event:
        """Write ``event`` with its envelope filled and secrets masked; returns the event as written."""
        with self._lock:
            if self._file.closed:
                raise ValueError(f"transcript {self.path} is closed")
            payload = event.model_dump(mode="json", exclude={"kind", "v", "seq", "ts", "prev_hash", "hash"})
            # Lines keep a readable field order (kind first, chain last); the hash uses the canonical form.
            prev = self.events[-1].hash if self.events else ""
            obj: dict[str, Any] = {"kind": event.kind, "v": event.v, "seq": len(self.events), "ts": _now(),
                                   **redact(json_safe(payload)), "prev_hash": prev}
            obj["hash"] = event_hash(obj)
            written = parse_event(obj)
            line = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
            # Ctrl-C between the write and the bookkeeping would leave the file one line ahead of the writer, and
            # the run_finished written next would repeat a seq: the interrupt waits until both are done.
            with _deferred_interrupt():
                self._write_line((line + "\n").encode("utf-8"))
                self.events.append(written)
        for callback in list(self._subscribers):
            callback(written)
        return written

    def _write_line(self, data: bytes) -> None:
        """Write one encoded line and make it durable. The one place a line reaches the file: crash tests cut a
        write short here."""
        self._file.write(data)
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
