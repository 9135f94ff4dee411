"""Failure modes in the stored and printed outputs: the report's first section, an audit's summaries and tables, and
the answer key. The numbers are those of ``ModeSummary``, as ``--json`` and the terminal print them."""

from __future__ import annotations

import json
import os

import pytest
from rich.console import Console

from sleuth.agent.audit.summary import audit_summary, class_summary, classes_table, skipped_summary
from sleuth.agent.audit.summary import findings_table as audit_findings_table
from sleuth.agent.audit.summary import modes_table as audit_modes_table
from sleuth.agent.cli.commands.investigate import summary
from sleuth.agent.mode_summary import WEAK, counts_text, effect_text, mode_summaries
from sleuth.agent.replay.resume import Continued
from sleuth.agent.report import build_report, load_runs
from sleuth.agent.report.modes import modes_block
from sleuth.agent.terminal.answer_key import render_answer_key
from sleuth.agent.transcript import read_transcript
from sleuth.agent.view import InvestigationView
from sleuth.tools.text import pv
from tests.moderun import DAYTIME, HILL, SNOW, ModeRun, mode_run
from tests.test_report import Dom


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> ModeRun:
    return mode_run(tmp_path_factory.mktemp("runs") / "cat-modes")


def text(renderable: object, width: int = 200) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"))
    console.print(renderable)
    return console.export_text()


def test_the_report_opens_each_run_with_its_modes_and_their_phrasings(run: ModeRun) -> None:
    page = build_report(run.session.run_dir)
    [report] = load_runs(run.session.run_dir)
    modes = mode_summaries(InvestigationView.from_transcript(run.transcript))
    assert report.modes == modes  # the report holds the modes --json prints
    assert page.index("<h3>Failure modes</h3>") < page.index("<h3>Confirmed findings at a glance</h3>") \
        < page.index('table class="findings"')
    rows = [" ".join(" ".join(r).split()) for r in Dom(page).rows["modes"]]
    assert len(rows) == 3  # m1, the phrasings under it, m2
    m1, under, m2 = rows
    best = modes[0]
    assert m1.startswith(f"m1 {best.best}: …cat in the snow.") and "snow leopard" in m1
    assert counts_text(best) in m1 and effect_text(best) in m1 and pv(best.adjusted_p) in m1 and "not tested" in m1
    assert m1.endswith(" 1") and m2.startswith("m2 f3: …cat on a snowy hill.") and m2.endswith(" 0")
    phrasing = next(x for x in ("f1", "f2") if x != best.best)
    caption = {"f1": SNOW, "f2": DAYTIME}[phrasing]
    assert under.startswith("phrasings of the same cause:") and f"{caption} ({phrasing})" in under
    assert best.reasons.get(phrasing, "") in under.replace("’", "'")
    assert HILL not in under


def test_a_weak_mode_in_the_report_says_so_and_captions_are_escaped(run: ModeRun) -> None:
    [report] = load_runs(run.session.run_dir)
    weak = report.modes[1].model_copy(update={"weak": True, "caption": "a cat </td><script>x</script>"})
    html = modes_block(report.model_copy(update={"modes": [report.modes[0], weak]}), "r0")
    assert weak.at_least is not None and f"≥ {weak.at_least:.3g}× weak (given selection " in html
    assert "<script>" not in html and "&lt;script&gt;" in html and "class='mode weak'" in html
    # A transcript recorded before the bound existed: the weak claim in words, with its interval.
    old = weak.model_copy(update={"at_least": None})
    html = modes_block(report.model_copy(update={"modes": [report.modes[0], old]}), "r0")
    assert WEAK in html and "95% CI [" in html


def test_an_audit_stores_each_class_modes_and_counts_them_beside_findings(run: ModeRun) -> None:
    inv = run.session.investigation
    events = read_transcript(run.transcript)
    cat = class_summary("cat", "cat", inv, events, Continued(run.transcript, run.result), 1.0)
    modes = mode_summaries(InvestigationView.from_events(events))
    assert cat["modes"] == [m.model_dump(mode="json") for m in modes]
    assert {f["finding_id"]: f["mode_id"] for f in cat["findings"]} == {"f1": "m1", "f2": "m1", "f3": "m2"}
    # The same shape and numbers as `investigate --json`.
    assert cat["modes"] == summary(run.session, run.result, 1.0, modes)["modes"]
    dog = skipped_summary("dog", "dog", "the audit's image budget is spent")
    out = audit_summary("audit", {}, [cat, dog], 2.0)
    json.dumps(out, allow_nan=False)
    assert dog["modes"] == [] and [f["mode_id"] for f in out["findings"]] != []
    classes = text(classes_table(out))
    row = next(line for line in classes.splitlines() if line.startswith("│ cat"))
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert cells[5:7] == ["2", "3"]  # modes, findings
    table = text(audit_findings_table(out))
    assert "Audit findings: 3 confirmed in 2 failure modes," in table
    marks = {line.split("│")[2].strip() for line in table.splitlines() if line.startswith("│ cat")}
    assert marks == {"m1", "m2"}
    assert list(out).index("modes") < list(out).index("classes") < list(out).index("findings")
    assert out["modes"] == sorted(cat["modes"], key=lambda m: -m["at_least"])
    # The modes first: one row per mode of every class, strongest bound first, with its audit p (2 classes).
    first = text(audit_modes_table(out))
    assert "Audit failure modes: 2 in 2 classes, strongest first" in first
    rows = [line.split() for line in first.splitlines() if line.startswith("cat ")]
    assert [r[1] for r in rows] == sorted((m["mode_id"] for m in cat["modes"]),
                                          key=lambda i: -next(m["at_least"] for m in cat["modes"] if m["mode_id"] == i))
    best = max(cat["modes"], key=lambda m: m["at_least"])
    assert f"≥ {best['at_least']:.3g}×" in first and pv(min(1.0, 2 * best["adjusted_p"])) in first
    # A summary written before modes were recorded counts none.
    old = {**cat}
    del old["modes"]
    assert audit_modes_table(audit_summary("audit", {}, [old], 1.0)) is None
    assert "Audit findings: 3 confirmed in 0 failure modes," in text(audit_findings_table(
        audit_summary("audit", {}, [old], 1.0)))


