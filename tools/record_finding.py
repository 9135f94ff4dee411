"""Record a finding: a failure hypothesis that survived correction and a confirmation on fresh seeds.

The tool checks the evidence itself, so no planner can claim what the data does not support: a discovery
measurement of this caption, or of a caption it narrows (its content words plus at most ``MAX_EXTRA_WORDS`` more: a
longer caption the recorded one refines, not a catalogue of alternatives), that showed the increase, and a confirmation
measurement of this very caption, on seeds disjoint from discovery, significant after adjustment over the
investigation's declared confirmation family (every confirmation attempt counts, repeats of a caption included),
and the first such confirmation of the caption (citing the best of several would overstate its effect).
A finding's counterfactual may be cited when it is recorded or added later: recording the same caption again with
the same evidence and a counterfactual updates the finding under its id.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field

from sleuth.tools import stats
from sleuth.tools.common import investigation
from sleuth.tools.context import ToolContext
from sleuth.tools.findings import Evidence, Finding
from sleuth.tools.investigation import Test, normalise_caption
from sleuth.tools.perturb_caption import FUNCTION_WORDS
from sleuth.tools.registry import ToolError
from sleuth.tools.text import Line, kn, num, pv, quote, ratio

NAME = "record_finding"


class Args(BaseModel):
    caption: str = Field(description="The failure hypothesis, as measured.")
    discovery_test: str = Field(description="test_id of the measure_rate discovery result.")
    confirmation_test: str = Field(description="test_id of the measure_rate result with confirm=true.")
    counterfactual_test: str | None = Field(None, description=(
        "Optional test_id of a counterfactual measure_rate. To add one to a finding already recorded, call again "
        "with its caption, discovery and confirmation tests."))
    summary: str = Field("", description="One or two sentences in plain words: what fails, how often, why.")


Result = Finding


def evidence(t: Test) -> Evidence:
    return Evidence(test_id=t.id, hypothesis=stats.binomial_rate(t.k1, t.n1), baseline=stats.binomial_rate(t.k0, t.n0),
                    rate_ratio=stats.rate_ratio(t.k1, t.n1, t.k0, t.n0), p_value=t.p_value, adjusted_p=t.adjusted_p,
                    kind=t.kind, effect=t.effect, bound=t.bound)


def conclusions(recorded: Result, replayed: Result) -> list[tuple[str, Any, Any]]:
    """What a re-run must reproduce: the finding is confirmed, and its rate ratio lies in the re-run's interval."""
    out: list[tuple[str, Any, Any]] = []
    if recorded.confirmed != replayed.confirmed:
        out.append(("confirmed", recorded.confirmed, replayed.confirmed))
    r, again = recorded.confirmation.rate_ratio, replayed.confirmation.rate_ratio
    if not again.low <= r.ratio <= again.high:
        out.append(("confirmation.rate_ratio", str(r), str(again)))
    return out


def summary(r: Result) -> str:
    return f"finding {r.finding_id} recorded: {quote(r.caption)}"


def render(r: Result) -> list[Line]:
    c = r.confirmation
    out: list[Line] = [[(f"finding {r.finding_id}: ", "bold"), (r.caption, "bold")],
                       [("confirmation ", "key"), (f"{kn(c.hypothesis)} vs {kn(c.baseline)}, "
                                                   + (f"at least {num(c.bound)}×" if c.bound is not None
                                                      else ratio(c.rate_ratio))
                                                   + f", adjusted p {pv(c.adjusted_p)}", "")]]
    if r.counterfactual is not None:
        out.append([("counterfactual ", "key"), (f"{kn(r.counterfactual.hypothesis)} edited vs "
                                                 f"{kn(r.counterfactual.baseline)} control-edited, McNemar p "
                                                 f"{pv(r.counterfactual.p_value)} (adjusted "
                                                 f"{pv(r.counterfactual.adjusted_p)})", "")])
    return out


MAX_EXTRA_WORDS = 3
"""Most content words a cited discovery (or counterfactual) caption may have beyond the recorded caption's. A
refinement drops a sentence or an adjective or two of the caption that was measured; a caption naming many
alternatives ("a red, orange, yellow, ... cat") measured once is evidence for the catalogue, not for each entry."""


def content_words(caption: str) -> frozenset[str]:
    return frozenset(w for w in re.findall(r"[a-z]+", caption.lower()) if w not in FUNCTION_WORDS)


def extra_words(caption: str, measured: str) -> frozenset[str] | None:
    """Content words ``measured`` has beyond ``caption``'s, or None when ``caption`` adds a word of its own."""
    if normalise_caption(caption) == normalise_caption(measured):
        return frozenset()
    words, wider = content_words(caption), content_words(measured)
    return wider - words if words <= wider else None


