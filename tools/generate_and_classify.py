"""Generate images from a text prompt on fresh seeds and classify them.

Returns the failure count k/n with a 95% interval under the investigation's failure criterion, how often the
classifier chose `target_label`, the most frequent wrong labels, refs of sample images (failures first), and the
words of the prompt the generator could not render (a hypothesis with unrendered words was not really tested).
`prompts` instead screens several captions in one call on the screening ladder: a few images each, more for those
that may fail at the `effect` asked for, until each is singled out for a test or dropped; they come back ranked, with
their screen k/n and the ones to test next (with measure_rate, on fresh seeds). A screen tests nothing.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from sleuth.tools import ladder, stats
from sleuth.tools.common import SampleSummary, confusions_text, investigation, sample_line, summarise
from sleuth.tools.context import ToolContext
from sleuth.tools.investigation import Investigation, Sample, merge, normalise_caption
from sleuth.tools.registry import ToolError
from sleuth.tools.text import MAX_ITEMS, Line, cut, kn_short, quote

NAME = "generate_and_classify"


MAX_PROMPTS = 200


class Args(BaseModel):
    prompt: str | None = Field(None, description="Text prompt for the generator, e.g. 'a realistic photograph of a "
                                                 "bicycle at night' (with prompts or proposed: one more to screen).")
    n: int = Field(100, description="Number of images to generate (fresh seeds); not used with prompts.", ge=1,
                   le=5000)
    target_label: str | None = Field(None, description="A label whose hits to count, e.g. the suspected confusion.")
    prompts: list[str] | None = Field(None, max_length=MAX_PROMPTS, description=(
        "Instead of prompt: captions of the class to screen in one call on the screening ladder (3, 12, 32 images "
        "each at effect 3; 12 to 200 at effect 2; 80 to 500 at effect 1.5), ranked, with the ones to test next. "
        "Earlier images of the same caption count."))
    proposed: bool = Field(False, description=(
        "Also screen every caption caption_failures and perturb_caption proposed so far that no screen at this "
        "effect has decided yet: new ones, and ones a screen left open when it reached max_images (they go on "
        "where they stopped); up to 200 captions in all, a next call takes the rest."))
    effect: float = Field(3.0, json_schema_extra={"enum": [3.0, 2.0, 1.5]}, description=(
        "With prompts: the failure worth finding, in times the class's failure rate (3: strong effects, cheap; 2 and "
        "1.5: weaker ones, more images per caption)."))
    max_images: int | None = Field(None, ge=1, le=100_000, description=(
        "With prompts: most images the screen may spend (default: half the images left)."))

    @field_validator("effect")
    @classmethod
    def _effect(cls, v: float) -> float:
        known = [t.ratio for t in ladder.PASSES]
        if v not in known:
            raise ValueError(f"effect must be one of {', '.join(f'{x:g}' for x in known)}")
        return v

    @model_validator(mode="after")
    def _one(self) -> Args:
        if self.prompt is None and self.prompts is None and not self.proposed:
            raise ValueError("give prompt (one caption), or prompts (captions to screen) and/or proposed=true")
        return self

    @property
    def screening(self) -> bool:
        """A screen: prompts or proposed given (a prompt given with them is screened with them)."""
        return self.prompts is not None or self.proposed


class Screened(BaseModel):
    """One caption of a screen."""

    caption: str
    k: int
    n: int
    plausible: float = Field(description="Posterior probability that it fails at the effect screened for or more.")
    verdict: Literal["test", "open", "dropped", "unrendered"] = Field(description=(
        "'test': singled out, test it (measure_rate, fresh seeds); 'open': worth more images, the screen stopped "
        "first; 'dropped': unlikely to fail that often; 'unrendered': the generator cannot draw all of it."))
    wrong_label: str | None = None
    measurement_id: str | None = Field(None, description="Its pooled screening images (for caption_failures).")


class Screen(BaseModel):
    effect: float
    class_rate: stats.Rate = Field(description="The class baseline the screen compares with (discovery seeds).")
    worth: float = Field(description="The failure rate worth finding: effect x the class rate, and at least a few "
                                     "points above it.")
    captions: list[Screened] = Field(description="Ranked: to test first, then open, dropped, unrendered.")
    images: int = Field(description="Images this call spent on screening (besides any baseline top-up).")
    stopped: str = Field(description="'done' (every caption singled out or dropped) or 'max_images'.")

    @property
    def to_test(self) -> list[str]:
        return [c.caption for c in self.captions if c.verdict == "test"]


class Result(BaseModel):
    measurement_id: str = Field(description="Id to pass to caption_failures (with prompts: the top caption's).")
    summary: SampleSummary = Field(description="The sample (with prompts: the top caption's pooled screen).")
    failure_images: list[str] = Field(description="Refs of up to 8 failed images.")
    success_images: list[str] = Field(description="Refs of up to 4 correctly classified images.")
    screen: Screen | None = Field(None, description="With prompts: the screen, ranked.")


VERDICT_ORDER = {"test": 0, "open": 1, "dropped": 2, "unrendered": 3}
SUMMARY_ROWS = 12


def summary(r: Result) -> str:
    if r.screen is not None:
        sc = r.screen
        rows = "; ".join(f"{quote(c.caption)} {c.k}/{c.n} {c.verdict}" + (f" ({c.measurement_id})"
                                                                          if c.measurement_id else "")
                         for c in sc.captions[:SUMMARY_ROWS])
        more = f"; +{len(sc.captions) - SUMMARY_ROWS} more" if len(sc.captions) > SUMMARY_ROWS else ""
        return (f"screen at {sc.effect:g}x (class {kn_short(sc.class_rate)}, worth {100 * sc.worth:.1f}%): "
                f"{len(sc.to_test)} to test, {sc.images} images, {sc.stopped}: {rows}{more}")
    s = r.summary
    return (f"{r.measurement_id}: prompt {quote(s.prompt)} failures {kn_short(s.failures)}; "
            f"confusions: {confusions_text(s)}")


def render(r: Result) -> list[Line]:
    if r.screen is None:
        return [[(f"{r.measurement_id} ", "bold"), (cut(r.summary.prompt, 80), "")], sample_line(r.summary)]
    sc = r.screen
    lines: list[Line] = [[(f"screen at {sc.effect:g}x ", "bold"),
                          (f"{len(sc.captions)} captions, {sc.images} images; class {kn_short(sc.class_rate)}, "
                           f"worth finding {100 * sc.worth:.1f}%; {len(sc.to_test)} to test", "")]]
    for c in sc.captions[:MAX_ITEMS]:
        style = {"test": "bold", "dropped": "dim", "unrendered": "warn"}.get(c.verdict, "")
        lines.append([(f"{c.verdict:<10} ", style), (f"{c.k}/{c.n} ", "key"), (cut(c.caption, 70), "")])
    if len(sc.captions) > MAX_ITEMS:
        lines.append([(f"… +{len(sc.captions) - MAX_ITEMS}", "dim")])
    if sc.stopped != "done":
        lines.append([("stopped at max_images: call again to screen further", "warn")])
    return lines


def run(args: Args, ctx: ToolContext) -> Result:
    inv = investigation(ctx)
    if args.screening:
        return _screen(inv, args)
    assert args.prompt is not None
    sample = inv.sample(args.prompt, args.n, target_label=args.target_label)
    pool(inv, sample)
    m = inv.store(sample)
    if normalise_caption(args.prompt) == normalise_caption(inv.class_prompt):
        # Class-prompt samples on discovery seeds are the baseline; pooling them wastes no image.
        have = inv.baselines.get("discovery")
        inv.baselines["discovery"] = sample if have is None else merge(have, sample)
    fails = [r for r, bad in zip(m.image_refs, sample.failed) if bad and r]
    oks = [r for r, bad in zip(m.image_refs, sample.failed) if not bad and r]
    return Result(measurement_id=m.id, summary=summarise(sample, args.target_label),
                  failure_images=fails[:8], success_images=oks[:4])


def pool(inv: Investigation, sample: Sample) -> Sample:
    """Adds a discovery sample to its caption's screening images (what a later screen of the caption starts from)."""
    key = normalise_caption(sample.prompt)
    have = inv.screened.get(key)
    inv.screened[key] = sample if have is None else merge(have, sample)
    return inv.screened[key]


