"""The top of a run's report: one row per confirmed finding (caption, ratio bar with its interval, counterfactual
verdict, three example images), and the conclusion broken into its parts.

Every string from a run goes through ``esc`` (captions are model-written).
"""

from __future__ import annotations

import html
import math
import re

from sleuth.agent.report.data import HypothesisTest, ImageGroup, PairSet, RunReport
from sleuth.agent.report.images import ImageEmbedder
from sleuth.agent.report.plots import short_caption
from sleuth.tools import stats
from sleuth.tools.investigation import normalise_caption
from sleuth.tools.record_finding import Result as FindingResult
from sleuth.tools.record_finding import refines

EXAMPLES = 3
THUMB = 64
CSS = """
.summary{width:100%}.summary td{vertical-align:middle}.summary .cap{min-width:180px}
.rbar{position:relative;width:220px;height:12px;background:#f1f1f1;border:1px solid #ddd;margin:2px 0}
.rbar .ci{position:absolute;top:0;bottom:0;background:#f0a898}.rbar .pt{position:absolute;top:-2px;bottom:-2px;
width:3px;background:#b03020}.rbar .one{position:absolute;top:-3px;bottom:-3px;width:1px;background:#555}
.examples{display:flex;gap:3px}
ul.conclusion{margin:4px 0 10px;padding-left:20px}ul.conclusion ul{padding-left:18px}
@media (max-width:900px){.summary thead{display:none}.summary tr{display:grid;grid-template-columns:44px minmax(0,1fr);
border-bottom:1px solid #ddd;padding:4px 0}.summary td{border:none;padding:2px 4px}.summary td:nth-child(n+3){
grid-column:2}.summary td:nth-child(4)::before{content:"counterfactual edits: ";color:#666}
.summary td:nth-child(3)::before{content:"fails at least (≥), given selection [95% CI]: ";display:block;color:#666;
font-size:12px}}
"""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _num(x: float) -> str:
    return "∞" if x == math.inf else ("nan" if math.isnan(x) else f"{x:.3g}")


def ratio_text(r: stats.RatioCI) -> str:
    est = "" if math.isnan(r.ratio) else f"{_num(r.ratio)}× "
    return f"{est}[{_num(r.low)}, {_num(r.high)}]"


def ratio_bar(r: stats.RatioCI, top: float) -> str:
    """The ratio (dark tick) and its interval (shaded) on a log scale from 1/2 to ``top``; a thin line marks 1×."""
    lo_end, hi_end = math.log(0.5), math.log(max(top, 2.0))

    def pos(x: float) -> float:
        if not x > 0:
            return 0.0
        return 100 * min(1.0, max(0.0, (math.log(x) - lo_end) / (hi_end - lo_end))) if math.isfinite(x) else 100.0
    low, high, mid = pos(r.low), pos(r.high), pos(r.ratio)
    tick = "" if math.isnan(r.ratio) else f"<span class='pt' style='left:calc({mid:.1f}% - 1.5px)'></span>"
    return (f"<div class='rbar' title='{esc(ratio_text(r))}'><span class='ci' style='left:{low:.1f}%;"
            f"width:{max(high - low, 0.5):.1f}%'></span><span class='one' style='left:{pos(1.0):.1f}%'></span>"
            f"{tick}</div>")


def effect(f: FindingResult) -> stats.RatioCI:
    """A finding's effect: its confirmation's, corrected for selection where the confirmation gives it (given
    selection: clipped below at its headline bound, where the transcript has one)."""
    c = f.confirmation
    if c.bound is not None and c.effect is not None:
        return stats.given_selection(c.effect, c.bound)
    return c.effect or c.rate_ratio


def headline(f: FindingResult) -> str:
    """A finding's one number, ``≥ 2.61×`` (its confirmation's bound), then its effect given selection; the effect
    alone where the transcript has no bound."""
    b = f.confirmation.bound
    return ratio_text(effect(f)) if b is None else f"≥ {_num(b)}× (given selection {ratio_text(effect(f))})"


def _rank(f: FindingResult) -> float:
    b = f.confirmation.bound
    return b if b is not None else effect(f).low


def counterfactual_verdict(f: FindingResult, tests: dict[str, HypothesisTest]) -> str:
    cf = f.counterfactual
    if cf is None:
        return "not tested"
    t = tests.get(cf.test_id)
    verdict = t.verdict if t is not None else ("supported" if cf.adjusted_p < 0.05 else "not supported")
    p = "< 1e-06" if cf.adjusted_p < 1e-6 else f"{cf.adjusted_p:.2g}"
    return f"{verdict} (adj. p {p})"


def finding_groups(run: RunReport, f: FindingResult) -> list[ImageGroup]:
    """The image groups of a finding: samples of its caption, then of captions it narrows (its screened phrasing)."""
    own = [g for g in run.groups if g.prompt and normalise_caption(g.prompt) == normalise_caption(f.caption)]
    return own + [g for g in run.groups if g.prompt and g not in own and refines(f.caption, g.prompt)]


