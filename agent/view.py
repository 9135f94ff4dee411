"""One typed view of an investigation, read from its events: the one place that reads the event log.

``InvestigationView.from_events`` goes through a run's events once. Each ``tool_returned`` result is read back into
its tool's ``Result`` (through the registry), each ``finding`` into a ``record_finding.Result``; the view holds the
tests, findings, proposals, samples, images used and left, confirmation attempts, tokens and cost, and the planner's
turns with what their calls returned. Readers (the LLM's ledger and context, the report, the audit's budgets, the
benchmark, the chat's commands, the script planners) ask it typed questions instead of matching event kinds, tool
names and dict keys themselves.

A view can follow a growing log: ``extend`` reads only the events it has not seen (a planner is handed the whole log
every turn), and reads everything again if the log it is given is not the one it read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from sleuth.agent.events import (
    Event,
    Finding,
    ModePlaced,
    PlannerTurn,
    RunFinished,
    RunStarted,
    ToolCalled,
    ToolReturned,
    UserMessage,
)
from sleuth.agent.modes import Idea, ModeBook, ModeClaim, Placement, Trace, claims, ideas_of, sentence_shares
from sleuth.agent.transcript import read_transcript
from sleuth.tools import (
    caption_failures,
    edit_image,
    generate_and_classify,
    investigation_tools,
    measure_rate,
    perturb_caption,
    record_finding,
)
from sleuth.tools.defaults import MAX_CONFIRMATIONS
from sleuth.tools.registry import Registry

BUDGET_MODEL = "budget"
"""``model`` of a turn the audit wrote in the planner's place when a budget ran out; never asked of a planner."""

R = TypeVar("R", bound=BaseModel)


@dataclass(frozen=True)
class Returned:
    """What one tool call returned: its event, the arguments it was called with, and its typed ``Result``."""

    event: ToolReturned
    arguments: dict[str, Any]
    """The call's arguments ({} without a ``tool_called`` event or when they were not a JSON object)."""
    result: BaseModel | None
    """The tool's ``Result``; None when the call failed or its result cannot be read (an unknown tool, an older
    version's result)."""

    @property
    def seq(self) -> int:
        return self.event.seq

    @property
    def failed(self) -> bool:
        """The call returned an error (or no result)."""
        return not self.event.ok or self.event.result is None


@dataclass(frozen=True)
class Proposed:
    """A hypothesis a tool proposed: a caption of clustered failures, or a perturbation or refinement of a caption."""

    caption: str
    parent: str
    """The caption it came from: the prompt whose failures it captions ('' if unknown), or the caption changed."""
    relation: str
    """How it came from its parent, in words."""


@dataclass
class Exchange:
    """One planner turn and what its calls returned, by call id."""

    turn: PlannerTurn
    results: dict[str, ToolReturned] = field(default_factory=dict)