def _screen(inv: Investigation, args: Args) -> Result:
    label = inv.label.lower()
    class_key = normalise_caption(inv.class_prompt)
    prompts: list[str] = []
    keys: set[str] = set()
    for p in [*([args.prompt] if args.prompt else []), *(args.prompts or [])]:
        if label not in p.lower():
            raise ToolError(f"every caption must name the class under audit ({inv.label!r}): {p!r}")
        key = normalise_caption(p)
        if key == class_key:
            raise ToolError(f"{p!r} is the class prompt, the baseline a screen compares with: screen captions that "
                            "change something")
        if key not in keys:
            keys.add(key)
            prompts.append(p)
    taken = inv.screen_taken.setdefault(args.effect, set())
    if args.proposed:
        more = [c for key, c in inv.proposed.items() if key not in taken and key not in keys and key != class_key
                and label in c.lower()]
        if not more and not prompts:
            raise ToolError(f"nothing proposed is left to screen at effect {args.effect:g}: call caption_failures or "
                            "perturb_caption first, give prompts, or screen at a smaller effect")
        prompts += more[:max(0, MAX_PROMPTS - len(prompts))]
    t = ladder.target_for(args.effect)
    base = inv.baseline("discovery", t.baseline_n)
    p0 = ladder.class_rate(base.k, base.n)
    missing = inv.backends.generator.unrendered(prompts)
    cands: list[ladder.Screened] = []
    for p, words in zip(prompts, missing):
        have = inv.screened.get(normalise_caption(p))
        c = ladder.Screened(p, have.k if have is not None else 0, have.n if have is not None else 0)
        if words:
            c.verdict = "unrendered"
        cands.append(c)
    fresh: dict[str, Sample] = {}

    def look(caption: str, n: int) -> tuple[int, int, bool]:
        got = inv.sample(caption, n, target_label=args.target_label, task="screening")
        fresh[caption] = got if caption not in fresh else merge(fresh[caption], got)
        pool(inv, got)
        return got.n, got.k, not got.unrendered

    cap = args.max_images if args.max_images is not None else inv.budget.left // 2
    spent, stopped = ladder.screen(cands, p0, t, look, min(cap, inv.budget.left))
    rows: list[Screened] = []
    for c in cands:
        pooled = inv.screened.get(normalise_caption(c.caption))
        mid = None
        wrong = None
        if c.caption in fresh and pooled is not None:
            mid = inv.store(pooled).id
            conf = pooled.confusions()
            wrong = conf[0][0] if conf else None
        verdict = c.verdict if c.verdict != "new" else "open"
        rows.append(Screened(caption=c.caption, k=c.k, n=c.n, plausible=round(ladder.plausibility(c.k, c.n, p0, t), 4),
                             verdict=verdict, wrong_label=wrong, measurement_id=mid))
    rows.sort(key=lambda r: (VERDICT_ORDER[r.verdict], -ladder.score(r.k, r.n, p0), r.caption))
    # Decided at this effect; one left open (the screen reached max_images first) is proposed again, and goes on.
    taken.update(normalise_caption(r.caption) for r in rows if r.verdict != "open")
    sc = Screen(effect=args.effect, class_rate=stats.binomial_rate(base.k, base.n), worth=round(t.worth(p0), 4),
                captions=rows, images=spent, stopped=stopped)
    top = next((r for r in rows if r.measurement_id is not None), None)
    if top is None or top.measurement_id is None:
        m = inv.store(base)
        return Result(measurement_id=m.id, summary=summarise(base), failure_images=[], success_images=[], screen=sc)
    m = inv.measurement(top.measurement_id)
    fails = [r for r, bad in zip(m.image_refs, m.sample.failed) if bad and r]
    oks = [r for r, bad in zip(m.image_refs, m.sample.failed) if not bad and r]
    return Result(measurement_id=m.id, summary=summarise(m.sample, args.target_label), failure_images=fails[:8],
                  success_images=oks[:4], screen=sc)
