"""The findings table: confirmed findings first, then the other supported hypotheses; the rest are counted."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from sleuth.tools import stats
from sleuth.tools.investigation import Investigation, normalise_caption


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
