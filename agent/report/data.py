"""What a report shows, read from a transcript's events: failure modes, findings, tests, samples, counterfactual
pairs, budget.

Tool results are validated against the tools' own ``Result`` models, so the report reads exactly what the tools
wrote. A result that no longer fits (an older tool version) is skipped and named in ``RunReport.warnings``: one odd
line should not cost the reader the rest of the report.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from sleuth.agent.events import Event
from sleuth.agent.mode_summary import ModeSummary, mode_summaries
from sleuth.agent.report.tree import Proposal, TreeNode, build_tree
from sleuth.agent.view import InvestigationView
from sleuth.tools import caption_failures, edit_image, generate_and_classify, measure_rate, record_finding, stats
from sleuth.tools.common import SampleSummary
from sleuth.tools.counterfactual import Flip
from sleuth.tools.investigation import normalise_caption


class HypothesisTest(BaseModel):
    """One measure_rate test, with its p-value adjusted over the whole family as it stood at the end of the run."""

    test_id: str
    seq: int = Field(description="Transcript line (0-based) of the result.")
    caption: str
    purpose: str = Field(description="'discovery' or 'confirmation' (disjoint seeds).")
    mode: str = Field(description="'sample' (fresh images of the caption) or 'counterfactual' (edited images).")
    hypothesis: stats.Rate = Field(description="Failures of the caption's images (edited images when counterfactual).")
    baseline: stats.Rate
    rate_ratio: stats.RatioCI | None
    effect: stats.RatioCI | None = Field(None, description=(
        "A supported confirmation's rate ratio corrected for selection; None else."))
    bound: float | None = Field(None, description=(
        "A supported confirmation's headline bound (the number every table claims): fails at least this many times "
        "as often as the class; None else, and in transcripts recorded before it existed."))
    p_value: float
    adjusted_p: float = Field(description="Adjusted over every test of the same purpose in the run (final family).")
    adjusted_p_at_test: float = Field(description="Adjusted over the family as it stood when the test ran.")
    adjust_method: str
    verdict: str
    mcnemar: stats.McNemar | None = None
    summary: SampleSummary | None = Field(default=None, description="The caption's sample (sample mode only).")
    finding_id: str | None = Field(default=None, description="The finding recorded for this caption, if any.")


class PairSet(BaseModel):
    """Counterfactual pairs of one call: the same images before and after an edit."""

    source: str = Field(description="Test id or tool call that made the pairs.")
    before_caption: str
    after_caption: str
    flips: list[Flip]
    mcnemar: stats.McNemar | None = None
    note: str = ""


class ImageGroup(BaseModel):
    """Images shown together: a baseline's failures or a failure cluster with its caption."""

    title: str
    detail: str = ""
    refs: list[str]
    prompt: str = Field("", description="The prompt the images were generated from ('' for a cluster of failures).")
    failures: bool = Field(True, description="Whether the images are failures.")


class Budget(BaseModel):
    images_used: int = Field(description="Images spent: generated, and editing at its charge, as the tool results "
                                         "recorded them.")
    images_budget: int | None = None
    images_edited: int = 0
    planner_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0
    wall_seconds: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None


class RunReport(BaseModel):
    path: str = Field(description="The transcript file.")
    run_id: str
    label: str
    planner: str
    command: str
    status: str = Field(description="The run's final status, or 'unfinished'.")
    answer: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    backends: dict[str, str] = Field(default_factory=dict)
    class_prompt: str | None = None
    baseline: SampleSummary | None = Field(default=None,
                                           description="The class prompt's first sample (discovery seeds).")
    modes: list[ModeSummary] = Field(default_factory=list, description=(
        "The failure modes, in the order they formed, each with its one claim (as `investigate --json` has them)."))
    findings: list[record_finding.Result] = Field(default_factory=list)
    tests: list[HypothesisTest] = Field(default_factory=list)
    groups: list[ImageGroup] = Field(default_factory=list)
    pairs: list[PairSet] = Field(default_factory=list)
    tree: list[TreeNode] = Field(default_factory=list)
    budget: Budget
    reasoning: list[str] = Field(default_factory=list, description="The planner's reasoning, turn by turn.")
    warnings: list[str] = Field(default_factory=list)


def _seconds(first: str, last: str) -> float | None:
    try:
        a = datetime.fromisoformat(first)
        b = datetime.fromisoformat(last)
    except ValueError:
        return None
    return max(0.0, (b - a).total_seconds())


def _final_adjusted(rows: list[HypothesisTest]) -> None:
    """Adjust each family's raw p-values over all of its tests, as the investigation does after its last test. A
    family adjusted over its declared size (Bonferroni: confirmations) was final when recorded and is kept."""
    for purpose in {r.purpose for r in rows}:
        family = [r for r in rows if r.purpose == purpose]
        method = family[-1].adjust_method
        if method == "bonferroni":
            continue
        for r, a in zip(family, stats.adjust_pvalues([r.p_value for r in family], method=method)):
            r.adjusted_p = float(a)


