"""Measure a hypothesis: the failure rate of a caption against the class baseline, on fresh seeds.

Images of the caption are sampled in batches (sequential test: stop early for success or futility, with the
overall false-positive rate kept at alpha by alpha spending). The result gives both rates as k/n with 95% intervals,
the rate ratio with its interval, the exact one-sided p-value, the p-value adjusted over every hypothesis tested so
far in this investigation, and a verdict. `confirm=true` re-measures on the confirmation seeds (disjoint from all
discovery seeds, against a confirmation baseline): a finding can only be recorded after a confirmation.
`mode="counterfactual"` instead edits fresh class images to match the caption and tests the flips with the paired
exact McNemar test: evidence that the captioned attribute itself causes the failures.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, Field

from sleuth.tools import stats
from sleuth.tools.common import SampleSummary, investigation, sample_line, summarise
from sleuth.tools.context import ToolContext
from sleuth.tools.counterfactual import (
    Flip,
    control_for,
    counterfactual_pairs,
    counterfactual_size,
    mcnemar_text,
    paired_counts,
)
from sleuth.tools.defaults import BASELINE_N, FIRST_N
from sleuth.tools.designs import Spending
from sleuth.tools.investigation import (
    ConfirmationDesign,
    Investigation,
    Purpose,
    Test,
    merge,
    normalise_caption,
    split_sentences,
)
from sleuth.tools.record_finding import content_words
from sleuth.tools.registry import ToolError
from sleuth.tools.text import VERDICT_STYLE, Line, kn, kn_short, num, pv, quote, ratio

NAME = "measure_rate"

Verdict = Literal["supported", "not supported", "inconclusive"]


class Args(BaseModel):
    caption: str = Field(description="The hypothesis as a caption, e.g. 'a realistic photograph of a bicycle. it is "
                                     "at night.'")
    target_label: str | None = Field(None, description="Suspected confusion label; its hit rate is reported too.")
    confirm: bool = Field(False, description="Re-measure on fresh confirmation seeds (required before record_finding).")
    mode: Literal["sample", "counterfactual"] = Field(
        "sample", description="'sample': generate the caption; 'counterfactual': edit class images to the caption.")
    max_n: int = Field(800, ge=20, le=5000, description="Most images to spend on the caption (sequential stopping).")
    first_n: int = Field(FIRST_N, ge=10, le=2000, description="Images at the first look.")
    baseline_n: int = Field(BASELINE_N, ge=50, le=20_000,
                            description="Least baseline size (class prompt, same seed space).")
    futility_rate: float | None = Field(None, gt=0.0, lt=1.0, description=(
        "Stop early, not supported, once the upper end of the caption's failure rate (95% Wilson) falls below this "
        "rate: the least effect worth pursuing. It only takes rejections away, so the test keeps its level."))
    spending: Spending = Field("obrien-fleming", description=(
        "How the test spreads its alpha over its looks: 'obrien-fleming' keeps nearly all of it for the last look (the "
        "most power at max_n); 'pocock' spends it more evenly, so that a clear effect stops at an early look for fewer "
        "images. A confirmation uses its declared design's (the first attempt's, when it declares no designs)."))
    designs: list[ConfirmationDesign] | None = Field(None, description=(
        "confirm=true, first attempt only: the sizes every confirmation attempt may use, each with its share of the "
        "declared attempts (they must add up to them). Fixed before the confirmation baseline is drawn. Default: "
        "this call's first_n and max_n serve every attempt."))


class Result(BaseModel):
    test_id: str
    caption: str
    purpose: Purpose
    mode: str
    hypothesis: SampleSummary | None = None
    baseline: stats.Rate
    rate_ratio: stats.RatioCI | None = None
    p_value: float = Field(description="One-sided exact p-value (valid under the sequential design).")
    adjusted_p: float = Field(description="Adjusted over every hypothesis of this family so far.")
    family_size: int
    adjust_method: str
    looks: list[int] = Field(default_factory=list, description="Sample sizes at which the test looked.")
    stopped: str = ""
    effect: stats.RatioCI | None = Field(None, description=(
        "A supported confirmation: its rate ratio corrected for being selected (a finding is recorded only when the "
        "confirmation rejects) and for the early stop: conditionally median-unbiased, with a 95% interval given "
        "that selection. The naive rate_ratio of a recorded confirmation is biased upwards."))
    bound: float | None = Field(None, description=(
        "A supported confirmation's headline: the caption fails at least this many times as often as the class. The "
        "least rate ratio the confirmation's own exact test still rejects at its threshold (at the class rate's "
        "upper end); at least 1, and all of an investigation's bounds hold together with probability 1 - 2 alpha."))
    mcnemar: stats.McNemar | None = Field(None, description=(
        "Counterfactual mode: the test, exact McNemar of each edited image against the same image control-edited "
        "(a sham with the caption unchanged, or a placebo naming nothing new)."))
    sham: stats.McNemar | None = Field(None, description=(
        "Counterfactual mode: the control edit's own flips against the images as generated (the editor's effect)."))
    original: stats.Rate | None = Field(None, description="Counterfactual mode: failures among the images as "
                                                          "generated (the baseline is the control-edited images).")
    edited: stats.Rate | None = Field(None, description="Counterfactual mode: failures among the edited images.")
    flips: list[Flip] = Field(default_factory=list)
    measurement_id: str | None = None
    verdict: Verdict
    notes: list[str] = Field(default_factory=list)
    budget_charged: int | None = Field(None, description="Counterfactual mode: images' worth the call charged to the "
                                                         "budget (class images generated, and their editing).")


def summary(r: Result) -> str:
    mode = ", counterfactual" if r.mode == "counterfactual" else ""
    rate = kn_short(r.hypothesis.failures) if r.hypothesis else f"edits {kn_short(r.edited)}"
    paired = f", McNemar b={r.mcnemar.b} c={r.mcnemar.c}" if r.mcnemar else ""
    bound = f", at least {num(r.bound)}x" if r.bound is not None else ""
    return (f"{r.test_id} ({r.purpose}{mode}) {quote(r.caption)}: {rate} vs baseline {kn_short(r.baseline)}, "
            f"ratio {ratio(r.rate_ratio)}{bound}, p={pv(r.p_value)}, adjusted p={pv(r.adjusted_p)}{paired}, "
            f"{r.verdict}")


def render(r: Result) -> list[Line]:
    kind = f"  {r.purpose}" + (", counterfactual" if r.mode == "counterfactual" else "")
    lines: list[Line] = [[(f"{r.test_id} ", "bold"), (r.verdict, VERDICT_STYLE.get(r.verdict, "")), (kind, "dim")]]
    if r.hypothesis is not None:
        lines.append([("hypothesis  ", "key"), *sample_line(r.hypothesis)])
    if r.edited is not None:
        lines.append([("edited      ", "key"), (f"failures {kn(r.edited)}", "")])
    if r.mcnemar is not None:
        vs = " against the sham edit" if r.sham is not None else ""
        lines.append([("edits       ", "key"), (mcnemar_text(r.mcnemar) + vs, "")])
    if r.sham is not None:
        lines.append([("sham edit   ", "key"), (f"{r.sham.b} flipped to failure, {r.sham.c} back "
                                                f"(the editor alone, caption unchanged)", "dim")])
    lines.append([("baseline    ", "key"), (kn(r.baseline) + (" (control-edited)" if r.sham is not None else ""), "")])
    lines.append([("rate ratio  ", "key"), (ratio(r.rate_ratio) + (" (naive)" if r.bound is not None else ""), "")])
    if r.bound is not None:
        lines.append([("at least    ", "key"), (f"{num(r.bound)}× the class's failure rate: the least ratio this "
                                                "confirmation's own test still rejects", "bold")])
    if r.effect is not None:
        shown = stats.given_selection(r.effect, r.bound) if r.bound is not None else r.effect
        lines.append([("effect      ", "key"), (f"{ratio(shown)} given selection (corrected for the selection and "
                                                "the early stop)", "")])
    looks = f"; looks at n={', '.join(map(str, r.looks))}, stopped: {r.stopped}" if r.looks else ""
    over = ("declared confirmation attempts" if r.purpose == "confirmation" else "discovery tests so far")
    lines.append([("p           ", "key"), (f"{pv(r.p_value)}, {r.adjust_method}-adjusted {pv(r.adjusted_p)} over "
                                            f"{r.family_size} {over}{looks}", "")])
    lines += [[("note        ", "key"), (note, "warn")] for note in r.notes]
    return lines


def run(args: Args, ctx: ToolContext) -> Result:
    inv = investigation(ctx)
    if inv.label.lower() not in args.caption.lower():
        raise ToolError(f"the caption must name the class under audit ({inv.label!r}): {args.caption!r}")
    if args.mode == "sample" and split_sentences(normalise_caption(args.caption)) == \
            split_sentences(normalise_caption(inv.class_prompt)):
        raise ToolError(f"{args.caption!r} is the class prompt itself, the baseline every hypothesis is measured "
                        "against: a hypothesis adds a condition to it (e.g. a background, a style or an object), "
                        "taken from caption_failures or perturb_caption")
    purpose: Purpose = "confirmation" if args.confirm else "discovery"
    if args.mode == "counterfactual":
        return _counterfactual(inv, args, purpose)
    return _sequential(inv, args, purpose)


def _sequential(inv: Investigation, args: Args, purpose: Purpose) -> Result:
    # A test stops for success only where it survives the correction it faces: a confirmation at its share of the
    # declared confirmation family; a discovery test at alpha over the discovery tests so far, itself included
    # (Bonferroni, which bounds Holm's and Benjamini-Hochberg's adjusted p at the time of its result).
    if purpose == "confirmation":
        level = inv.confirmation_alpha()
    else:
        level = inv.alpha / (1 + sum(t.purpose == "discovery" for t in inv.tests))
    design = (inv.confirmation_design(args.first_n, args.max_n, caption=args.caption, baseline_n=args.baseline_n,
                                      designs=args.designs, spending=args.spending)
              if purpose == "confirmation" else None)
    # Sizes fixed before the baseline is seen are what keeps a confirmation valid; so is a budget stop without the
    # unspent alpha, since the budget left is the planner's to steer (tools/stats/__init__.py).
    fixed = design is not None and not inv.legacy_confirmations
    base = (inv.confirmation_baseline(design, args.baseline_n) if design is not None
            else inv.baseline(purpose, args.baseline_n))
    if design is not None:
        plan = design.plan(level)
    else:
        plan = stats.default_plan(args.max_n, first=min(args.first_n, args.max_n), alpha=level,
                                  spending=args.spending)
    sample = None
    p_values: list[float] = []
    looks: list[int] = []
    stopped = "max_n"
    declared_final = False
    threshold = 0.0  # the threshold of the look that rejected, if one did
    for j, look_n in enumerate(plan.looks):
        more = look_n - (sample.n if sample is not None else 0)
        if more > inv.budget.left and sample is not None:
            stopped = "budget"
            break
        fresh = inv.sample(args.caption, more, purpose=purpose, target_label=args.target_label,
                           task=f"measuring ({purpose})")
        sample = fresh if sample is None else merge(sample, fresh)
        looks.append(look_n)
        # When the budget cannot pay for the next look, this one is the last: known before its outcome is seen,
        # so it may spend the rest of the alpha.
        final = j + 1 < len(plan.looks) and plan.looks[j + 1] - look_n > inv.budget.left and not fixed
        decision = plan.decide(j, sample.k, sample.n, base.k, base.n, final=final)
        p_values.append(decision.p_value)
        declared_final = final
        if decision.action != "continue":
            stopped = decision.action
            threshold = decision.threshold
            break
        if args.futility_rate is not None and j + 1 < len(plan.looks) and \
                stats.binomial_rate(sample.k, sample.n).high < args.futility_rate:
            stopped = "futility"
            break
        if final:
            stopped = "budget"
            break
    # min_j p_j * alpha / alpha_j is a valid p-value for the whole sequential test (union bound).
    p_seq = plan.overall_p_value(p_values, final=declared_final)
    assert sample is not None
    test = inv.add_test(Test(id=f"t{len(inv.tests) + 1}", caption=args.caption, purpose=purpose, p_value=p_seq,
                             k1=sample.k, n1=sample.n, k0=base.k, n0=base.n,
                             design=design.key if design is not None else None))
    m = inv.store(sample)
    ratio = stats.rate_ratio(sample.k, sample.n, base.k, base.n)
    family_size, method = family_of(inv, purpose)
    notes = []
    if sample.unrendered:
        notes.append(f"the generator could not render: {', '.join(sample.unrendered)}; "
                     "this caption was not fully tested")
    effect = None
    bound = None
    if purpose == "confirmation" and stopped == "success":
        # The headline: the confirmation's own test inverted at the threshold it rejected at (stats.bound).
        bound = stats.headline_bound(sample.k, sample.n, base.k, base.n, threshold, level)
        test.bound = bound
    if fixed and stopped == "success" and sample.n == looks[-1]:
        # The look that rejected is the last one made; the estimate conditions on that selection. (A look short of
        # its planned size, images the generator could not make, is not in the plan's sample space: no estimate.)
        effect = stats.conditional_effect(plan, sample.k, len(looks) - 1, base.k, base.n, args.futility_rate)
        test.effect = effect
        if math.isnan(effect.ratio) or effect.low < 1.0:
            notes.append(f"barely past its threshold: it fails at least {num(bound or 1.0)}× as often as the class, "
                         "and corrected for being selected the data do not say by how much more; the excess seen "
                         "may be mostly the selection's")
    if stopped == "futility" and args.futility_rate is not None:
        notes.append(f"stopped for futility at n={sample.n}: the 95% upper end of its failure rate, "
                     f"{100 * stats.binomial_rate(sample.k, sample.n).high:.3g}%, is below the "
                     f"{100 * args.futility_rate:.3g}% asked for")
    if fixed:
        assert design is not None
        notes.append(f"sizes fixed before the confirmation baseline was drawn: {design.text()} (looks at "
                     f"n={', '.join(map(str, plan.looks))}); attempt {inv.design_attempts(design.key)} of the "
                     f"{design.attempts} declared with these sizes, of {inv.max_confirmations} in all")
        if stopped == "budget":
            notes.append("the budget ended the attempt before its last look; the looks made kept their planned "
                         "thresholds")
    verdict = _verdict(test.adjusted_p, inv.alpha, stopped, ratio)
    test.verdict = verdict
    return Result(
        test_id=test.id, caption=args.caption, purpose=purpose, mode="sample",
        hypothesis=summarise(sample, args.target_label), baseline=stats.binomial_rate(base.k, base.n),
        rate_ratio=ratio, effect=effect, bound=bound, p_value=p_seq, adjusted_p=test.adjusted_p,
        family_size=family_size, adjust_method=method, looks=looks, stopped=stopped,
        measurement_id=m.id, verdict=verdict, notes=notes,
    )


def family_of(inv: Investigation, purpose: Purpose) -> tuple[int, str]:
    """The family a test's adjusted p is over: the discovery tests so far (Holm; final at the run's end), or the
    declared confirmation family (Bonferroni; final at once)."""
    if purpose == "confirmation":
        return inv.max_confirmations, "bonferroni"
    return sum(t.purpose == "discovery" for t in inv.tests), inv.adjust_method


def conclusions(recorded: Result, replayed: Result) -> list[tuple[str, Any, Any]]:
    """What a re-run must reproduce: the verdict (significance after correction, or ruled out)."""
    return [] if recorded.verdict == replayed.verdict else [("verdict", recorded.verdict, replayed.verdict)]


def _verdict(adjusted_p: float, alpha: float, action: str, ratio: stats.RatioCI) -> Verdict:
    if adjusted_p <= alpha:
        return "supported"
    if action == "futility" or ratio.high < 1.5:
        return "not supported"
    return "inconclusive"


def _counterfactual(inv: Investigation, args: Args, purpose: Purpose) -> Result:
    if not content_words(args.caption) - content_words(inv.class_prompt):
        # Its control would be the sham (nothing to match with a placebo), against which an editor that damages
        # images whenever their caption changes passes dropped or reordered words as a cause.
        raise ToolError(f"{args.caption!r} adds no word to the class prompt {inv.class_prompt!r} (it drops or "
                        "reorders words): a counterfactual edits an attribute into class images, so its caption "
                        "names one the class prompt does not")
    try:  # refused before any image is made when no placebo can match the edit through this editor
        control_for(inv.backends.editor, inv.class_prompt, args.caption)
    except ValueError as e:
        raise ToolError(f"{args.caption!r}: {e}, so its counterfactual has no control to test against") from None
    n, notes = counterfactual_size(inv, args.max_n, sham=True)
    used = inv.budget.used
    base = inv.sample(inv.class_prompt, n, purpose=purpose, task=f"counterfactual ({purpose})")
    flips, _ = counterfactual_pairs(inv, base, inv.class_prompt, args.caption, sham=True)
    # Only pairs whose edit passed every quality filter are evidence (tools/counterfactual.py).
    pc = paired_counts(flips)
    if not pc.pairs:
        raise ToolError(f"none of the {len(flips)} edits passed the editor's quality filters "
                        f"({', '.join(sorted(pc.excluded_by))}): nothing to test")
    assert pc.failed_sham is not None and pc.vs_sham_to_failure is not None and pc.vs_sham_to_correct is not None
    assert pc.both_fail is not None and pc.sham_to_failure is not None and pc.sham_to_correct is not None
    # The test: each edited image against the same image control-edited (the editor's own effect held fixed).
    mc = stats.mcnemar_exact(pc.vs_sham_to_failure, pc.vs_sham_to_correct, alternative="greater")
    sham_mc = stats.mcnemar_exact(pc.sham_to_failure, pc.sham_to_correct, alternative="greater")
    test = inv.add_test(Test(id=f"t{len(inv.tests) + 1}", caption=args.caption, purpose=purpose,
                             p_value=mc.p_value, k1=pc.failed_after, n1=pc.pairs, k0=pc.failed_sham, n0=pc.pairs,
                             kind="counterfactual"))
    ratio = stats.paired_rate_ratio(pc.both_fail, pc.vs_sham_to_failure, pc.vs_sham_to_correct, pc.pairs)
    verdict = _verdict(test.adjusted_p, inv.alpha, "stop", ratio)
    test.verdict = verdict
    family_size, method = family_of(inv, purpose)
    excluded = pc.note()
    return Result(
        test_id=test.id, caption=args.caption, purpose=purpose, mode="counterfactual",
        baseline=stats.binomial_rate(pc.failed_sham, pc.pairs), rate_ratio=ratio, p_value=mc.p_value,
        adjusted_p=test.adjusted_p, family_size=family_size, adjust_method=method,
        mcnemar=mc, sham=sham_mc, original=stats.binomial_rate(pc.failed_before, pc.pairs),
        edited=stats.binomial_rate(pc.failed_after, pc.pairs),
        flips=[f for f in flips if f.counted and f.failed_sham != f.failed_after][:8], verdict=verdict,
        notes=[*notes, (f"{len(flips)} images edited from {inv.class_prompt!r}, each also control-edited (same "
                        "editor; each pair records its control); of the "
                        f"{pc.pairs} counted, {pc.failed_before} fail as generated, "
                        f"{pc.failed_sham} control-edited, {pc.failed_after} edited"),
               *([excluded] if excluded else [])],
        budget_charged=inv.budget.used - used,
    )
