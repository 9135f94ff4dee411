"""End the investigation with a short summary of what was found (and what was not)."""

from __future__ import annotations

from pydantic import BaseModel, Field

NAME = "finish"


class Args(BaseModel):
    summary: str = Field(description="Plain-words summary: the recorded findings and the hypotheses ruled out.")


class Result(BaseModel):
    summary: str
    n_findings: int


def run(args: Args, ctx: object) -> Result:
    inv = getattr(ctx, "investigation", None)
    ctx.finished = True  # type: ignore[attr-defined]
    ctx.final_answer = args.summary  # type: ignore[attr-defined]
    return Result(summary=args.summary, n_findings=len(inv.findings) if inv is not None else 0)
