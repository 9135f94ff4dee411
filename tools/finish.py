"""End the investigation with a short summary of what was found (and what was not)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from sleuth.tools.context import ToolContext
from sleuth.tools.text import Line, quote

NAME = "finish"


class Args(BaseModel):
    summary: str = Field(description="Plain-words summary: the recorded findings and the hypotheses ruled out.")


class Result(BaseModel):
    summary: str
    n_findings: int


def conclusions(recorded: Result, replayed: Result) -> list[tuple[str, Any, Any]]:
    """What a re-run must reproduce: the number of findings the run ended with."""
    return [] if recorded.n_findings == replayed.n_findings else [("n_findings", recorded.n_findings,
                                                                    replayed.n_findings)]


def summary(r: Result) -> str:
    return f"finished: {quote(r.summary)}"


def render(r: Result) -> list[Line]:
    return [[(r.summary, "")]]


def run(args: Args, ctx: ToolContext) -> Result:
    inv = ctx.investigation
    ctx.finished = True
    ctx.final_answer = args.summary
    return Result(summary=args.summary, n_findings=len(inv.findings) if inv is not None else 0)
