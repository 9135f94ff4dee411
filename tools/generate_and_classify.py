"""Generate images from a text prompt on fresh seeds and classify them.

Returns the failure count k/n with a 95% interval under the investigation's failure criterion, how often the
classifier chose `target_label`, the most frequent wrong labels, refs of sample images (failures first), and the
words of the prompt the generator could not render (a hypothesis with unrendered words was not really tested).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from sleuth.tools.common import SampleSummary, confusions_text, investigation, sample_line, summarise
from sleuth.tools.context import ToolContext
from sleuth.tools.investigation import merge, normalise_caption
from sleuth.tools.text import Line, cut, kn_short, quote

NAME = "generate_and_classify"


class Args(BaseModel):
    prompt: str = Field(description="Text prompt for the generator, e.g. 'a realistic photograph of a dog in the "
                                    "rain'.")
    n: int = Field(100, description="Number of images to generate (fresh seeds).", ge=1, le=5000)
    target_label: str | None = Field(None, description="A label whose hits to count, e.g. the suspected confusion.")


class Result(BaseModel):
    measurement_id: str = Field(description="Id to pass to caption_failures.")
    summary: SampleSummary
    failure_images: list[str] = Field(description="Refs of up to 8 failed images.")
    success_images: list[str] = Field(description="Refs of up to 4 correctly classified images.")


def summary(r: Result) -> str:
    s = r.summary
    return (f"{r.measurement_id}: prompt {quote(s.prompt)} failures {kn_short(s.failures)}; "
            f"confusions: {confusions_text(s)}")


def render(r: Result) -> list[Line]:
    return [[(f"{r.measurement_id} ", "bold"), (cut(r.summary.prompt, 80), "")], sample_line(r.summary)]


def run(args: Args, ctx: ToolContext) -> Result:
    inv = investigation(ctx)
    sample = inv.sample(args.prompt, args.n, target_label=args.target_label)
    m = inv.store(sample)
    if normalise_caption(args.prompt) == normalise_caption(inv.class_prompt):
        # Class-prompt samples on discovery seeds are the baseline; pooling them wastes no image.
        have = inv.baselines.get("discovery")
        inv.baselines["discovery"] = sample if have is None else merge(have, sample)
    fails = [r for r, bad in zip(m.image_refs, sample.failed) if bad and r]
    oks = [r for r, bad in zip(m.image_refs, sample.failed) if not bad and r]
    return Result(measurement_id=m.id, summary=summarise(sample, args.target_label),
                  failure_images=fails[:8], success_images=oks[:4])
