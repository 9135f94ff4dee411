"""Edit images into counterfactuals: the same image, changed only as the caption change says.

Each image is edited from `source_caption` to `target_caption` (toyworld re-renders its scene with the changed
attributes; real models use inversion + prompt-to-prompt), then both versions are classified. With several images,
the flips are tested with the exact McNemar test (paired data): did the edit make the classifier fail? Edits that
failed a quality filter of the editor are shown but not counted. Editing is charged to the image budget at the
editor's declared cost.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from sleuth.tools import stats
from sleuth.tools.backends.base import edit_cost
from sleuth.tools.common import investigation
from sleuth.tools.context import ToolContext
from sleuth.tools.counterfactual import Flip, edit_and_classify, mcnemar_text, paired_counts
from sleuth.tools.text import Line, pv

NAME = "edit_image"


class Args(BaseModel):
    images: list[str] = Field(description="Refs of images to edit (from earlier results).", min_length=1,
                              max_length=64)
    source_caption: str = Field(description="Caption that describes the images now.")
    target_caption: str = Field(description="The same caption with one change, e.g. a new background.")


class Result(BaseModel):
    edits: list[Flip]
    to_failure: int = Field(description="Counted images classified correctly before and wrongly after the edit.")
    to_correct: int = Field(description="Counted images classified wrongly before and correctly after the edit.")
    excluded: int = Field(0, description="Edits that failed a quality filter of the editor: not counted.")
    mcnemar: stats.McNemar | None = Field(None, description="Exact paired test over the counted pairs, with two or "
                                                            "more.")
    budget_charged: int = Field(0, description="Images' worth the editing cost (the editor's declared cost).")
    notes: list[str] = Field(default_factory=list)


def summary(r: Result) -> str:
    return (f"{len(r.edits)} images edited: {r.to_failure} became failures, {r.to_correct} became correct"
            + (f", McNemar p={pv(r.mcnemar.p_value)}" if r.mcnemar else ""))


def render(r: Result) -> list[Line]:
    n = len(r.edits)
    line: Line = [(f"{n} image{'s' * (n != 1)} edited: {r.to_failure} now fail, {r.to_correct} now pass", "")]
    if r.mcnemar:
        line.append((f"; {mcnemar_text(r.mcnemar)}", "dim"))
    return [line]


def run(args: Args, ctx: ToolContext) -> Result:
    inv = investigation(ctx)
    gens = [inv.generation(ref) for ref in args.images]
    charged = inv.budget.editing
    flips, _ = edit_and_classify(inv, gens, args.source_caption, args.target_caption)
    pc = paired_counts(flips)
    mc = stats.mcnemar_exact(pc.to_failure, pc.to_correct, alternative="greater") if pc.pairs > 1 else None
    notes = [n for n in (pc.note(), edit_cost(inv.backends.editor).describe()) if n]
    return Result(edits=flips, to_failure=pc.to_failure, to_correct=pc.to_correct, excluded=pc.excluded, mcnemar=mc,
                  budget_charged=inv.budget.editing - charged, notes=notes)
