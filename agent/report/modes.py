"""The first section of a run's report: one row per failure mode with its one claim, its phrasings listed under it.

The numbers are the ones the terminal and ``--json`` print (``agent/mode_summary.py``): the best-evidenced finding's
confirmation, its effect corrected for selection (a weak claim in words) and its adjusted p. Every string from a
run goes through ``esc`` (captions and reasons quote model-written text).
"""

from __future__ import annotations

from sleuth.agent.mode_summary import ModeSummary, counts_text, effect_text, fails_as, p_text
from sleuth.agent.report.data import RunReport
from sleuth.agent.report.plots import short_caption
from sleuth.agent.report.summary import counterfactual_verdict, esc


def _what(m: ModeSummary, run: RunReport) -> str:
    idea = f"<div class='small muted'>its failures show: {esc(m.idea)}</div>" if m.idea else ""
    return (f"<td class='cap' title='{esc(m.caption)}'>{esc(m.best)}: "
            f"{esc(short_caption(m.caption, run.class_prompt, 90))}{idea}</td>")


def _phrasings(m: ModeSummary, run: RunReport) -> str:
    """The mode's other findings, each with its caption, id and why it is in the mode."""
    captions = {f.finding_id: f.caption for f in run.findings}
    items = "".join(f"<li data-finding='{esc(fid)}'>{esc(captions.get(fid, ''))} <span class='muted'>({esc(fid)})"
                    f"</span> <span class='small muted'>{esc(m.reasons.get(fid, ''))}</span></li>"
                    for fid in m.phrasings)
    tests = {t.test_id: t for t in run.tests}
    tested = "".join(f"<li data-test='{esc(tid)}'>{esc(tests[tid].caption)} <span class='muted'>({esc(tid)}, "
                     f"{tests[tid].hypothesis.k}/{tests[tid].hypothesis.n})</span></li>"
                     for tid in m.tests if tid in tests)
    return (f"<tr class='phrasings' data-mode='{esc(m.mode_id)}'><td></td><td colspan='7'>"
            + (f"<span class='small'>phrasings of the same cause:</span><ul class='phrasings'>{items}</ul>"
               if items else "")
            + (f"<span class='small'>tested, its failures read as this cause, not confirmed on its own:</span>"
               f"<ul class='phrasings'>{tested}</ul>" if tested else "")
            + "</td></tr>")


def modes_block(run: RunReport, rid: str) -> str:
    """One row per failure mode, in the order the modes formed, each mode's phrasings in a row under it."""
    if not run.modes:
        return "<p class='muted'>No failure mode: no finding was confirmed in this run.</p>"
    by_id = {f.finding_id: f for f in run.findings}
    tests = {t.test_id: t for t in run.tests}
    rows = []
    for m in run.modes:
        best = by_id.get(m.best)
        verdict = counterfactual_verdict(best, tests) if best is not None else "not tested"
        rows.append(
            f"<tr class='mode{' weak' if m.weak else ''}' data-mode='{esc(m.mode_id)}'><td>{esc(m.mode_id)}</td>"
            f"{_what(m, run)}<td>{esc(fails_as(m))}</td><td class='num'>{esc(counts_text(m))}</td>"
            f"<td>{esc(effect_text(m))}</td><td class='num'>{esc(p_text(m))}</td><td class='small'>{esc(verdict)}</td>"
            f"<td class='num'>{len(m.phrasings)}"
            + (f"<div class='small muted'>{len(m.tests)} test{'s' * (len(m.tests) != 1)}</div>" if m.tests else "")
            + "</td></tr>")
        if m.phrasings or m.tests:
            rows.append(_phrasings(m, run))
    confirmed = sum(1 for f in run.findings if f.confirmed)
    return (f"<p>{len(run.modes)} failure mode{'s' * (len(run.modes) != 1)} from {confirmed} confirmed "
            f"finding{'s' * (confirmed != 1)}.</p>"
            f"<div class='scroll'><table class='modes' id='{rid}-modes'><thead><tr><th>mode</th>"
            "<th class='cap'>what fails (best-evidenced finding)</th><th>fails as</th>"
            "<th>confirmation k/n vs baseline</th><th>fails at least (given selection [95% CI])</th><th>adj. p</th>"
            "<th>counterfactual edits</th><th>phrasings</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>"
            "<p class='small muted'>A failure mode is one cause: the findings whose failures show the same thing. Its "
            "numbers are its best-evidenced finding's confirmation on fresh seeds: ≥, how much more often it fails "
            "at least (the least ratio the confirmation's own test still rejects; a run's bounds hold together with "
            "probability 1 − 2α), then the ratio corrected for selection (weak: its interval reaches 1, so by how "
            "much more is not known); its other findings "
            "are phrasings of the same cause, listed under it with why each belongs, and so are the tests whose "
            "failures read as the same cause, which the planner did not confirm on their own.</p>")
