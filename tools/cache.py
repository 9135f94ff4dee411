"""Predictions cached by (generator id, classifier id, prompt, seed).

Generation is the expensive step of every investigation and it is deterministic given the backends, the prompt and
the seed, so its outcome (the classifier's top predictions, the image's validity, the words the generator could not
render) is kept and reused: by a re-run with the same seeds, by `replay --verify`, by a resumed or forked run, and
by benchmark planners that share baseline seeds. Images themselves are not kept; the few a tool needs (failures to
caption or store, images to edit) are generated again from their seeds.

The store is an SQLite file (safe under concurrent readers and a killed writer) with an in-memory layer in front.
Only the top ``TOP`` logits of each image are kept: every failure criterion reads the top-k order only.

Edit outcomes of editors that ask for it (``cache_outcomes``: a diffusion editor on a GPU, whose edits are costly
and not bit-reproducible) are kept in the same file, by (editor id, image pixels, source and target captions): a
resumed run or a verification on the same machine gets the recorded edit back instead of a slightly different one.

The same file keeps the *attempt ledger*: the confirmation attempts of a transcript and of every fork of it (they
share its first line, so its baseline and confirmation seeds), and the confirmation sizes its family declared. A fork
draws the same confirmation baseline as its source, so its attempts belong to the source's declared family: counting
them together keeps the chance that any branch records a false finding at alpha (tools/investigation.py).

And it keeps the *seed claims*: which fresh runs used an investigation seed (backends, class, seed) for their
confirmations. A later fresh run with the same seed draws the same discovery images but takes the next confirmation
draw, a block of confirmation seeds no earlier run used, so a re-audit retests on fresh images instead of repeating
the earlier findings, false ones included (agent/session.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sleuth.tools.backends.base import EditOutcome, Image

TOP = 32
"""Logits kept per image; criteria look at the top k <= TOP."""


@dataclass(frozen=True)
class Prediction:
    indices: np.ndarray
    """int32 (m,): label indices, highest logit first."""
    values: np.ndarray
    """float32 (m,): their logits."""
    valid: bool
    unrendered: tuple[str, ...]

    def logits(self, n_labels: int) -> np.ndarray:
        """A full logit row for criteria: the kept logits in place, everything else below them."""
        row = np.full(n_labels, np.finfo(np.float32).min, np.float32)
        row[self.indices] = self.values
        return row

    @classmethod
    def from_logits(cls, row: np.ndarray, valid: bool, unrendered: Sequence[str]) -> Prediction:
        row = np.asarray(row, np.float32)
        order = np.argsort(-row, kind="stable")[:TOP].astype(np.int32)
        return cls(order, row[order], bool(valid), tuple(unrendered))


def default_path() -> Path:
    root = os.environ.get("SLEUTH_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "sleuth"
    return base / "predictions.sqlite"


def _key(generator_id: str, classifier_id: str, prompt: str) -> str:
    return hashlib.sha256(f"{generator_id}\x1f{classifier_id}\x1f{prompt}".encode()).hexdigest()[:32]


class PredictionCache:
    """Thread-safe cache of predictions; ``path=None`` keeps it in memory only."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._mem: dict[tuple[str, int], Prediction] = {}
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self.hits = 0
        self.misses = 0
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=BUSY_S, check_same_thread=False, isolation_level=None)
            _when_unlocked(lambda: _set_up(db))
            self._db = db
        self._edits: dict[str, EditOutcome] = {}
        self._families: dict[str, str] = {}
        self._attempts: dict[str, set[str]] = {}
        self._claims: dict[str, list[tuple[int, str]]] = {}

    def get_many(self, generator_id: str, classifier_id: str, prompt: str,
                 seeds: Sequence[int]) -> list[Prediction | None]:
        key = _key(generator_id, classifier_id, prompt)
        out: list[Prediction | None] = [self._mem.get((key, s)) for s in seeds]
        missing = [s for s, p in zip(seeds, out) if p is None]
        if missing and self._db is not None:
            found: dict[int, Prediction] = {}
            with self._lock:
                for chunk in _chunks(missing, 500):
                    rows = self._db.execute(
                        f"SELECT seed, indices, vals, valid, unrendered FROM predictions WHERE key=? AND seed IN "
                        f"({','.join('?' * len(chunk))})", (key, *chunk)).fetchall()
                    for seed, ind, val, valid, unr in rows:
                        found[int(seed)] = Prediction(np.frombuffer(ind, np.int32), np.frombuffer(val, np.float32),
                                                      bool(valid), tuple(w for w in unr.split("\x1f") if w))
            for i, s in enumerate(seeds):
                if out[i] is None and s in found:
                    out[i] = self._mem[(key, s)] = found[s]
        hits = sum(p is not None for p in out)
        self.hits += hits
        self.misses += len(out) - hits
        return out

    def put_many(self, generator_id: str, classifier_id: str, prompt: str,
                 items: Iterable[tuple[int, Prediction]]) -> None:
        key = _key(generator_id, classifier_id, prompt)
        rows = []
        for seed, p in items:
            self._mem[(key, seed)] = p
            rows.append((key, int(seed), p.indices.tobytes(), p.values.tobytes(), int(p.valid),
                         "\x1f".join(p.unrendered)))
        if self._db is not None and rows:
            with self._lock:
                self._db.executemany("INSERT OR REPLACE INTO predictions VALUES (?, ?, ?, ?, ?, ?)", rows)

    def get_edit(self, key: str) -> EditOutcome | None:
        """The edit outcome kept under ``key`` (see :func:`edit_key`), if any."""
        hit = self._edits.get(key)
        if hit is None and self._db is not None:
            with self._lock:
                row = self._db.execute("SELECT image, info FROM edits WHERE key=?", (key,)).fetchone()
            if row is not None:
                hit = self._edits[key] = _outcome(row[0], row[1])
        return hit

    def put_edit(self, key: str, outcome: EditOutcome) -> None:
        self._edits[key] = outcome
        if self._db is not None:
            image, info = _outcome_row(outcome)
            with self._lock:
                self._db.execute("INSERT OR REPLACE INTO edits VALUES (?, ?, ?)", (key, image, info))

    def declare_family(self, family: str, declared: str) -> str:
        """Record ``declared`` (a confirmation family's sizes) for ``family`` unless one is recorded: the first
        declaration stands. Returns the one that stands."""
        with self._lock:
            if self._db is not None:
                self._db.execute("INSERT OR IGNORE INTO families VALUES (?, ?)", (family, declared))
                row = self._db.execute("SELECT declared FROM families WHERE family=?", (family,)).fetchone()
                self._families[family] = row[0]
            return self._families.setdefault(family, declared)

    def family_attempts(self, family: str) -> set[str]:
        """The attempts recorded for ``family`` by every run that shares it."""
        with self._lock:
            got = self._attempts.setdefault(family, set())
            if self._db is not None:
                rows = self._db.execute("SELECT attempt FROM attempts WHERE family=?", (family,)).fetchall()
                got.update(r[0] for r in rows)
            return set(got)

    def add_attempt(self, family: str, attempt: str) -> None:
        with self._lock:
            self._attempts.setdefault(family, set()).add(attempt)
            if self._db is not None:
                self._db.execute("INSERT OR IGNORE INTO attempts VALUES (?, ?)", (family, attempt))

    def claim_draw(self, key: str, claimant: str, draw: int | None = None,
                   draws: int = 255) -> tuple[int, list[str]]:
        """Claim a confirmation draw of ``key`` (an investigation's seed: backends, class and seed) for
        ``claimant`` (a run directory): ``draw``, or (None) the one ``claimant`` holds, else the lowest no run
        holds, of ``draws``. Returns it with the other claimants of ``key`` that came first (of that draw, when
        ``draw`` is given; of any, otherwise). Atomic across processes sharing the file."""
        with self._lock:
            if self._db is not None:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    rows = [(int(d), str(c)) for d, c in self._db.execute(
                        "SELECT draw, claimant FROM claims WHERE key=? ORDER BY rowid", (key,)).fetchall()]
                    got, others = _claim(rows, claimant, draw, draws)
                    if (got, claimant) not in rows:
                        self._db.execute("INSERT INTO claims VALUES (?, ?, ?)", (key, got, claimant))
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                return got, others
            rows = self._claims.setdefault(key, [])
            got, others = _claim(rows, claimant, draw, draws)
            if (got, claimant) not in rows:
                rows.append((got, claimant))
            return got, others

    def release_claim(self, key: str, claimant: str) -> None:
        """Give back what ``claimant`` claimed of ``key`` (a run that never started, and left no directory)."""
        with self._lock:
            if key in self._claims:
                self._claims[key] = [r for r in self._claims[key] if r[1] != claimant]
            if self._db is not None:
                self._db.execute("DELETE FROM claims WHERE key=? AND claimant=?", (key, claimant))

    def forget_claims(self) -> None:
        """Forget every seed claim, as on a machine that never ran one (tests start each case so)."""
        with self._lock:
            self._claims.clear()
            if self._db is not None:
                self._db.execute("DELETE FROM claims")

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


