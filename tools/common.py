"""Result pieces several tools share, and the helper that finds a tool's investigation."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from sleuth.tools import stats
from sleuth.tools.investigation import Investigation, Sample
from sleuth.tools.registry import ToolError


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


def investigation(ctx: Any) -> Investigation:
    inv = getattr(ctx, "investigation", None)
    if inv is None:
        raise ToolError("this tool needs an investigation (a class under audit); none is configured")
    return inv