def test_the_answer_key_names_the_modes_that_found_a_bug(run: ModeRun) -> None:
    from sleuth.agent.bench.reveal import answer_key
    from sleuth.tools.backends.toyworld.config import load_world

    view = InvestigationView.from_transcript(run.transcript)
    findings = [f for f in summary(run.session, run.result, 1.0, mode_summaries(view))["findings"] if f["confirmed"]]
    key = answer_key(load_world("default"), "cat", view, findings, oracle_n=100)
    assert key["modes"] == {"m1": ["f1", "f2"], "m2": ["f3"]}
    assert {f["finding_id"]: f["mode_id"] for f in key["findings"]} == {"f1": "m1", "f2": "m1", "f3": "m2"}
    snow = next(p for p in key["planted"] if p["name"] == "cat in snow")
    assert snow["found"] and "m1" in snow["modes"] and set(snow["findings"]) >= {"f1"}
    line = next(x for x in text(render_answer_key(key), 400).splitlines() if x.startswith("• cat in snow"))
    by = ", ".join(f"{m} ({', '.join(key['modes'][m])})" for m in snow["modes"])
    assert f"FOUND by mode{'s' * (len(snow['modes']) != 1)} {by}: " in line


def test_an_answer_key_line_names_modes_with_all_their_findings() -> None:
    oracle = {"ratio": 13.1, "ratio_ci": [11.0, 15.6], "k": 1555, "n": 2000, "baseline_k": 119, "baseline_n": 2000}
    bug = {"name": "cat in snow", "kind": "bug", "caption": "a cat. it is in the snow.", "confuser": "snow leopard",
           "oracle": oracle, "findings": ["f4", "f18"], "modes": ["m3"], "found": True, "why": "found"}
    decoy = {"name": "ball", "kind": "decoy", "caption": "a cat and a ball.", "confuser": None, "oracle": oracle,
             "findings": ["f9"], "modes": ["m5"]}
    key = {"class": "cat", "world": "default", "oracle_images": 2000, "planted": [bug, decoy], "findings": [],
           "false_findings": [], "modes": {"m3": ["f3", "f4", "f18", "f25"], "m5": ["f9"]}}
    out = text(render_answer_key(key))
    assert "FOUND by mode m3 (f3, f4, f18, f25): found." in out and "Named by mode m5 (f9)." in out
    # A key without modes (an older one) names the findings.
    bare = {**key, "planted": [{**bug, "modes": []}], "modes": {}}
    assert "FOUND by f4, f18: found." in text(render_answer_key(bare))


def test_every_view_prints_one_bound_for_a_finding(run: ModeRun) -> None:
    """The record line, the final answer, the terminal's modes and findings tables, --json, an audit's summary and
    tables, and the report: each shows a confirmed finding's headline bound, and the same one."""
    from sleuth.agent.terminal.render import render_event
    from sleuth.agent.terminal.tables import confirmed_table, modes_table

    inv = run.session.investigation
    events = read_transcript(run.transcript)
    modes = mode_summaries(InvestigationView.from_events(events))
    best = next(f for f in inv.findings if f.finding_id == modes[0].best)
    bound = best.confirmation.bound
    assert bound is not None and bound >= 1
    shown = f"≥ {bound:.3g}×"
    words = f"at least {bound:.3g}x"
    recorded = next(e for e in events if e.kind == "finding" and e.finding_id == best.finding_id)
    assert words in text(render_event(recorded)).replace("×", "x")
    assert words in events[-1].answer
    assert shown in text(modes_table(inv, modes)) and shown in text(confirmed_table(inv))
    out = summary(run.session, run.result, 1.0, modes)
    assert next(f for f in out["findings"] if f["finding_id"] == best.finding_id)["confirmation"]["at_least"] == bound
    assert out["modes"][0]["at_least"] == bound
    cat = class_summary("cat", "cat", inv, events, Continued(run.transcript, run.result), 1.0)
    audit = audit_summary("audit", {}, [cat], 1.0)
    assert shown in text(audit_findings_table(audit)) and shown in text(audit_modes_table(audit))
    assert shown in build_report(run.session.run_dir)