BUSY_S = 30.0
"""How long a statement waits for another process's lock before it fails."""


def _set_up(db: sqlite3.Connection) -> None:
    if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE IF NOT EXISTS predictions (key TEXT NOT NULL, seed INTEGER NOT NULL, "
               "indices BLOB NOT NULL, vals BLOB NOT NULL, valid INTEGER NOT NULL, unrendered TEXT NOT NULL, "
               "PRIMARY KEY (key, seed)) WITHOUT ROWID")
    db.execute("CREATE TABLE IF NOT EXISTS edits (key TEXT PRIMARY KEY NOT NULL, image BLOB NOT NULL, "
               "info TEXT NOT NULL) WITHOUT ROWID")
    db.execute("CREATE TABLE IF NOT EXISTS families (family TEXT PRIMARY KEY NOT NULL, "
               "declared TEXT NOT NULL) WITHOUT ROWID")
    db.execute("CREATE TABLE IF NOT EXISTS attempts (family TEXT NOT NULL, attempt TEXT NOT NULL, "
               "PRIMARY KEY (family, attempt)) WITHOUT ROWID")
    db.execute("CREATE TABLE IF NOT EXISTS claims (key TEXT NOT NULL, draw INTEGER NOT NULL, "
               "claimant TEXT NOT NULL, UNIQUE (key, draw, claimant))")