def extract_run(events: list[Event], path: str | Path = "") -> RunReport:
    """The report model of one run's events (as ``agent.transcript.read_transcript`` returns them)."""
    view = InvestigationView.from_events(events)
    started, finished = view.started, view.finished
    label = str(started.config.get("class", "")) if started else ""
    class_prompt = started.class_prompt if started is not None else None
    budget = Budget(images_used=view.images_used, planner_turns=len(view.turns), tool_calls=len(view.calls),
                    tool_errors=view.tool_errors, tool_seconds=view.tool_seconds, prompt_tokens=view.prompt_tokens,
                    completion_tokens=view.completion_tokens, cost_usd=view.cost_usd)
    rows: list[HypothesisTest] = []
    pairs: list[PairSet] = []
    for r in view.returned:
        x = r.result
        if isinstance(x, measure_rate.Result):
            rows.append(_test_row(x, r.seq))
            if x.mode == "counterfactual":
                budget.images_edited += x.edited.n if x.edited is not None else 0
                pairs.append(PairSet(source=x.test_id, before_caption=class_prompt or "", after_caption=x.caption,
                                     flips=x.flips, mcnemar=x.mcnemar, note="; ".join(x.notes)))
        elif isinstance(x, edit_image.Result):
            budget.images_edited += len(x.edits)
            pairs.append(PairSet(source=f"edit_image ({r.event.call_id})",
                                 before_caption=str(r.arguments.get("source_caption", "")),
                                 after_caption=str(r.arguments.get("target_caption", "")),
                                 flips=x.edits, mcnemar=x.mcnemar))
    samples = view.samples
    findings = view.findings
    key = normalise_caption(class_prompt) if class_prompt else None
    pooled = [s for s in samples if normalise_caption(s.summary.prompt) == key]
    _final_adjusted(rows)
    by_caption = {normalise_caption(f.caption): f.finding_id for f in findings}
    for row in rows:
        if row.mode == "sample":
            row.finding_id = by_caption.get(normalise_caption(row.caption))
    if started is not None:
        budget.images_budget = started.config.get("budget") if isinstance(started.config.get("budget"), int) else None
    if events:
        budget.wall_seconds = _seconds(events[0].ts, events[-1].ts)
    clusters = view.results(caption_failures.Result)
    proposals = [Proposal(parent=p.parent, caption=p.caption, relation=p.relation) for p in view.proposals]
    return RunReport(
        path=str(path), run_id=started.run_id if started else Path(path).parent.name, label=label,
        planner=started.planner if started else "", command=started.command if started else "",
        status=finished.status if finished else "unfinished", answer=finished.answer if finished else None,
        config=started.config if started else {}, backends=started.backends if started else {},
        class_prompt=class_prompt, baseline=pooled[0].summary if pooled else None, modes=mode_summaries(view),
        findings=findings, tests=rows,
        groups=_groups(samples, clusters), pairs=pairs,
        tree=build_tree(class_prompt, proposals, [(r.caption, r.test_id) for r in rows],
                        {f.caption: f.finding_id for f in findings}),
        budget=budget, reasoning=[t.reasoning for t in view.turns if t.reasoning], warnings=view.warnings,
    )


def _test_row(r: measure_rate.Result, seq: int) -> HypothesisTest:
    # Counterfactual: the edited images' failures, as the test recorded them.
    rate = r.hypothesis.failures if r.hypothesis is not None else r.edited or stats.binomial_rate(0, 0)
    return HypothesisTest(
        test_id=r.test_id, seq=seq, caption=r.caption, purpose=r.purpose, mode=r.mode, hypothesis=rate,
        baseline=r.baseline, rate_ratio=r.rate_ratio, p_value=r.p_value, adjusted_p=r.adjusted_p,
        adjusted_p_at_test=r.adjusted_p, adjust_method=r.adjust_method, verdict=r.verdict, mcnemar=r.mcnemar,
        summary=r.hypothesis, effect=r.effect, bound=r.bound,
    )


def _groups(samples: list[generate_and_classify.Result], clusters: list[caption_failures.Result]) -> list[ImageGroup]:
    out: list[ImageGroup] = []
    for s in samples:
        f = s.summary.failures
        top = ", ".join(f"{c.label} ({c.count})" for c in s.summary.confusions)
        if s.failure_images:
            out.append(ImageGroup(title=f"Failures of '{s.summary.prompt}'",
                                  detail=f"{f.k}/{f.n} failed; top confusions: {top or 'none'}",
                                  refs=s.failure_images, prompt=s.summary.prompt))
        if s.success_images:
            out.append(ImageGroup(title=f"Correctly classified: '{s.summary.prompt}'", refs=s.success_images,
                                  prompt=s.summary.prompt, failures=False))
    for c in clusters:
        for h in c.hypotheses:
            out.append(ImageGroup(title=h.caption, detail=f"cluster of {h.n_images} failures predicted "
                                                          f"'{h.predicted_label}'", refs=h.images))
    return out


class ReportError(Exception):
    """A run directory that cannot be reported: no transcript, or one that cannot be read or trusted."""


def find_transcripts(path: str | Path) -> list[Path]:
    """The transcripts under ``path``: the file itself, ``path/transcript.jsonl``, or every run directory below
    ``path`` (an audit: one run per class), in name order."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise ReportError(f"no such file or directory: {p}")
    if (p / "transcript.jsonl").is_file():
        return [p / "transcript.jsonl"]
    # Run directories sit one or two levels down (audit/<class>/transcript.jsonl or audit/<class>/<run>/...).
    found = sorted({*p.glob("*/transcript.jsonl"), *p.glob("*/*/transcript.jsonl")})
    if not found:
        raise ReportError(f"no transcript.jsonl in {p} or the run directories below it")
    return found


def load_runs(path: str | Path, *, verify: bool = True) -> list[RunReport]:
    """Every run under ``path`` (see ``find_transcripts``) as report models; ``ReportError`` names a bad file."""
    from sleuth.agent.transcript import TranscriptError, read_transcript

    runs = []
    for t in find_transcripts(path):
        try:
            events = read_transcript(t, verify=verify)
        except TranscriptError as e:
            raise ReportError(f"{t}: line {e.line}: {e.reason}") from None
        except OSError as e:
            raise ReportError(f"cannot read {t}: {e.strerror or e}") from None
        if not events:
            raise ReportError(f"{t}: the transcript is empty")
        runs.append(extract_run(events, t))
    return runs
