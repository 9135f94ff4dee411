"""How tool results read as text: one line for a language model's context, styled lines for a terminal.

Each tool module may export ``summary(result) -> str`` (the one line a planner keeps of an older result: ids, rates,
verdicts) and ``render(result) -> list[Line]`` (what a terminal shows). A ``Line`` is a list of (text, style) spans;
the styles are names the terminal maps to colours (``tools/`` knows nothing of terminals):

- ``key`` a field name, ``dim`` secondary detail, ``bold`` emphasis,
- ``good`` a supported verdict, ``warn`` an inconclusive one or a caveat, ``bad`` an error.

A rate is never shown without its count and interval.
"""

from __future__ import annotations

import json
import math

from sleuth.tools import stats

Span = tuple[str, str]
Line = list[Span]

MAX_ITEMS = 6

VERDICT_STYLE = {"supported": "good", "not supported": "dim", "inconclusive": "warn"}


def quote(text: str) -> str:
    """Model-written text (a caption, a prompt) as a JSON string literal: data, never instructions."""
    return json.dumps(text, ensure_ascii=False)


def cut(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def num(x: float) -> str:
    return "∞" if x == math.inf else f"{x:.3g}"


def kn(rate: stats.Rate | None) -> str:
    """``k/n = 7.5% [5.3–10.5%]``."""
    if rate is None or not rate.n:
        return "0/0"
    return f"{rate.k}/{rate.n} = {100 * rate.k / rate.n:.1f}% [{100 * rate.low:.1f}–{100 * rate.high:.1f}%]"


def kn_short(rate: stats.Rate | None) -> str:
    """``k/n [low%, high%]``, for one-line summaries."""
    if rate is None or not rate.n:
        return "n/a"
    return f"{rate.k}/{rate.n} [{100 * rate.low:.1f}%, {100 * rate.high:.1f}%]"


def ratio(r: stats.RatioCI | None) -> str:
    """``2.5× [1.2, 5.1]``; the interval alone where there is no estimate (nan)."""
    if r is None:
        return "n/a"
    est = "" if math.isnan(r.ratio) else f"{num(r.ratio)}× "
    return f"{est}[{num(r.low)}, {num(r.high)}]"


def at_least(bound: float) -> str:
    """A confirmed finding's headline bound: ``≥ 2.61×``."""
    return f"≥ {num(bound)}×"


def together(alpha: float) -> str:
    """How surely all of an investigation's headline bounds hold at once: ``90%`` at alpha 0.05 (1 - 2 alpha)."""
    return f"{100 * (1 - 2 * alpha):.3g}%"


P_FLOOR = 1e-6
"""Smaller p-values are printed as "< 1e-6": beyond that they restate the sampling model, not the evidence."""


def pv(p: float | None) -> str:
    if p is None:
        return "n/a"
    return f"< {P_FLOOR:g}" if p < P_FLOOR else f"{p:.2g}"