def _claim(rows: Sequence[tuple[int, str]], claimant: str, draw: int | None, draws: int) -> tuple[int, list[str]]:
    """The draw ``claimant`` gets among ``rows`` (draw, claimant; in the order claimed), and the other claimants
    before it: of that draw when ``draw`` is given, of any draw otherwise."""
    rows = list(rows)
    mine = next((i for i, (_, c) in enumerate(rows) if c == claimant and (draw is None or rows[i][0] == draw)),
                len(rows))
    if draw is None:
        taken = {d for d, _ in rows}
        draw = rows[mine][0] if mine < len(rows) else next((d for d in range(draws) if d not in taken), None)
        if draw is None:
            raise ValueError(f"all {draws} confirmation draws of this seed are used; choose another seed")
        before = rows[:mine]
    else:
        before = [r for r in rows[:mine] if r[0] == draw]
    return draw, list(dict.fromkeys(c for _, c in before if c != claimant))


def _when_unlocked(step: Callable[[], None], wait_s: float = BUSY_S) -> None:
    """Run ``step``, again while another process holds the lock it needs, for up to ``wait_s`` seconds.

    SQLite's busy timeout covers ordinary reads and writes but not every statement: switching a new file to WAL
    fails at once with "database is locked" while another process opens the same file (as workers of one audit
    do, sharing one cache). Every statement here is idempotent, so running it again is safe."""
    deadline = time.monotonic() + wait_s
    pause = 0.01
    while True:
        try:
            step()
            return
        except sqlite3.OperationalError as err:
            busy = "locked" in str(err) or "busy" in str(err)
            if not busy or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def _chunks(items: Sequence[int], size: int) -> Iterable[Sequence[int]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def edit_key(editor_id: str, image: Image, source: str, target: str) -> str:
    """What an edit outcome depends on: the editor (model and settings), the image's pixels and the two captions."""
    a = np.ascontiguousarray(np.asarray(image, dtype=np.uint8))
    h = hashlib.sha256(f"{editor_id}\x1f{a.shape}\x1f{source}\x1f{target}\x1f".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def _outcome_row(o: EditOutcome) -> tuple[bytes, str]:
    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.fromarray(np.asarray(o.image, dtype=np.uint8)).save(buf, format="PNG")  # lossless
    info = {"source": o.source_caption, "target": o.target_caption, "scores": o.scores, "passed": o.passed,
            "unrendered": list(o.unrendered), "meta": o.meta}
    return buf.getvalue(), json.dumps(info, default=str)


def _outcome(image: bytes, info: str) -> EditOutcome:
    from PIL import Image as PILImage

    d = json.loads(info)
    pixels = np.asarray(PILImage.open(io.BytesIO(image)).convert("RGB"))
    return EditOutcome(image=pixels, source_caption=d["source"], target_caption=d["target"], scores=d["scores"],
                       passed=d["passed"], unrendered=tuple(d["unrendered"]), meta=d["meta"])
