"""The findings table: every hypothesis tested, with its evidence, confirmed findings first."""

from __future__ import annotations

from rich.table import Table

from tools import stats
from tools.investigation import Investigation, normalise_caption


def _rate(k: int, n: int) -> str:
    r = stats.binomial_rate(k, n)
    return f"{k}/{n} [{100 * r.low:.1f}–{100 * r.high:.1f}%]"


def findings_table(inv: Investigation) -> Table:
    confirmed = {normalise_caption(f["caption"]) for f in inv.findings}
    table = Table(title=f"Hypotheses for {inv.label!r} ({inv.adjust_method}-adjusted over "
                        f"{sum(t.purpose == 'discovery' for t in inv.tests)} discovery tests)")
    for col in ("caption", "baseline k/n", "hypothesis k/n", "rate ratio [95% CI]", "adj. p", "verdict",
                "confirmed"):
        table.add_column(col, overflow="fold")
    tests = [t for t in inv.tests if t.purpose == "discovery"]
    tests.sort(key=lambda t: (normalise_caption(t.caption) not in confirmed, t.adjusted_p))
    for t in tests:
        rr = stats.rate_ratio(t.k1, t.n1, t.k0, t.n0)
        kind = " (counterfactual)" if t.kind == "counterfactual" else ""
        table.add_row(
            t.caption + kind, _rate(t.k0, t.n0), _rate(t.k1, t.n1),
            f"{rr.ratio:.3g} [{rr.low:.3g}, {rr.high:.3g}]", f"{t.adjusted_p:.2g}", t.verdict,
            "yes" if normalise_caption(t.caption) in confirmed and t.kind == "rate" else "",
        )
    return table
