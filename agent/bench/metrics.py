"""The discovery benchmark's numbers, computed from plain records (no models, no worlds): pure and fast to test.

A planted bug is *found* by a run when one of its confirmed findings names the bug and the oracle measures the
finding real; a finding is *real* when the oracle's 95% interval for its failure-rate ratio over the class baseline
lies wholly above ``REAL_RATIO`` (1.2): a significant but negligible increase does not count. *Images until first
confirmation* is how many images the run had generated when it recorded the finding (the sum of ``images_used``
over the transcript's ``tool_returned`` events up to the ``finding`` event); the recall-versus-budget curve counts a
bug at budget B when that number is at most B.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sleuth.tools import stats

REAL_RATIO = 1.2
"""A finding is real when the oracle's 95% interval for its rate ratio excludes this (lies above it)."""
BANDS: tuple[float, ...] = (2.0, 5.0, 10.0, 20.0)
"""Edges of the strength bands (the oracle's failure-rate ratio of a planted bug's caption over its class)."""
CURVE_BUDGETS: tuple[int, ...] = (2_000, 3_000, 5_000, 10_000, 20_000)
STRONG = 10.0
"""Bugs the oracle measures at this ratio or more are *strong*: how soon they are confirmed is reported apart."""


def is_real(ratio_low: float | None, threshold: float = REAL_RATIO) -> bool:
    """The stricter oracle rule: the lower end of the oracle's ratio interval is above ``threshold``."""
    return ratio_low is not None and math.isfinite(ratio_low) and ratio_low > threshold


def rate_with_ci(k: int, n: int) -> dict[str, Any]:
    """k/n with its Wilson 95% interval (rate and interval null when n = 0)."""
    if n == 0:
        return {"k": 0, "n": 0, "rate": None, "ci": None}
    r = stats.binomial_rate(k, n, method="wilson")
    return {"k": k, "n": n, "rate": r.rate, "ci": [r.low, r.high]}


def band_of(ratio: float | None, edges: Sequence[float] = BANDS) -> str:
    """The strength band of a ratio: '<2x', '2-5x', '5-10x', '10-20x', '>=20x' (for the default edges)."""
    if ratio is None or math.isnan(ratio):
        return "unmeasured"
    if ratio < edges[0]:
        return f"<{edges[0]:g}x"
    for lo, hi in zip(edges, edges[1:]):
        if ratio < hi:
            return f"{lo:g}-{hi:g}x"
    return f">={edges[-1]:g}x"


def band_order(edges: Sequence[float] = BANDS) -> list[str]:
    return [f"<{edges[0]:g}x", *(f"{lo:g}-{hi:g}x" for lo, hi in zip(edges, edges[1:])), f">={edges[-1]:g}x",
            "unmeasured"]


def quantiles(values: Sequence[float]) -> dict[str, float | None]:
    """Median and 90th percentile (linear interpolation); null for no values."""
    if not values:
        return {"median": None, "p90": None, "n": 0}
    a = np.asarray(values, dtype=float)
    return {"median": float(np.median(a)), "p90": float(np.percentile(a, 90)), "n": len(values)}


@dataclass(frozen=True)
class BugOutcome:
    """One planted bug in one run: its measured strength and when (if ever) the run confirmed it."""

    bug: str
    ratio: float | None
    found: bool
    images_until: int | None
    """Images generated when the first confirmed, real finding naming it was recorded; None when not found."""


def recall_by_band(outcomes: Sequence[BugOutcome], edges: Sequence[float] = BANDS) -> dict[str, dict[str, Any]]:
    """Recall (Wilson interval) of the bugs in each strength band that has any."""
    out: dict[str, dict[str, Any]] = {}
    for band in band_order(edges):
        these = [o for o in outcomes if band_of(o.ratio, edges) == band]
        if these:
            out[band] = rate_with_ci(sum(o.found for o in these), len(these))
    return out


def recall_curve(outcomes: Sequence[BugOutcome], run_budget: int,
                 budgets: Sequence[int] = CURVE_BUDGETS) -> list[dict[str, Any]]:
    """Recall at each budget B (bugs confirmed by the time B images were used); a B above the runs' own budget is
    not measured (a run with more images would have planned differently), so its recall is null."""
    out = []
    for b in budgets:
        if b > run_budget:
            out.append({"budget": b, "measured": False, "k": None, "n": len(outcomes), "rate": None, "ci": None})
            continue
        k = sum(1 for o in outcomes if o.found and o.images_until is not None and o.images_until <= b)
        out.append({"budget": b, "measured": True, **rate_with_ci(k, len(outcomes))})
    return out


def planner_summary(runs: Sequence[dict[str, Any]], outcomes: Sequence[BugOutcome], run_budget: int,
                    edges: Sequence[float] = BANDS, budgets: Sequence[int] = CURVE_BUDGETS) -> dict[str, Any]:
    """One planner's numbers over its runs (dicts with images, seconds, bug_free and judged findings)."""
    confirmed = [f for r in runs for f in r["findings"]]
    false = [f for f in confirmed if not f["oracle"]["real"]]
    free = [r for r in runs if r.get("bug_free")]
    free_confirmed = [f for r in free for f in r["findings"]]
    found = [o for o in outcomes if o.found]
    # A random world's planting can fail to bias its classifier (the oracle then measures the bug near 1x): recall
    # over the bugs the oracle measures at the lowest band edge or more is the recall of bugs there were to find.
    there = [o for o in outcomes if o.ratio is not None and o.ratio >= edges[0]]
    return {
        "recall": rate_with_ci(len(found), len(outcomes)),
        "recall_measurable": {**rate_with_ci(sum(o.found for o in there), len(there)), "min_ratio": edges[0]},
        "bugs_found": len(found), "bugs_planted": len(outcomes),
        "recall_by_strength": recall_by_band(outcomes, edges),
        "false_findings": rate_with_ci(len(false), len(confirmed)),
        "confirmed_findings": len(confirmed), "false_confirmed": len(false),
        "bug_free_classes": {"runs": len(free), "confirmed": len(free_confirmed),
                             "false": sum(1 for f in free_confirmed if not f["oracle"]["real"]),
                             "runs_with_false": rate_with_ci(
                                 sum(1 for r in free if any(not f["oracle"]["real"] for f in r["findings"])),
                                 len(free))},
        "runs": len(runs),
        "images_per_class": quantiles([r["images"] for r in runs]),
        "seconds_per_class": quantiles([r["seconds"] for r in runs]),
        "images_until_confirmed": quantiles([o.images_until for o in found if o.images_until is not None]),
        "images_until_confirmed_strong": {
            **quantiles([o.images_until for o in found if o.images_until is not None and (o.ratio or 0) >= STRONG]),
            "min_ratio": STRONG, "planted": sum(1 for o in outcomes if (o.ratio or 0) >= STRONG)},
        "recall_vs_budget": recall_curve(outcomes, run_budget, budgets),
        "images": sum(r["images"] for r in runs), "seconds": round(sum(r["seconds"] for r in runs), 1),
    }
