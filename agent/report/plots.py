"""The report's plots as PNG bytes: a forest plot of rate ratios and baseline-vs-hypothesis confusion bars.

Figures are drawn on matplotlib's Agg canvas directly (no pyplot): no global figure state, no display needed, and
the same data always give the same bytes (no timestamp in the PNG).
"""

from __future__ import annotations

import io
import math
import textwrap

from pydantic import BaseModel

from sleuth.agent.report.data import HypothesisTest
from sleuth.tools import stats
from sleuth.tools.common import SampleSummary
from sleuth.tools.investigation import normalise_caption

VERDICT_COLOURS = {"supported": "#c0392b", "inconclusive": "#e08e0b", "not supported": "#7f8c8d"}
CONFIRM_COLOUR = "#1f4e79"
COUNTERFACTUAL_COLOUR = "#7d3c98"
MAX_FOREST_ROWS = 60


def plain(text: str) -> str:
    """Text matplotlib draws as written: a '$' would otherwise start mathtext (and can fail to parse)."""
    return text.replace("\\", "\\\\").replace("$", r"\$")


def _word(w: str) -> str:
    return w.lower().strip(".,;:!?'\"")


def short_caption(caption: str, class_prompt: str | None, width: int = 58) -> str:
    """The words of ``caption`` that differ from the class prompt, within ``width`` characters.

    The class prompt's words are elided but its last (the class name, for context): "a realistic photograph of a fly
    in a swamp" reads "…fly in a swamp", "… . it is in the snow." reads "…cat. it is in the snow.". A caption still
    too long keeps its first and last words, eliding the middle: the differing words usually come last.
    """
    words = caption.split()
    if class_prompt:
        prompt = class_prompt.split()
        n = 0
        while n < min(len(words), len(prompt)) and _word(words[n]) == _word(prompt[n]):
            n += 1
        if n >= 2 and n < len(words):
            words = ["…" + words[n - 1], *words[n:]]
    text = " ".join(words)
    if len(text) <= width:
        return text
    head: list[str] = []
    tail: list[str] = []
    room = width - 2  # " …" between the halves
    for i in range(len(words)):
        w = words[-1 - i // 2] if i % 2 == 0 else words[i // 2]
        if len(" ".join([*head, *tail])) + len(w) + 1 > room:
            break
        (tail.insert(0, w) if i % 2 == 0 else head.append(w))
    return " ".join([*head, "…", *tail]) if head else "… " + " ".join(tail)


def _png(fig: object) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})  # type: ignore[attr-defined]
    return buf.getvalue()


def _figure(width: float, height: float) -> object:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


class ForestRow(BaseModel):
    label: str
    discovery: HypothesisTest
    confirmation: HypothesisTest | None = None
    counterfactual: HypothesisTest | None = None
    finding_id: str | None = None


def forest_rows(tests: list[HypothesisTest], class_prompt: str | None) -> list[ForestRow]:
    """One row per caption tested on discovery seeds, with its confirmation and counterfactual estimates."""
    rows: dict[str, ForestRow] = {}
    for t in tests:
        if t.purpose == "discovery" and t.mode == "sample":
            key = normalise_caption(t.caption)
            if key not in rows:
                rows[key] = ForestRow(label=short_caption(t.caption, class_prompt), discovery=t,
                                      finding_id=t.finding_id)
    for t in tests:
        row = rows.get(normalise_caption(t.caption))
        if row is None:
            continue
        if t.mode == "counterfactual":
            row.counterfactual = t
        elif t.purpose == "confirmation":
            row.confirmation = t

    def effect(r: ForestRow) -> float:
        """How surely the effect is large: the lower bound of the confirmation's ratio interval (of discovery's
        when there is no confirmation), so a ratio that is infinite only for want of baseline failures does not
        rank first."""
        rr = (r.confirmation or r.discovery).rate_ratio
        return rr.low if rr is not None and not math.isnan(rr.low) else 0.0

    return sorted(rows.values(), key=lambda r: (r.finding_id is None, -effect(r)))