def refines(caption: str, measured: str) -> bool:
    """``caption`` is ``measured`` or narrows it: words or sentences left out, none added, and at most
    ``MAX_EXTRA_WORDS`` content words fewer."""
    extra = extra_words(caption, measured)
    return extra is not None and len(extra) <= MAX_EXTRA_WORDS


def _not_refined(kind: str, t: Test, caption: str) -> str:
    extra = extra_words(caption, t.caption)
    if extra is None:
        why = f"{caption!r} names words it does not measure"
    else:
        why = (f"it names {len(extra)} content words {caption!r} does not ({', '.join(sorted(extra))}), more than "
               f"the {MAX_EXTRA_WORDS} a refinement may leave out")
    return (f"the {kind} {t.id} measured {t.caption!r}: {caption!r} is neither that caption nor a refinement of it "
            f"({why}); cite a {kind} measurement of this caption")


def run(args: Args, ctx: ToolContext) -> Result:
    inv = investigation(ctx)
    d = inv.test(args.discovery_test)
    c = inv.test(args.confirmation_test)
    alpha = inv.alpha
    if d.purpose != "discovery" or d.kind != "rate":
        raise ToolError(f"{d.id} is not a discovery measurement of a caption (measure_rate without confirm, "
                        "mode sample)")
    if not refines(args.caption, d.caption):
        raise ToolError(_not_refined("discovery", d, args.caption))
    if d.k1 * d.n0 <= d.k0 * d.n1:
        raise ToolError(f"not recorded: discovery {d.id} shows no increase ({d.k1}/{d.n1} vs baseline {d.k0}/{d.n0})")
    if c.purpose != "confirmation" or c.kind != "rate":
        raise ToolError(f"{c.id} is not a confirmation measurement; measure the caption with "
                        "measure_rate(confirm=true, mode='sample')")
    if normalise_caption(c.caption) != normalise_caption(args.caption):
        raise ToolError(f"the confirmation {c.id} measured {c.caption!r}, not {args.caption!r}")
    if c.adjusted_p > alpha or c.k1 * c.n0 <= c.k0 * c.n1:
        raise ToolError(f"not recorded: confirmation {c.id} is not significant (adjusted p = {c.adjusted_p:.3g} "
                        f"over the {inv.max_confirmations} declared confirmation attempts, {c.k1}/{c.n1} vs baseline "
                        f"{c.k0}/{c.n0}); the effect did not replicate on fresh seeds")
    cf = inv.test(args.counterfactual_test) if args.counterfactual_test else None
    if cf is not None and (cf.kind != "counterfactual" or not refines(args.caption, cf.caption)):
        raise ToolError(f"{cf.id} is not a counterfactual measurement of {args.caption!r}")
    same = [i for i, f in enumerate(inv.findings) if normalise_caption(f.caption) == normalise_caption(args.caption)]
    if same:
        # A finding is recorded as soon as it is confirmed; its counterfactual may follow. Adding it is the one
        # change a recorded finding takes: the same evidence, one counterfactual more, under the same id.
        i = same[0]
        old = inv.findings[i]
        if (cf is None or old.counterfactual is not None or old.discovery.test_id != d.id
                or old.confirmation.test_id != c.id):
            raise ToolError(f"finding {old.finding_id} is already recorded with this caption ({args.caption!r}); "
                            "calling record_finding again only adds a counterfactual to a finding without one, "
                            "citing the same discovery and confirmation tests")
        result = old.model_copy(update={"counterfactual": evidence(cf), "summary": args.summary or old.summary})
        inv.findings[i] = result
    else:
        first = next(t for t in inv.tests if t.purpose == "confirmation" and t.kind == "rate"
                     and normalise_caption(t.caption) == normalise_caption(args.caption) and t.adjusted_p <= alpha
                     and t.k1 * t.n0 > t.k0 * t.n1)
        if first.id != c.id:
            # The best of several supported confirmations would overstate the effect: the first one stands.
            raise ToolError(f"{args.caption!r} was first confirmed by {first.id}: a finding cites its caption's "
                            f"first supported confirmation, not a later one ({c.id})")
        result = Result(
            finding_id=f"f{len(inv.findings) + 1}", caption=args.caption, summary=args.summary, confirmed=True,
            discovery=evidence(d), confirmation=evidence(c), counterfactual=evidence(cf) if cf else None,
        )
        inv.findings.append(result)
    if ctx.on_finding is not None:
        ctx.on_finding(result)
    return result
