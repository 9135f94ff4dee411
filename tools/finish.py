"""End the investigation with a short summary of what was found (and what was not).

The result lists the findings the tools recorded, and the run's answer ends with that list, whatever the summary
says: a planner's words cannot add a finding or lose one. A summary that says nothing was found while findings are
recorded is refused, with the list, so that the planner can say it again.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field

from sleuth.tools.context import ToolContext
from sleuth.tools.registry import ToolError
from sleuth.tools.text import Line, pv, quote

NAME = "finish"


class Args(BaseModel):
    summary: str = Field(description="Plain-words summary: the recorded findings and the hypotheses ruled out.")


class Result(BaseModel):
    summary: str
    n_findings: int
    findings: list[str] = Field(default_factory=list, description="The recorded findings, as the tools hold them: "
                                                                  "caption, confirmed effect [95% CI], adjusted p.")


NOTHING = re.compile(r"\b(no|zero|none of the|not a single)\b(?!\s+(other|further|more|additional)\b)"
                     r"[^.]{0,40}\b(findings?|failures?|hypothes[ie]s)\b[^.]{0,30}"
                     r"\b(confirmed|recorded|found|replicated|supported)\b"
                     r"|\bnothing (was |is )?(confirmed|found|recorded)\b", re.IGNORECASE)
"""A summary saying that nothing was found."""


def says_nothing_found(summary: str) -> bool:
    return bool(NOTHING.search(summary))


def conclusions(recorded: Result, replayed: Result) -> list[tuple[str, Any, Any]]:
    """What a re-run must reproduce: the number of findings the run ended with."""
    return [] if recorded.n_findings == replayed.n_findings else [("n_findings", recorded.n_findings,
                                                                    replayed.n_findings)]


def summary(r: Result) -> str:
    return f"finished: {quote(r.summary)}"


def render(r: Result) -> list[Line]:
    return [[(r.summary, "")], *[[("finding ", "key"), (f, "")] for f in r.findings]]


def finding_line(f: Any) -> str:
    """A finding's line in the final answer: its effect corrected for the confirmation's selection and early stop
    where the confirmation gives one (the naive ratio after it), else the confirmation's rate ratio."""
    c = f.confirmation
    r = c.rate_ratio
    corrected = getattr(c, "effect", None)
    bound = getattr(c, "bound", None)
    if bound is not None:
        effect = f"at least {bound:.3g}x the class's rate" + (f" (naive {r.ratio:.3g}x)" if r is not None else "")
    elif corrected is not None:
        effect = (f"{corrected.ratio:.3g}x [{corrected.low:.3g}, {corrected.high:.3g}] corrected for selection"
                  + (f" (naive {r.ratio:.3g}x)" if r is not None else ""))
    else:
        effect = f"{r.ratio:.3g}x [{r.low:.3g}, {r.high:.3g}]" if r is not None else "n/a"
    return f"{f.finding_id} {quote(f.caption)}: {effect}, adjusted p {pv(c.adjusted_p)}"


def run(args: Args, ctx: ToolContext) -> Result:
    inv = ctx.investigation
    recorded = [finding_line(f) for f in (inv.findings if inv is not None else []) if f.confirmed]
    if recorded and says_nothing_found(args.summary):
        raise ToolError(f"the summary says nothing was found, but {len(recorded)} finding"
                        f"{'s are' if len(recorded) != 1 else ' is'} recorded: " + "; ".join(recorded)
                        + ". Call finish again with a summary that reports them.")
    ctx.finished = True
    listing = ("Recorded findings: " + "; ".join(recorded) + ".") if recorded else "No finding was recorded."
    ctx.final_answer = f"{args.summary.rstrip()}\n\n{listing}"
    return Result(summary=args.summary, n_findings=len(recorded), findings=recorded)