def forest_plot(tests: list[HypothesisTest], class_prompt: str | None, title: str = "") -> bytes | None:
    """Rate ratios (hypothesis / baseline) with 95% intervals on a log axis, one row per caption; None if no test."""
    rows = forest_rows(tests, class_prompt)[:MAX_FOREST_ROWS]
    if not rows:
        return None

    def ratio(t: HypothesisTest | None, kind: str) -> stats.RatioCI | None:
        """The interval drawn: a confirmation's effect corrected for selection where it has one (the tables'
        number), else the test's rate ratio."""
        if t is None:
            return None
        if kind == "confirmation" and t.effect is not None:
            if t.bound is None:
                return t.effect
            shown = stats.given_selection(t.effect, t.bound)  # clipped at the bound; its point the bound if no estimate
            return shown if shown.ratio == shown.ratio else shown.model_copy(update={"ratio": shown.low})
        return t.rate_ratio

    values = [v for r in rows for kind, t in (("discovery", r.discovery), ("confirmation", r.confirmation),
                                              ("counterfactual", r.counterfactual))
              if (rr := ratio(t, kind)) is not None for v in (rr.low, rr.ratio, rr.high) if 0 < v < math.inf]
    lo = min([*values, 0.5]) / 1.6
    hi = max([*values, 2.0]) * 1.6
    legend_h = 0.45  # inches kept free below the axes for the legend, so it never hides a row
    height = 1.3 + legend_h + 0.3 * len(rows)
    fig = _figure(9.5, height)
    ax = fig.add_subplot(1, 1, 1)  # type: ignore[attr-defined]
    ax.set_xscale("log")
    ax.axvline(1.0, color="#555555", lw=0.8, ls="--")
    offsets = {"discovery": 0.0, "confirmation": -0.22, "counterfactual": 0.22}
    for i, r in enumerate(rows):
        y = len(rows) - 1 - i
        for kind, t in (("discovery", r.discovery), ("confirmation", r.confirmation),
                        ("counterfactual", r.counterfactual)):
            rr = ratio(t, kind)
            if t is None or rr is None or math.isnan(rr.ratio):
                continue
            colour = {"discovery": VERDICT_COLOURS.get(t.verdict, "#333333"), "confirmation": CONFIRM_COLOUR,
                      "counterfactual": COUNTERFACTUAL_COLOUR}[kind]
            marker = {"discovery": "o", "confirmation": "D", "counterfactual": "s"}[kind]
            point = min(max(rr.ratio, lo), hi)
            # Infinite or zero ratios (a zero count) sit at the axis edge with an arrow pointing off it.
            if rr.ratio >= hi:
                marker = ">"
            elif rr.ratio <= lo:
                marker = "<"
            ax.plot([min(max(rr.low, lo), hi), min(max(rr.high, lo), hi)], [y + offsets[kind]] * 2, color=colour,
                    lw=1.6, solid_capstyle="butt")
            ax.plot([point], [y + offsets[kind]], marker=marker, color=colour, ms=6 if kind == "discovery" else 5,
                    ls="none")
            if kind == "confirmation" and t.bound is not None:  # the headline bound: a bar across the interval's end
                ax.plot([min(max(t.bound, lo), hi)], [y + offsets[kind]], marker="|", color=colour, ms=11, mew=2,
                        ls="none")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([plain(f"{r.label}  [{r.finding_id}]" if r.finding_id else r.label)
                        for r in reversed(rows)], fontsize=8)
    for tick, r in zip(ax.get_yticklabels(), list(reversed(rows))):
        if r.finding_id:
            tick.set_fontweight("bold")
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("failure rate ratio, hypothesis / baseline (95% CI, log scale)")
    ax.grid(axis="x", which="major", color="#dddddd", lw=0.6)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=c, marker="o", ls="-", label=f"discovery: {v}") for v, c in VERDICT_COLOURS.items()]
    handles += [Line2D([], [], color=CONFIRM_COLOUR, marker="D", ls="-",
                       label="confirmation (fresh seeds, given selection; |: fails at least)"),
                Line2D([], [], color=COUNTERFACTUAL_COLOUR, marker="s", ls="-", label="counterfactual edits")]
    fig.legend(handles=handles, fontsize=7, loc="lower center", ncol=5, frameon=False)  # type: ignore[attr-defined]
    if title:
        ax.set_title(plain(title), fontsize=10)
    fig.tight_layout(rect=(0, legend_h / height, 1, 1))  # type: ignore[attr-defined]
    return _png(fig)


class ConfusionPanel(BaseModel):
    title: str
    label: str
    baseline: SampleSummary | None
    hypothesis: SampleSummary


def _shares(s: SampleSummary | None, label: str, categories: list[str]) -> list[float]:
    if s is None or s.failures.n == 0:
        return [0.0] * len(categories)
    counts = {c.label: c.count for c in s.confusions}
    n = s.failures.n
    return [(n - s.failures.k) / n if c == label else counts.get(c, 0) / n for c in categories]


def confusion_bars(panels: list[ConfusionPanel], max_labels: int = 6) -> bytes | None:
    """Per hypothesis, the share of images given each top-1 label: class prompt (baseline) vs the hypothesis.

    The first bar is the share that did not fail; the others are the most frequent wrong labels. None if no panel.
    """
    if not panels:
        return None
    cols = min(3, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig = _figure(4.4 * cols, 0.6 + 2.9 * nrows)
    for i, p in enumerate(panels):
        ax = fig.add_subplot(nrows, cols, i + 1)  # type: ignore[attr-defined]
        wrong: list[str] = []
        for s in (p.hypothesis, p.baseline):
            for c in (s.confusions if s else []):
                if c.label not in wrong and c.label != p.label:
                    wrong.append(c.label)
        categories = [p.label, *wrong[: max_labels - 1]]
        hyp = _shares(p.hypothesis, p.label, categories)
        base = _shares(p.baseline, p.label, categories)
        ys = list(range(len(categories)))[::-1]
        h = 0.38
        if p.baseline is not None:
            ax.barh([y + h / 2 for y in ys], [100 * v for v in base], height=h, color="#95a5a6",
                    label=f"class prompt ({p.baseline.failures.n} images)")
        ax.barh([y - h / 2 for y in ys], [100 * v for v in hyp], height=h, color="#c0392b",
                label=f"hypothesis ({p.hypothesis.failures.n} images)")
        ax.set_yticks(ys)
        ax.set_yticklabels([plain(f"{c} (no failure)" if c == p.label else c) for c in categories], fontsize=8)
        ax.set_xlim(0, 100)
        ax.set_xlabel("% of images (top-1 label)", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(plain("\n".join(textwrap.wrap(p.title, width=52)[:2])), fontsize=8)
        ax.legend(fontsize=6.5, loc="lower right")
    fig.tight_layout()  # type: ignore[attr-defined]
    return _png(fig)
