"""The findings table: confirmed findings first, then the other supported hypotheses; the rest are counted."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from sleuth.tools import stats
from sleuth.tools.investigation import Investigation, normalise_caption

if TYPE_CHECKING:
    from sleuth.agent.mitigate import MitigationResult


def _rate(k: int, n: int) -> str:
    r = stats.binomial_rate(k, n)
    return f"{k}/{n} [{100 * r.low:.1f}–{100 * r.high:.1f}%]"


def _short(caption: str, class_prompt: str) -> str:
    """The caption with the class prompt elided: the words that make the hypothesis stand out."""
    if caption.lower().startswith(class_prompt.lower()):
        rest = caption[len(class_prompt):].lstrip(". ").strip()
        return f"… {rest}" if rest else caption
    return caption


def _baseline(inv: Investigation) -> tuple[int, int]:
    b = inv.baselines.get("discovery")
    return (b.k, b.n) if b is not None else (0, 0)


def findings_table(inv: Investigation, *, show_all: bool = False) -> RenderableType:
    findings = {normalise_caption(f.caption): f for f in inv.findings}
    tests = [t for t in inv.tests if t.purpose == "discovery"]
    shown = [t for t in tests if show_all or t.verdict == "supported" or normalise_caption(t.caption) in findings]
    shown.sort(key=lambda t: (normalise_caption(t.caption) not in findings, t.kind != "rate", t.adjusted_p))
    table = Table(title=f"{inv.label}: baseline {_rate(*_baseline(inv))} — {len(inv.findings)} confirmed finding(s); "
                        f"p {inv.adjust_method}-adjusted over {len(tests)} hypotheses",
                  title_justify="left")
    table.add_column("hypothesis", ratio=3, overflow="fold")
    for col in ("failures k/n [95% CI]", "rate ratio [95% CI]", "adj. p", "confirmation k/n"):
        table.add_column(col)
    for t in shown:
        rr = stats.rate_ratio(t.k1, t.n1, t.k0, t.n0)
        kind = " (counterfactual edits)" if t.kind == "counterfactual" else ""
        f = findings.get(normalise_caption(t.caption)) if t.kind == "rate" else None
        conf = ""
        if f is not None:
            c = f.confirmation.hypothesis
            conf = f"{c.k}/{c.n} ✓"
        table.add_row(_short(t.caption, inv.class_prompt) + kind, _rate(t.k1, t.n1),
                      f"{rr.ratio:.3g}× [{rr.low:.3g}, {rr.high:.3g}]", f"{t.adjusted_p:.2g}", conf,
                      style="bold" if f is not None else None)
    rest = len(tests) - len(shown)
    if rest and not show_all:
        return Group(table, Text(f"{rest} other hypotheses were not supported (see the transcript).", style="dim"))
    return table


def _p(p: float | None) -> str:
    if p is None:
        return "–"
    return "< 1e-6" if p < 1e-6 else f"{p:.2g}"


def mitigation_tables(result: MitigationResult) -> list[RenderableType]:
    """A mitigation's findings (before and after on the same fresh images), class baselines and accuracy."""
    table = Table(title=f"mitigation of {result.classifier_before}: "
                        f"{'effective' if result.effective else 'not shown effective'}", title_justify="left")
    table.add_column("finding", ratio=3, overflow="fold")
    for col in ("before k/n [95% CI]", "after k/n [95% CI]", "after/before [95% CI]", "adj. p better",
                "adj. p worse", "verdict"):
        table.add_column(col, justify="right" if "p " in col else "left")
    for o in result.findings:
        r = o.rates
        name = f"{o.label}:{o.finding_id}{'' if o.mitigated_here else ' (not trained on)'} {o.caption}"
        table.add_row(name, _rate(r.before.k, r.before.n), _rate(r.after.k, r.after.n),
                      f"{r.ratio.ratio:.2f} [{r.ratio.low:.2f}–{r.ratio.high:.2f}]", _p(r.adjusted_p_better),
                      _p(r.adjusted_p_worse), o.verdict)
    table.add_section()
    for b in result.baselines:
        table.add_row(f"{b.label}: class baseline", _rate(b.before.k, b.before.n), _rate(b.after.k, b.after.n),
                      f"{b.ratio.ratio:.2f} [{b.ratio.low:.2f}–{b.ratio.high:.2f}]", "", _p(b.adjusted_p_worse),
                      "worse" if (b.adjusted_p_worse or 1.0) < result.config.get("alpha", 0.05) else "")
    acc = result.accuracy.test
    ci = acc.interval
    text = Text(f"top-1 accuracy over {result.accuracy.classes} classes ({result.accuracy.n_per_class} fresh images "
                f"each): {100 * ci.before.rate:.2f}% → {100 * ci.after.rate:.2f}%, difference "
                f"{100 * ci.difference:+.2f} points, one-sided {100 * (1 - acc.alpha):.0f}% lower bound "
                f"{100 * ci.low:+.2f}: non-inferiority at −{100 * acc.margin:.1f} point(s) "
                f"{'shown' if acc.shown else 'NOT shown'}")
    return [table, text]