def examples(run: RunReport, f: FindingResult) -> list[str]:
    """Refs of up to ``EXAMPLES`` failure images of the finding's caption: its own samples first, then edited images
    that failed in its counterfactual pairs."""
    key = normalise_caption(f.caption)
    refs = [r for g in finding_groups(run, f) if g.failures for r in g.refs]
    pairs: list[PairSet] = [p for p in run.pairs if normalise_caption(p.after_caption) == key]
    refs += [x.edited for p in pairs for x in p.flips if x.failed_after]
    return list(dict.fromkeys(refs))[:EXAMPLES]


def _img(emb: ImageEmbedder, ref: str) -> str:
    found = emb.get(ref)
    if found is None:
        return ""
    scale = THUMB / max(found.width, found.height)
    w, h = max(1, round(found.width * scale)), max(1, round(found.height * scale))
    return f'<img class="thumb" src="{found.uri}" width="{w}" height="{h}" alt="{esc(ref[:12])}">'


def summary_block(run: RunReport, emb: ImageEmbedder, rid: str) -> str:
    """One row per confirmed finding, strongest lower bound first."""
    confirmed = sorted((f for f in run.findings if f.confirmed), key=lambda f: -_rank(f))
    if not confirmed:
        return "<p class='muted'>No finding was confirmed in this run.</p>"
    tests = {t.test_id: t for t in run.tests}
    finite = [x for f in confirmed for x in (effect(f).high, effect(f).ratio) if math.isfinite(x)]
    top = min(200.0, max([2.0, *finite]))
    rows = []
    for f in confirmed:
        r = effect(f)
        c = f.confirmation
        rows.append(
            f"<tr data-finding='{esc(f.finding_id)}'><td>{esc(f.finding_id)}</td>"
            f"<td class='cap' title='{esc(f.caption)}'>{esc(short_caption(f.caption, run.class_prompt, 90))}</td>"
            f"<td>{ratio_bar(r, top)}<span class='small'>{esc(headline(f))}; {c.hypothesis.k}/{c.hypothesis.n} "
            f"vs {c.baseline.k}/{c.baseline.n}</span></td><td class='small'>{esc(counterfactual_verdict(f, tests))}"
            f"</td><td><div class='examples'>{''.join(_img(emb, x) for x in examples(run, f))}</div></td></tr>")
    return (f"<div class='scroll'><table class='summary' id='{rid}-summary'><thead><tr><th>id</th>"
            "<th class='cap'>confirmed finding</th><th>fails at least (≥), and its failure-rate ratio to the class "
            "given selection [95% CI], confirmation on fresh seeds</th><th>counterfactual edits</th>"
            "<th>examples</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>"
            "<p class='small muted'>≥: the caption fails at least this many times as often as the class, the least "
            "ratio its confirmation's own exact test still rejects (all of a run's bounds hold together with "
            "probability 1 − 2α). Bars: log scale; the shaded span is the 95% interval given selection (clipped below "
            "at the bound), the dark tick the estimate (none where the correction gives none to trust), the thin "
            "line 1× (no effect). Counterfactual "
            "edits: exact McNemar test of edited images against the same images control-edited.</p>")


_SENTENCE = re.compile(r"(?<=[.)\]])\s+(?=[A-Z])")
_HEADED = re.compile(r"^([A-Z][^:'\"]{0,60}):\s+(['\"].+)$", re.S)
"""A sentence that heads a list of quoted captions: "Failing as crab: 'a cat in a river.' 27x; ..."."""
_LEAD = re.compile(r"^([A-Z][^:'\"]{0,60}):\s+(.+)$", re.S)


def conclusion(answer: str) -> str:
    """The final answer in readable parts: plain sentences as paragraphs, and a sentence that heads a list
    ("Failing as crab: 'x' 27x; 'y' 3x.") as a list item with one sub-item per part."""
    parts: list[str] = []
    items: list[str] = []
    plain: list[str] = []

    def flush_plain() -> None:
        if plain:
            parts.append(f"<p>{esc(' '.join(plain))}</p>")
            plain.clear()

    def flush_items() -> None:
        if items:
            parts.append(f"<ul class='conclusion'>{''.join(items)}</ul>")
            items.clear()
    for block in re.split(r"\n\s*\n", answer.strip()):
        for sentence in _SENTENCE.split(" ".join(block.split())):
            lead = _LEAD.match(sentence)
            if lead and _HEADED.match(lead.group(2)):  # "Findings, by label: Failing as crab: 'x' ..."
                flush_items()
                plain.append(lead.group(1) + ":")
                flush_plain()
                sentence = lead.group(2)
            m = _HEADED.match(sentence)
            subs = m.group(2).rstrip(".").split("; ") if m else []
            if m:
                flush_plain()
                inner = "".join(f"<li>{esc(s)}</li>" for s in subs)
                items.append(f"<li><b>{esc(m.group(1))}</b><ul>{inner}</ul></li>")
            else:
                flush_items()
                plain.append(sentence)
                if len(" ".join(plain)) > 300:
                    flush_plain()
        flush_items()
        flush_plain()
    return "<div class='answer'><h3>Conclusion</h3>" + "".join(parts) + "</div>"
