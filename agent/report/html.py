"""One self-contained HTML page from report models: inline CSS, images and plots as data URIs, no script.

Every string that came from a run (captions, labels, reasoning, paths) goes through ``esc``: captions are written by
models and may hold anything, including markup.
"""

from __future__ import annotations

import html
import io
import math
from pathlib import Path
from typing import Any

from PIL import Image

from sleuth.agent.mitigate import MitigationResult
from sleuth.agent.report.data import HypothesisTest, PairSet, RunReport
from sleuth.agent.report.images import ImageEmbedder, png_uri
from sleuth.agent.report.modes import modes_block
from sleuth.agent.report.plots import ConfusionPanel, confusion_bars, forest_plot, short_caption
from sleuth.agent.report.summary import CSS as SUMMARY_CSS
from sleuth.agent.report.summary import conclusion, finding_groups, summary_block
from sleuth.agent.report.tree import TreeNode
from sleuth.tools import stats
from sleuth.tools.findings import Evidence
from sleuth.tools.investigation import normalise_caption
from sleuth.tools.text import pv

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"DejaVu Sans",sans-serif;margin:0 auto;max-width:1240px;padding:16px 24px;
color:#1d1d1f;background:#fff}
h1{font-size:22px;margin:4px 0 12px}h2{font-size:19px;margin:28px 0 8px;border-bottom:2px solid #ddd}
h3{font-size:15px;margin:20px 0 6px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:12.5px}
th,td{border:1px solid #d5d5d5;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f2f2f2}th.cap,td.cap{min-width:240px}td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
tr.yes td{background:#fff4f2}tr.mode td{background:#fff4f2}tr.mode.weak td{background:#fffaf0}
ul.phrasings{margin:2px 0;padding-left:18px}.muted{color:#777}.small{font-size:12px}
.verdict-supported{color:#b03020;font-weight:600}.verdict-inconclusive{color:#a06000}
.verdict-not-supported{color:#666}
figure{margin:8px 0 16px}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:12px;color:#555}
.grid{display:flex;flex-wrap:wrap;gap:4px;margin:4px 0 12px}
.grid img,.pair img{image-rendering:pixelated;border:1px solid #ccc;background:#fafafa}
.pairs{display:flex;flex-wrap:wrap;gap:10px}.pair{border:1px solid #e2e2e2;padding:4px;font-size:11px;width:240px}
.pair .imgs{display:flex;gap:4px}.bad{color:#b03020}.ok{color:#2e7d32}
ul.tree,ul.tree ul{list-style:none;padding-left:18px;margin:2px 0}ul.tree{padding-left:0}
ul.tree li{margin:2px 0}.rel{color:#666;font-size:12px}.badge{display:inline-block;font-size:11px;padding:0 4px;
border-radius:3px;background:#eee;margin-left:4px}.badge.finding{background:#c0392b;color:#fff}
.missing{display:inline-block;width:96px;height:96px;background:#f6e0e0;font-size:11px;text-align:center}
dl.meta{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:2px 12px;font-size:12.5px;margin:6px 0}
dl.meta dt{color:#555}dl.meta dd{margin:0;overflow-wrap:anywhere}nav a{margin-right:12px}
.scroll{overflow-x:auto;max-width:100%}h3,h4,.pair,td.cap,li{overflow-wrap:anywhere}
details.images>summary{cursor:pointer;font-size:12.5px}
@media (max-width:900px){body{padding:8px 10px}th.cap,td.cap{min-width:150px}.summary .cap{min-width:120px}}
details{margin:6px 0}pre.reason{white-space:pre-wrap;font-size:12px;background:#f7f7f7;padding:6px;margin:4px 0}
""" + SUMMARY_CSS

THUMB = 96  # displayed size of the longest side of a grid image, in CSS pixels
PAIR = 104


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def fmt_rate(r: stats.Rate) -> str:
    return f"{r.k}/{r.n} [{100 * r.low:.1f}–{100 * r.high:.1f}%]" if r.n else "0/0"


def fmt_ratio(rr: stats.RatioCI | None) -> str:
    if rr is None:
        return "–"

    def num(x: float) -> str:
        return "∞" if x == math.inf else ("nan" if math.isnan(x) else f"{x:.3g}")
    return f"{num(rr.ratio)} [{num(rr.low)}, {num(rr.high)}]"


def fmt_p(p: float) -> str:
    return pv(p)


def _img(emb: ImageEmbedder, ref: str, side: int, title: str = "") -> str:
    found = emb.get(ref)
    if found is None:
        return f'<span class="missing" title="{esc(ref)}">image missing<br>{esc(ref[:12])}</span>'
    scale = side / max(found.width, found.height)
    w, h = max(1, round(found.width * scale)), max(1, round(found.height * scale))
    # Decoded only when shown: the image lists sit in closed <details>, and a long run has thousands of them.
    return (f'<img class="thumb" src="{found.uri}" width="{w}" height="{h}" alt="{esc(ref[:12])}" '
            f'title="{esc(title or ref)}" data-ref="{esc(ref)}" loading="lazy" decoding="async">')


def _plot(data: bytes | None, kind: str, caption: str) -> str:
    if data is None:
        return ""
    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
    return (f'<figure data-plot="{kind}"><img class="plot" data-plot="{kind}" src="{png_uri(data)}" width="{w}" '
            f'height="{h}" alt="{esc(kind)} plot"><figcaption>{esc(caption)}</figcaption></figure>')


def _budget(run: RunReport) -> str:
    b = run.budget
    rows = [("images generated", f"{b.images_used:,}" + (f" of {b.images_budget:,}" if b.images_budget else "")),
            ("images edited (counterfactuals)", f"{b.images_edited:,}"),
            ("planner turns", str(b.planner_turns)),
            ("tool calls", f"{b.tool_calls} ({b.tool_errors} returned an error)"),
            ("time in tools", f"{b.tool_seconds:.1f} s"),
            ("wall time", f"{b.wall_seconds:.1f} s" if b.wall_seconds is not None else "–")]
    if b.prompt_tokens or b.completion_tokens:
        rows.append(("LLM tokens", f"{b.prompt_tokens:,} prompt + {b.completion_tokens:,} completion"))
    if b.cost_usd is not None:
        rows.append(("LLM cost", f"${b.cost_usd:.4f}"))
    body = "".join(f"<tr><th>{esc(k)}</th><td class='num'>{esc(v)}</td></tr>" for k, v in rows)
    return f'<div class="scroll"><table class="budget">{body}</table></div>'


def _vs(h: stats.Rate, b: stats.Rate) -> str:
    return f"{fmt_rate(h)}<br><span class='muted'>vs {fmt_rate(b)}</span>"


def _confirmed_ratio(c: Evidence) -> str:
    """The confirmation's headline bound first (the number every view claims), then its naive ratio."""
    if c.bound is None:
        return fmt_ratio(c.rate_ratio)
    return f"<b>≥ {c.bound:.3g}×</b><br><span class='muted'>naive {fmt_ratio(c.rate_ratio)}</span>"


def _findings(run: RunReport, rid: str) -> str:
    if not run.findings:
        return "<p class='muted'>No finding was confirmed in this run.</p>"
    head = ("<tr><th>id</th><th class='cap'>caption</th><th>discovery k/n [95% CI]<br>vs baseline</th>"
            "<th>rate ratio [95% CI]</th><th>p<br>adj. p</th><th>confirmation k/n<br>vs baseline</th>"
            "<th>fails at least<br>(rate ratio)</th><th>p<br>adj. p</th><th>counterfactual</th><th>confirmed</th></tr>")
    rows = []
    for f in run.findings:
        d, c, cf = f.discovery, f.confirmation, f.counterfactual
        cf_text = (f"{fmt_ratio(cf.rate_ratio)}<br>p {fmt_p(cf.p_value)}, adj. {fmt_p(cf.adjusted_p)}" if cf else "–")
        summary = f"<div class='small muted'>{esc(f.summary)}</div>" if f.summary else ""
        rows.append(
            f'<tr class="finding {"yes" if f.confirmed else ""}" data-finding="{esc(f.finding_id)}">'
            f"<td>{esc(f.finding_id)}</td><td class='cap'>{esc(f.caption)}{summary}</td>"
            f"<td class='num'>{_vs(d.hypothesis, d.baseline)}</td><td class='num'>{fmt_ratio(d.rate_ratio)}</td>"
            f"<td class='num'>{fmt_p(d.p_value)}<br>{fmt_p(d.adjusted_p)}</td>"
            f"<td class='num'>{_vs(c.hypothesis, c.baseline)}</td><td class='num'>{_confirmed_ratio(c)}</td>"
            f"<td class='num'>{fmt_p(c.p_value)}<br>{fmt_p(c.adjusted_p)}</td>"
            f"<td class='num'>{cf_text}</td><td>{'yes' if f.confirmed else 'no'}</td></tr>")
    return (f'<div class="scroll"><table class="findings" id="{rid}-findings"><thead>{head}</thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>'
            "<p class='small muted'>p: one-sided exact test (counterfactual: exact McNemar on the edited pairs); "
            "adj. p: adjusted within the discovery or the confirmation family as it stood when the finding "
            "was recorded.</p>")


def _tests(run: RunReport, rid: str) -> str:
    if not run.tests:
        return "<p class='muted'>No hypothesis was measured.</p>"
    head = ("<tr><th>test</th><th>seeds</th><th>mode</th><th class='cap'>caption</th>"
            "<th>hypothesis k/n [95% CI]<br>vs baseline</th><th>rate ratio [95% CI]</th><th>p</th><th>adj. p</th>"
            "<th>verdict</th><th>finding</th></tr>")
    rows = []
    for t in run.tests:
        mode = t.mode
        if t.mcnemar is not None:
            mode += f" (McNemar {t.mcnemar.b}↑/{t.mcnemar.c}↓)"
        rows.append(
            f'<tr class="test {"yes" if t.finding_id else ""}" data-test="{esc(t.test_id)}">'
            f"<td>{esc(t.test_id)}</td><td>{esc(t.purpose)}</td><td class='small'>{esc(mode)}</td>"
            f"<td class='cap'>{esc(t.caption)}</td><td class='num'>{_vs(t.hypothesis, t.baseline)}</td>"
            f"<td class='num'>{fmt_ratio(t.rate_ratio)}</td>"
            f"<td class='num'>{fmt_p(t.p_value)}</td><td class='num'>{fmt_p(t.adjusted_p)}</td>"
            f"<td class='verdict-{esc(t.verdict.replace(' ', '-'))}'>{esc(t.verdict)}</td>"
            f"<td>{esc(t.finding_id or '')}</td></tr>")
    methods = sorted({t.adjust_method for t in run.tests})
    return (f'<div class="scroll"><table class="tests" id="{rid}-tests"><thead>{head}</thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>'
            f"<p class='small muted'>adj. p: {esc(', '.join(methods))} over every test of the same seeds family "
            "(discovery or confirmation) in the run, recomputed after its last test.</p>")


def _tree_node(node: TreeNode, tests: dict[str, HypothesisTest]) -> str:
    badges = []
    for tid in node.tests:
        t = tests.get(tid)
        if t is None:
            continue
        kind = "cf" if t.mode == "counterfactual" else ("conf" if t.purpose == "confirmation" else "disc")
        badges.append(f'<span class="badge" title="{esc(t.verdict)}, adj. p {fmt_p(t.adjusted_p)}">'
                      f"{esc(tid)} {kind} {esc(fmt_ratio(t.rate_ratio).split(' ')[0])}× "
                      f"<span class='verdict-{esc(t.verdict.replace(' ', '-'))}'>{esc(t.verdict)}</span></span>")
    if node.finding_id:
        badges.append(f'<span class="badge finding">finding {esc(node.finding_id)}</span>')
    rel = f'<span class="rel">{esc(node.relation)} →</span> ' if node.relation else ""
    inner = "".join(_tree_node(c, tests) for c in node.children)
    if node.unmeasured:
        items = "".join(f"<li class='small muted'>{esc(u)}</li>" for u in node.unmeasured)
        inner += f"<li><details><summary class='small muted'>{len(node.unmeasured)} proposals not measured"\
                 f"</summary><ul>{items}</ul></details></li>"
    return f"<li>{rel}{esc(node.caption)}{''.join(badges)}" + (f"<ul>{inner}</ul>" if inner else "") + "</li>"


def _pairs(pairs: list[PairSet], emb: ImageEmbedder) -> str:
    out = []
    for p in pairs:
        stat = (f"McNemar: {p.mcnemar.b} flipped to failure, {p.mcnemar.c} back; exact p = {fmt_p(p.mcnemar.p_value)}"
                if p.mcnemar else "")
        cards = []
        for f in p.flips:
            def preds(labels: list[str], failed: bool) -> str:
                return f"<span class='{'bad' if failed else 'ok'}'>{esc(', '.join(labels[:3]))}</span>"
            cards.append(f"<div class='pair'><div class='imgs'>{_img(emb, f.original, PAIR, 'before')}"
                         f"{_img(emb, f.edited, PAIR, 'after')}</div>before: {preds(f.before, f.failed_before)}"
                         f"<br>after: {preds(f.after, f.failed_after)}</div>")
        out.append(f"<details class='images'><summary>{esc(p.source)}: {esc(p.before_caption)} → "
                   f"{esc(p.after_caption)} <span class='muted'>({len(p.flips)} pairs)</span></summary>"
                   f"<p class='small'>{esc(stat)}{'; ' if stat and p.note else ''}{esc(p.note)}"
                   f"{'' if p.flips else ' (no image changed its outcome)'}</p>"
                   f"<div class='pairs'>{''.join(cards)}</div></details>")
    return "".join(out) or "<p class='muted'>No counterfactual edits in this run.</p>"


def confusion_panels(run: RunReport, most: int = 9) -> list[ConfusionPanel]:
    """Findings first (their confirmation sample: fresh seeds, no selection bias), else the best supported tests."""
    samples = [t for t in run.tests if t.mode == "sample" and t.summary is not None]
    chosen: list[HypothesisTest] = []
    for f in run.findings:
        same = [t for t in samples if normalise_caption(t.caption) == normalise_caption(f.caption)]
        conf = [t for t in same if t.purpose == "confirmation"]
        if conf or same:
            chosen.append(conf[-1] if conf else max(same, key=lambda t: t.hypothesis.n))
    if not chosen:
        chosen = sorted([t for t in samples if t.verdict == "supported"], key=lambda t: t.adjusted_p)[:3]
    return [ConfusionPanel(title=f"{t.finding_id + ': ' if t.finding_id else ''}"
                                 f"{short_caption(t.caption, run.class_prompt, 80)} ({t.purpose})",
                           label=run.label, baseline=run.baseline, hypothesis=t.summary)
            for t in chosen[:most] if t.summary is not None]


def _grid(emb: ImageEmbedder, title: str, detail: str, refs: list[str], *, open_: bool = False) -> str:
    imgs = "".join(_img(emb, r, THUMB) for r in refs)
    return (f"<details class='images'{' open' if open_ else ''}><summary>{esc(title)} <span class='muted'>"
            f"{esc(detail)} ({len(refs)} image{'s' * (len(refs) != 1)})</span></summary>"
            f"<div class='grid'>{imgs}</div></details>")


def _image_groups(run: RunReport, emb: ImageEmbedder) -> str:
    """Image grids, collapsed: each confirmed finding's images under it first, then every other group."""
    out = []
    shown: set[int] = set()
    for f in run.findings:
        theirs = {id(g) for g in finding_groups(run, f)}  # once per finding: the groups are many in a long run
        mine = [i for i, g in enumerate(run.groups) if i not in shown and id(g) in theirs]
        if mine:
            shown.update(mine)
            inner = "".join(_grid(emb, run.groups[i].title, run.groups[i].detail, run.groups[i].refs)
                            for i in mine)
            out.append(f"<h4 class='small'>{esc(f.finding_id)}: {esc(short_caption(f.caption, run.class_prompt, 90))}"
                       f"</h4>{inner}")
    rest = [g for i, g in enumerate(run.groups) if i not in shown]
    if rest:
        out.append("<h4 class='small'>Other samples and clusters of failures</h4>"
                   + "".join(_grid(emb, g.title, g.detail, g.refs) for g in rest))
    return "".join(out) or "<p class='muted'>No images were stored.</p>"


def render_run(run: RunReport, rid: str, *, heading: str = "h2") -> str:
    emb = ImageEmbedder(Path(run.path).parent / "artifacts")
    tests = {t.test_id: t for t in run.tests}
    meta = {"run": run.run_id, "class": run.label, "class prompt": run.class_prompt or "–", "planner": run.planner,
            "status": run.status, "transcript": run.path}
    config = {**{f"backend: {k}": v for k, v in run.backends.items()},
              **{f"config: {k}": v for k, v in run.config.items() if k not in ("class", "planner")}}
    parts = [(f'<section class="run" id="{rid}"><{heading}>{esc(run.label or run.run_id)} '
              f"<span class='muted small'>{esc(run.run_id)}</span></{heading}>"),
             "<dl class='meta'>" + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in meta.items()) + "</dl>",
             "<details><summary class='small'>backends and configuration</summary><dl class='meta'>"
             + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in config.items()) + "</dl></details>"]
    parts += ["<h3>Failure modes</h3>", modes_block(run, rid),
              "<h3>Confirmed findings at a glance</h3>", summary_block(run, emb, rid)]
    if run.answer:
        parts.append(conclusion(run.answer))
    parts += ["<h3>Findings: every number</h3>", _findings(run, rid)]
    parts.append(_plot(forest_plot(run.tests, run.class_prompt), "forest",
                       "Rate ratio of each caption tested on discovery seeds (circle, coloured by verdict), its "
                       "confirmation on fresh seeds (diamond) and counterfactual edits (square); findings in bold. "
                       "An arrow at the edge is an infinite ratio (no baseline failure) or a zero one."))
    parts.append(_plot(confusion_bars(confusion_panels(run)), "confusion",
                       "Top-1 labels given to images of the class prompt (grey) and of the hypothesis (red), "
                       "as in Wiles et al.'s Figure 2; findings from their confirmation sample."))
    parts += ["<h3>Counterfactual pairs</h3>", _pairs(run.pairs, emb),
              "<h3>Budget spent</h3>", _budget(run),
              "<h3>Every hypothesis tested</h3>", _tests(run, rid), "<h3>How hypotheses were found and refined</h3>",
              "<ul class='tree'>" + "".join(_tree_node(n, tests) for n in run.tree) + "</ul>"
              if run.tree else "<p class='muted'>No hypotheses.</p>"]
    parts += ["<h3>Failure images</h3>", _image_groups(run, emb)]
    if run.reasoning:
        steps = "".join(f"<pre class='reason'>{i + 1}. {esc(r)}</pre>" for i, r in enumerate(run.reasoning))
        parts.append(f"<details><summary>The planner's reasoning ({len(run.reasoning)} turns)</summary>{steps}"
                     "</details>")
    warnings = run.warnings + [f"image {r} is not in the artifact store" for r in emb.missing]
    if warnings:
        parts.append("<h3>Warnings</h3><ul>" + "".join(f"<li>{esc(w)}</li>" for w in warnings) + "</ul>")
    parts.append("</section>")
    return "\n".join(parts)


def render_mitigation(m: MitigationResult, mid: str) -> str:
    """A mitigation (`sleuth mitigate`): each finding before and after on the same fresh images, the class
    baselines, and the accuracy test."""
    acc = m.accuracy.test
    ci = acc.interval
    alpha = float(m.config.get("alpha", 0.05))
    rows = []
    for o in m.findings:
        r = o.rates
        rows.append(f"<tr class='{'yes' if o.verdict == 'mitigated' else ''}'><td>{esc(o.label)}:{esc(o.finding_id)}"
                    f"</td><td class='cap'>{esc(o.caption)}</td><td>{'yes' if o.mitigated_here else 'no'}</td>"
                    f"<td class='num'>{fmt_rate(r.before)}</td><td class='num'>{fmt_rate(r.after)}</td>"
                    f"<td class='num'>{fmt_ratio(r.ratio)}</td>"
                    f"<td class='num'>{'' if r.adjusted_p_better is None else fmt_p(r.adjusted_p_better)}</td>"
                    f"<td class='num'>{'' if r.adjusted_p_worse is None else fmt_p(r.adjusted_p_worse)}</td>"
                    f"<td>{esc(o.verdict)}</td></tr>")
    for b in m.baselines:
        worse = (b.adjusted_p_worse or 1.0) < alpha
        rows.append(f"<tr><td>{esc(b.label)}</td><td class='cap'>class baseline: {esc(b.caption)}</td><td></td>"
                    f"<td class='num'>{fmt_rate(b.before)}</td><td class='num'>{fmt_rate(b.after)}</td>"
                    f"<td class='num'>{fmt_ratio(b.ratio)}</td><td></td>"
                    f"<td class='num'>{'' if b.adjusted_p_worse is None else fmt_p(b.adjusted_p_worse)}</td>"
                    f"<td>{'worse' if worse else ''}</td></tr>")
    per_class = "".join(f"<tr><td>{esc(k)}</td><td class='num'>{100 * a:.1f}%</td><td class='num'>{100 * b:.1f}%"
                        f"</td></tr>" for k, (a, b) in m.accuracy.per_class.items())
    return (f"<section id='{mid}'><h2>Mitigation: {'effective' if m.effective else 'not shown effective'}</h2>"
            f"<dl class='meta'><dt>classifier before</dt><dd>{esc(m.classifier_before)}</dd>"
            f"<dt>classifier after</dt><dd>{esc(m.classifier_after)}</dd>"
            f"<dt>settings</dt><dd>{esc(', '.join(f'{k}={v}' for k, v in m.config.items() if v is not None))}</dd>"
            f"<dt>images</dt><dd>{m.images.get('training', 0):,} generated for training, "
            f"{m.images.get('evaluation', 0):,} fresh for evaluation</dd></dl>"
            "<p class='small'>The same fresh images, never used for training, go through the classifier before and "
            "after: rates are paired. <i>p better</i>: exact one-sided McNemar test that the rate fell, Holm over the "
            "mitigated findings; <i>p worse</i>: that it rose, Holm over every measurement. A finding is "
            "<i>mitigated</i> when it improved significantly and accuracy is non-inferior.</p>"
            "<div class='scroll'><table><thead><tr><th>finding</th><th class='cap'>caption</th><th>trained on</th>"
            "<th>before</th><th>after</th><th>after / before</th><th>adj. p better</th><th>adj. p worse</th>"
            f"<th>verdict</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
            f"<p>Top-1 accuracy over {m.accuracy.classes} classes ({m.accuracy.n_per_class} fresh images each): "
            f"{100 * ci.before.rate:.2f}% → {100 * ci.after.rate:.2f}%, difference {100 * ci.difference:+.2f} points, "
            f"one-sided {100 * (1 - acc.alpha):.0f}% lower bound {100 * ci.low:+.2f} (Newcombe, paired): "
            f"non-inferiority at −{100 * acc.margin:.1f} point(s) <b>{'shown' if acc.shown else 'not shown'}</b>.</p>"
            "<details><summary>accuracy by class</summary><table><thead><tr><th>class</th><th>before</th>"
            f"<th>after</th></tr></thead><tbody>{per_class}</tbody></table></details></section>")


def render_audit(summary: dict[str, Any]) -> str:
    """What holds across the audit's classes: the family, the error controlled and its level, and which findings
    survive it (``audit_p``), beside each finding's adjusted p within its class."""
    control = summary["audit_control"]
    rows = "".join(
        f"<tr class='{'yes' if f.get('audit_significant') else ''}'><td>{esc(f['label'])}</td>"
        f"<td class='cap'>{esc(f['caption'])}</td><td class='num'>{fmt_p(f['confirmation']['adjusted_p'])}</td>"
        f"<td class='num'>{fmt_p(f['audit_p'])}</td><td>{'yes' if f.get('audit_significant') else 'no'}</td></tr>"
        for f in summary.get("findings", []) if "audit_p" in f)
    table = ("<div class='scroll'><table class='audit'><thead><tr><th>class</th><th class='cap'>caption</th>"
             "<th>adj. p (class)</th><th>audit p</th><th>audit-significant</th></tr></thead>"
             f"<tbody>{rows}</tbody></table></div>" if rows
             else "<p class='muted'>No finding was confirmed in any class.</p>")
    return ("<section id='audit'><h2>Across the audit's classes</h2>"
            f"<p>Controlled: {esc(control['error'])} error at {control['level']:g}, over {esc(control['family'])} "
            f"({esc(control['method'])}): {esc(control['statement'])}.</p>{table}</section>")


def render_report(runs: list[RunReport], title: str | None = None,
                  mitigations: list[MitigationResult] | None = None, audit: dict[str, Any] | None = None) -> str:
    """The whole page: one section per run, with an overview table when there are several, then any mitigation."""
    if title is None:
        title = (f"sleuth report: {runs[0].label or runs[0].run_id}" if len(runs) == 1
                 else f"sleuth report: {len(runs)} runs")
    body = [f"<h1>{esc(title)}</h1>"]
    if len(runs) > 1:
        rows = "".join(
            f"<tr><td><a href='#r{i}'>{esc(r.label or r.run_id)}</a></td><td>{esc(r.run_id)}</td>"
            f"<td>{esc(r.status)}</td><td class='num'>{len(r.modes)}</td><td class='num'>{len(r.findings)}</td>"
            f"<td class='num'>{sum(t.purpose == 'discovery' for t in r.tests)}</td>"
            f"<td class='num'>{r.budget.images_used:,}</td></tr>" for i, r in enumerate(runs))
        body.append("<div class='scroll'><table class='overview'><thead><tr><th>class</th><th>run</th><th>status</th>"
                    "<th>failure modes</th><th>findings</th><th>discovery tests</th><th>images</th></tr></thead>"
                    f"<tbody>{rows}</tbody></table></div>")
    if audit is not None:
        body.append(render_audit(audit))
    body += [render_run(r, f"r{i}") for i, r in enumerate(runs)]
    body += [render_mitigation(m, f"m{i}") for i, m in enumerate(mitigations or [])]
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
