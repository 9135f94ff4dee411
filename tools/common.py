"""Result pieces several tools share, and the helper that finds a tool's investigation."""

from __future__ import annotations

from pydantic import BaseModel, Field

from sleuth.tools import stats
from sleuth.tools.context import ToolContext
from sleuth.tools.investigation import Investigation, Sample
from sleuth.tools.registry import ToolError
from sleuth.tools.text import Line, kn


class Confusion(BaseModel):
    label: str
    count: int


class SampleSummary(BaseModel):
    """What a sample of generated images says: failures k/n with a 95% interval, and the top confusions."""

    prompt: str
    failures: stats.Rate
    target_label: str | None = None
    target_hits: int | None = None
    confusions: list[Confusion] = Field(default_factory=list)
    invalid: int = 0
    unrendered: list[str] = Field(default_factory=list)
    seeds: tuple[int, int] = Field(description="first and last seed used")


def summarise(sample: Sample, target_label: str | None = None) -> SampleSummary:
    return SampleSummary(
        prompt=sample.prompt,
        failures=stats.binomial_rate(sample.k, sample.n),
        target_label=target_label,
        target_hits=int(sample.target_hits.sum()) if target_label else None,
        confusions=[Confusion(label=lab, count=c) for lab, c in sample.confusions()],
        invalid=int((~sample.valid).sum()),
        unrendered=list(sample.unrendered),
        seeds=(sample.seeds[0], sample.seeds[-1]),
    )


def sample_line(s: SampleSummary) -> Line:
    """failures k/n [interval]; target hits; the wrong answers; words the generator could not render."""
    line: Line = [("failures ", "key"), (kn(s.failures), "")]
    if s.target_label:
        line.append((f"; {s.target_label} {s.target_hits or 0}", ""))
    if s.confusions:
        line.append(("; wrong answers: " + ", ".join(f"{c.label} {c.count}" for c in s.confusions[:3]), "dim"))
    if s.unrendered:
        line.append((f"; not rendered: {', '.join(s.unrendered)}", "warn"))
    return line


def confusions_text(s: SampleSummary, limit: int = 3) -> str:
    return ", ".join(f"{c.label} ({c.count})" for c in s.confusions[:limit]) or "none"


def investigation(ctx: ToolContext) -> Investigation:
    inv = ctx.investigation
    if inv is None:
        raise ToolError("this tool needs an investigation (a class under audit); none is configured")
    return inv