@dataclass
class InvestigationView:
    """An investigation as its events tell it, typed (see the module's docstring)."""

    registry: Registry
    started: RunStarted | None = None
    """The run's first ``run_started``."""
    finished: RunFinished | None = None
    """The run's last ``run_finished``, if it has one."""
    turns: list[PlannerTurn] = field(default_factory=list)
    calls: list[ToolCalled] = field(default_factory=list)
    returned: list[Returned] = field(default_factory=list)
    """Every ``tool_returned``, in order."""
    exchanges: list[Exchange | UserMessage] = field(default_factory=list)
    """Planner turns with their results, and the user's messages, in order."""
    findings: list[record_finding.Result] = field(default_factory=list)
    """The findings whose ``finding`` events can be read, in the order recorded, each as its latest event has it."""
    finding_events: int = 0
    """Every finding recorded (distinct ids), read or not."""
    proposals: list[Proposed] = field(default_factory=list)
    screened: dict[str, generate_and_classify.Screened] = field(default_factory=dict)
    """Each caption's latest screen (generate_and_classify with prompts), by normalised caption."""
    screen_effects: list[float] = field(default_factory=list)
    """The effect of each screen, in order."""
    measured: dict[str, str] = field(default_factory=dict)
    """Measurement id -> the prompt or caption its images were generated from."""
    images_used: int = 0
    images_left: int | None = None
    """Images left after the latest call that reported it (None before any did)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    """LLM cost of the planner's turns and of the tools' own requests; None when nothing recorded a cost."""
    tool_seconds: float = 0.0
    budget_stop: str | None = None
    """The summary of the latest turn the audit wrote when a budget ran out, if any."""
    warnings: list[str] = field(default_factory=list)
    """Results and findings that could not be read, by transcript line."""
    latest: list[Returned] = field(default_factory=list)
    """What the calls made since the latest planner turn returned, in order."""
    images_at_findings: dict[str, int] = field(default_factory=dict)
    """Images generated when each finding was first recorded confirmed, by finding id."""
    modes: ModeBook = field(default_factory=ModeBook)
    """The failure modes as the transcript's ``mode`` events placed its findings (``mode_claims`` completes them for
    a transcript written before modes were recorded)."""
    captioned: dict[str, tuple[str, list[caption_failures.Hypothesis]]] = field(default_factory=dict)
    """The captions of each caption's failures, as last captioned (by ``caption_key``): (caption, clusters)."""
    common: dict[str, float] = field(default_factory=dict)
    """The share of the class prompt's captioned failures that says each sentence (its first captioning)."""
    _read: int = 0
    _last: Event | None = None
    _arguments: dict[str, dict[str, Any]] = field(default_factory=dict)
    _by_call: dict[str, Exchange] = field(default_factory=dict)
    _finding_ids: set[str] = field(default_factory=set)

    @classmethod
    def from_events(cls, events: Sequence[Event], registry: Registry | None = None) -> InvestigationView:
        view = cls(registry or investigation_tools())
        view._add(events)
        return view

    @classmethod
    def from_transcript(cls, path: str | Path, registry: Registry | None = None) -> InvestigationView:
        """The view of a transcript file, read through the transcript reader (hash chain checked, old schemas
        upgraded); raises ``TranscriptError`` naming its first bad line, ``OSError`` if it cannot be read."""
        return cls.from_events(read_transcript(path), registry)

    def extend(self, events: Sequence[Event]) -> InvestigationView:
        """This view brought up to ``events``: the same log grown reads only its new events; another log is read
        from the start (into a new view)."""
        n = self._read
        if len(events) >= n and (n == 0 or _same(events[n - 1], self._last)):
            self._add(events[n:])
            return self
        return InvestigationView.from_events(events, self.registry)

    # --- reading ----------------------------------------------------------------------------------------------

    def _add(self, events: Sequence[Event]) -> None:
        args, by_call = self._arguments, self._by_call
        for e in events:
            self._read += 1
            self._last = e
            if isinstance(e, RunStarted):
                self.started = self.started or e
            elif isinstance(e, RunFinished):
                self.finished = e
            elif isinstance(e, UserMessage):
                self.exchanges.append(e)
            elif isinstance(e, PlannerTurn):
                x = self._turn(e)
                by_call.update({c.id: x for c in e.tool_calls})
            elif isinstance(e, ToolCalled):
                self.calls.append(e)
                args[e.call_id] = _args(e)
            elif isinstance(e, ToolReturned):
                if e.call_id in by_call:
                    by_call[e.call_id].results[e.call_id] = e
                self._returned(Returned(e, args.get(e.call_id, {}), self._result(e)))
            elif isinstance(e, ModePlaced):
                self.modes.restore(e.mode_id, e.finding_id, e.reason, e.idea, e.labels)
            elif isinstance(e, Finding):
                # A later event under an id already seen is that finding updated (its counterfactual added).
                if e.finding_id not in self._finding_ids:
                    self._finding_ids.add(e.finding_id)
                    self.finding_events += 1
                f = self._parse(record_finding.Result, e.finding, f"line {e.seq + 1} (finding)")
                if f is not None:
                    same = [i for i, g in enumerate(self.findings) if g.finding_id == f.finding_id]
                    if same:
                        self.findings[same[0]] = f
                    else:
                        self.findings.append(f)
                    if f.confirmed and (e.finding_id or f.finding_id) not in self.images_at_findings:
                        self.images_at_findings[e.finding_id or f.finding_id] = self.images_used

    def _turn(self, e: PlannerTurn) -> Exchange:
        self.turns.append(e)
        x = Exchange(e)
        self.exchanges.append(x)
        self.latest = []
        if e.usage is not None:
            self.prompt_tokens += e.usage.prompt_tokens
            self.completion_tokens += e.usage.completion_tokens
        if e.cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + e.cost_usd
        if e.model == BUDGET_MODEL:
            self.budget_stop = e.reasoning
        return x

    def _returned(self, r: Returned) -> None:
        e = r.event
        self.returned.append(r)
        self.latest.append(r)
        self.tool_seconds += e.duration_s
        self.images_used += e.images_used
        if e.images_left is not None:
            self.images_left = e.images_left
        if e.usage is not None:  # a tool's own LLM requests (perturbations)
            self.prompt_tokens += e.usage.prompt_tokens
            self.completion_tokens += e.usage.completion_tokens
        if e.cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + e.cost_usd
        x = r.result
        if isinstance(x, generate_and_classify.Result):
            self.measured[x.measurement_id] = x.summary.prompt
            if x.screen is not None:
                self.screen_effects.append(x.screen.effect)
                for row in x.screen.captions:
                    self.screened[caption_key(row.caption)] = row
                    if row.measurement_id:
                        self.measured[row.measurement_id] = row.caption
        elif isinstance(x, measure_rate.Result) and x.measurement_id:
            self.measured[x.measurement_id] = x.caption
        elif isinstance(x, caption_failures.Result):
            parent = self.measured.get(x.measurement_id, "")
            class_prompt = self.started.class_prompt if self.started is not None else None
            if parent and parent == class_prompt:
                if not self.common:
                    self.common = sentence_shares(x.hypotheses)
            elif parent:
                self.captioned[caption_key(parent)] = (parent, list(x.hypotheses))
            self.proposals += [Proposed(h.caption, parent, f"caption of {h.n_images} failures predicted "
                                                           f"'{h.predicted_label}'") for h in x.hypotheses]
        elif isinstance(x, perturb_caption.Result):
            self.proposals += [Proposed(p.caption, x.caption, f"{p.type}: {p.edit}") for p in x.edits]
            self.proposals += [Proposed(p.caption, x.caption, f"refinement ({p.type.replace('_', ' ')}): {p.edit}")
                               for p in x.refinements]

    def _result(self, e: ToolReturned) -> BaseModel | None:
        if not e.ok or e.result is None or e.name not in self.registry:
            return None
        return self._parse(self.registry.get(e.name).result_model, e.result, f"line {e.seq + 1} ({e.name})")

    def _parse(self, model: type[R], data: Any, where: str) -> R | None:
        try:
            return model.model_validate(data)
        except ValidationError as err:
            first = err.errors()[0]
            loc = ".".join(str(p) for p in first["loc"]) or "result"
            self.warnings.append(f"{where}: skipped, the result does not match this sleuth's tools "
                                 f"({loc}: {first['msg']})")
            return None

    # --- typed questions --------------------------------------------------------------------------------------

    def results(self, kind: type[R]) -> list[R]:
        """The readable results of one kind (a tool's ``Result``), oldest first."""
        return [r.result for r in self.returned if isinstance(r.result, kind)]

    @property
    def tests(self) -> list[measure_rate.Result]:
        """Every measure_rate test, in order."""
        return self.results(measure_rate.Result)

    @property
    def samples(self) -> list[generate_and_classify.Result]:
        return self.results(generate_and_classify.Result)

    @property
    def recorded(self) -> list[record_finding.Result]:
        """What record_finding returned, in order (the findings as the planner was told of them)."""
        return self.results(record_finding.Result)

    @property
    def edits(self) -> list[tuple[Returned, edit_image.Result]]:
        """Every edit_image call with its result (its arguments name the captions edited from and to)."""
        return [(r, r.result) for r in self.returned if isinstance(r.result, edit_image.Result)]

    @property
    def confirmations(self) -> int:
        """Confirmation attempts made (confirmation tests)."""
        return sum(1 for t in self.tests if t.purpose == "confirmation")

    @property
    def declared_confirmations(self) -> int:
        """The confirmation attempts the run declared (its ``run_started`` config), MAX_CONFIRMATIONS if unrecorded."""
        if self.started is None:
            return MAX_CONFIRMATIONS
        return int(self.started.config.get("confirmations") or MAX_CONFIRMATIONS)

    @property
    def finish_called(self) -> bool:
        """A finish call was made (the run is ending)."""
        return any(c.name == "finish" for c in self.calls)

    @property
    def tool_errors(self) -> int:
        return sum(1 for r in self.returned if r.failed)

    # --- failure modes ---------------------------------------------------------------------------------------

    def traces(self) -> dict[str, Trace]:
        """What the run measured of each confirmed finding's cause (``modes.Trace``), by finding id: the idea of its
        caption's failures read against every caption captioned so far, and the wrong labels of its discovery and
        confirmation images."""
        prompt = (self.started.class_prompt or "") if self.started is not None else ""
        ideas = ideas_of(dict(self.captioned.values()), self.common, prompt)
        tests = {t.test_id: t for t in self.tests}
        out = {}
        for f in self.findings:
            if not f.confirmed:
                continue
            labels: Counter[str] = Counter()
            for tid in (f.discovery.test_id, f.confirmation.test_id):
                t = tests.get(tid)
                for x in t.hypothesis.confusions if t is not None and t.hypothesis is not None else []:
                    labels[x.label] += x.count
            got = self.captioned.get(caption_key(f.caption))
            idea = ideas.get(got[0]) if got is not None else None
            c = f.confirmation.hypothesis
            out[f.finding_id] = Trace(f.caption, labels, idea or Idea(), prompt, k=c.k, n=c.n)
        return out

    def unplaced(self) -> list[record_finding.Result]:
        """Confirmed findings no ``mode`` event has placed yet, in the order recorded."""
        return [f for f in self.findings if f.confirmed and self.modes.mode_of(f.finding_id) is None]

    def place_modes(self, book: ModeBook | None = None) -> list[Placement]:
        """Places every unplaced confirmed finding in ``book`` (the view's own by default), in the order recorded."""
        book = book if book is not None else self.modes
        todo = [f for f in self.findings if f.confirmed and book.mode_of(f.finding_id) is None]
        if not todo:
            return []
        traces = self.traces()
        return [book.place(f.finding_id, traces[f.finding_id], traces) for f in todo]

    def test_modes(self) -> dict[str, str]:
        """Supported discovery tests behind no confirmed finding whose failures read as another phrasing of a failure
        mode, as the planner reads a tested candidate before it confirms one (a test whose failures were never
        captioned is not read): test id -> mode id."""
        used = {e.test_id for f in self.findings if f.confirmed
                for e in (f.discovery, f.confirmation, f.counterfactual) if e is not None}
        todo = [t for t in self.tests if t.purpose == "discovery" and t.verdict == "supported"
                and t.test_id not in used and t.hypothesis is not None and caption_key(t.caption) in self.captioned]
        if not todo:
            return {}
        book = self.modes
        if self.unplaced():
            book = self.modes.copy()
            self.place_modes(book)
        prompt = (self.started.class_prompt or "") if self.started is not None else ""
        ideas = ideas_of(dict(self.captioned.values()), self.common, prompt)
        traces = self.traces()
        out = {}
        for t in todo:
            h = t.hypothesis
            assert h is not None
            labels: Counter[str] = Counter()
            for x in h.confusions:
                labels[x.label] += x.count
            idea = ideas.get(self.captioned[caption_key(t.caption)][0])
            got = book.phrasing_of(Trace(t.caption, labels, idea or Idea(), prompt, k=h.failures.k, n=h.failures.n),
                                   traces)
            if got is not None:
                out[t.test_id] = got[0].mode_id
        return out

    def mode_claims(self) -> list[ModeClaim]:
        """The failure modes with their findings and claims, in the order they formed. A transcript written before
        modes were recorded (no ``mode`` events) gets them from the same model, placed as they would have been."""
        book = self.modes
        if self.unplaced():
            book = self.modes.copy()
            self.place_modes(book)
        return claims(book, [f for f in self.findings if f.confirmed])

    @property
    def latest_measurement(self) -> str | None:
        """The measurement id of the newest result that names one."""
        for r in reversed(self.returned):
            mid = getattr(r.result, "measurement_id", None)
            if mid:
                return str(mid)
        return None


def caption_key(caption: str) -> str:
    """A caption as one idea of "the same caption": lower case, full stops and spacing ignored."""
    return " ".join(caption.lower().replace(".", " ").split())


def _same(a: Event, b: Event | None) -> bool:
    return a is b or (b is not None and bool(a.hash) and a.hash == b.hash and a.seq == b.seq)


def _args(c: ToolCalled) -> dict[str, Any]:
    return c.arguments if isinstance(c.arguments, dict) else {}

