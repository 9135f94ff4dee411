"""Failure modes in the terminal, ``--json``, the live view and replay, the LLM's ledger and chat: modes first, one
claim per mode (its best-evidenced finding's confirmation), the same numbers in each, a weak claim in words."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from sleuth.agent.cli import main
from sleuth.agent.cli.commands.investigate import summary
from sleuth.agent.llm.ledger import ledger
from sleuth.agent.mode_summary import WEAK, ModeSummary, effect_text, is_weak, mode_ids, mode_summaries
from sleuth.agent.modes import ModeClaim, effect_of
from sleuth.agent.planners.scripted import ScriptedPlanner
from sleuth.agent.report import build_report, load_runs
from sleuth.agent.runner import Turn
from sleuth.agent.terminal import tables
from sleuth.agent.terminal.render import render_event
from sleuth.agent.transcript import read_transcript
from sleuth.agent.view import InvestigationView
from sleuth.tools.findings import Finding
from sleuth.tools.stats import RatioCI
from sleuth.tools.text import pv
from tests.fakeworld import fake_backends, new_session
from tests.moderun import CAT, DAYTIME, HILL, SCRIPT, SNOW, ModeRun, call, mode_run, weakened
from tests.test_report import Dom
from tests.test_terminal_tables import piped


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> ModeRun:
    return mode_run(tmp_path_factory.mktemp("runs") / "cat-modes")


@pytest.fixture()
def view(run: ModeRun) -> InvestigationView:
    return InvestigationView.from_transcript(run.transcript)


def by_id(run: ModeRun) -> dict[str, Finding]:
    return {f.finding_id: f for f in run.session.investigation.findings}


def test_a_mode_claims_its_best_evidenced_findings_confirmation(run: ModeRun, view: InvestigationView) -> None:
    m1, m2 = mode_summaries(view)
    f = by_id(run)
    assert [f[i].caption for i in ("f1", "f2", "f3")] == [SNOW, DAYTIME, HILL]
    assert (m1.mode_id, m1.findings, m2.mode_id, m2.findings) == ("m1", ["f1", "f2"], "m2", ["f3"])
    # The best-evidenced of the mode's findings: the smaller adjusted p.
    best = min((f["f1"], f["f2"]), key=lambda x: x.confirmation.adjusted_p)
    assert m1.best == best.finding_id and m1.caption == best.caption
    assert m1.phrasings == [x for x in ("f1", "f2") if x != best.finding_id] and m2.phrasings == []
    c, r = best.confirmation, effect_of(best)
    assert c.effect is not None and r == c.effect  # corrected for selection, not the naive ratio
    assert (m1.confirmation.k, m1.confirmation.n, m1.baseline.k, m1.baseline.n) == (
        c.hypothesis.k, c.hypothesis.n, c.baseline.k, c.baseline.n)
    assert (m1.ratio, m1.ratio_ci, m1.adjusted_p) == (r.ratio, (r.low, r.high), c.adjusted_p)
    assert r.low > 1 and not m1.weak and m1.labels == ["snow leopard"] and m1.label == "cat"
    assert m1.reasons["f2"] == "it holds every word of f1's caption" and m1.reasons["f1"].startswith("a cause")
    assert mode_ids([m1, m2]) == {"f1": "m1", "f2": "m1", "f3": "m2"}


def test_a_weak_claim_is_said_in_words_and_non_finite_numbers_are_null() -> None:
    def r(ratio: float, low: float, high: float) -> RatioCI:
        return RatioCI(ratio=ratio, low=low, high=high, method="test")

    assert is_weak(r(2.5, 0.0, 16.0)) and is_weak(r(6.0, 1.0, 9.0)) and is_weak(r(math.nan, math.nan, math.nan))
    assert not is_weak(r(1.5, 1.01, 2.0)) and not is_weak(r(math.inf, 3.0, math.inf))


def _claim(run: ModeRun, f: Finding) -> ModeSummary:
    mode = InvestigationView.from_transcript(run.transcript).modes.mode_of("f3")
    assert mode is not None
    return ModeSummary.of("cat", ModeClaim(mode, [f], f))


def test_weak_infinite_and_undefined_effects_print_and_store_as_documented(run: ModeRun) -> None:
    f3 = by_id(run)["f3"]
    b = f3.confirmation.bound
    assert b is not None and 1 <= b < 16
    # With the headline bound: the bound, "weak", and the effect given selection clipped at the bound, without an
    # estimate where its interval started at 0 (a count barely past its threshold).
    weak = _claim(run, weakened(f3))
    assert weak.weak and weak.at_least == b and (weak.ratio, weak.ratio_ci) == (None, (b, 16.0))
    assert effect_text(weak) == f"≥ {b:.3g}× weak (given selection [{b:.3g}, 16])"
    assert effect_text(weak, interval=False) == f"≥ {b:.3g}× weak"
    nan = _claim(run, weakened(f3, math.nan, math.nan, math.nan))
    assert nan.weak and (nan.ratio, nan.ratio_ci) == (None, (b, None))
    inf = _claim(run, weakened(f3, math.inf, 3.0 * b, math.inf))
    assert not inf.weak and (inf.ratio, inf.ratio_ci) == (None, (3.0 * b, None))
    assert effect_text(inf) == f"≥ {b:.3g}× (given selection [{3 * b:.3g}, ∞])"
    # A transcript recorded before the bound: the corrected effect, a weak one in words.
    def legacy(f: Finding) -> Finding:
        return f.model_copy(update={"confirmation": f.confirmation.model_copy(update={"bound": None})})
    old = _claim(run, legacy(weakened(f3)))
    assert old.weak and old.at_least is None and (old.ratio, old.ratio_ci) == (2.5, (0.0, 16.0))
    assert effect_text(old) == f"{WEAK} (95% CI [0, 16])" and effect_text(old, interval=False) == WEAK
    old_inf = _claim(run, legacy(weakened(f3, math.inf, 3.0, math.inf)))
    assert (old_inf.ratio, old_inf.ratio_ci) == (None, (3.0, None)) and effect_text(old_inf) == "∞× [3, ∞]"
    for m in (weak, nan, inf, old, old_inf):  # strict JSON
        json.dumps(m.model_dump(mode="json"), allow_nan=False)


def _rows(text: str, pattern: str) -> dict[str, str]:
    return {line.split()[0]: line for line in text.splitlines() if re.match(pattern, line)}


def test_the_terminal_shows_modes_first_then_each_finding_with_its_mode(run: ModeRun, view: InvestigationView) -> None:
    inv = run.session.investigation
    modes = mode_summaries(view)
    text = piped(tables.findings_table(inv, modes=modes))
    head, _, rest = text.partition("cat: 3 confirmed findings")
    assert "cat: 2 failure modes from 3 confirmed findings (class baseline " in head and rest
    rows = _rows(head, r"m\d+ ")
    assert set(rows) == {"m1", "m2"}
    best = by_id(run)[modes[0].best]
    c, r = best.confirmation, effect_of(best)
    m1 = rows["m1"]
    assert f"{best.finding_id} … in the snow" in m1 and "snow leopard" in m1 and "not tested" in m1
    assert f"{c.hypothesis.k}/{c.hypothesis.n} vs {c.baseline.k}/{c.baseline.n}" in m1
    assert c.bound is not None and f"≥ {c.bound:.3g}×" in m1 and pv(c.adjusted_p) in m1 and r.ratio >= c.bound
    assert m1.split()[-2:] == ["+1:", "f2"] and rows["m2"].split()[-1] == "–"
    # The same number in the findings table's row of the best finding, and each finding's mode beside its id.
    findings = _rows(rest, r"f\d+ ")
    assert {k: v.split()[1] for k, v in findings.items()} == {"f1": "m1", "f2": "m1", "f3": "m2"}
    assert f"≥ {c.bound:.3g}×" in findings[best.finding_id]


def test_a_weak_mode_says_so_in_the_terminal(run: ModeRun, view: InvestigationView) -> None:
    inv = run.session.investigation
    i = next(i for i, f in enumerate(inv.findings) if f.finding_id == "f3")
    original = inv.findings[i]
    inv.findings[i] = view.findings[i] = weakened(original)
    try:
        modes = mode_summaries(view)
        text = piped(tables.findings_table(inv, modes=modes))
    finally:
        inv.findings[i] = original
    assert modes[1].weak and not modes[0].weak
    head, _, rest = text.partition("cat: 3 confirmed findings")
    block = head[head.index("\nm2 "):head.index("A failure mode")]
    b = original.confirmation.bound
    assert b is not None and f"≥ {b:.3g}× weak" in block and "2.5×" not in block
    assert f"≥ {b:.3g}× weak" in _rows(rest, r"f\d+ ")["f3"]  # the findings table: the same number


def test_many_phrasings_and_long_captions_fit_the_width_with_every_word_whole(run: ModeRun,
                                                                             view: InvestigationView) -> None:
    inv = run.session.investigation
    long = f"{CAT}. [bold]the cat is grey[/bold]. there is a person next to it. it is in the snow at dawn by a lake."
    m1, m2 = mode_summaries(view)
    many = m1.model_copy(update={"caption": long, "findings": [m1.best, "f4", "f18", "f25", "f31"],
                                 "labels": ["chainlink fence"]})
    weak = m2.model_copy(update={"weak": True})
    text = piped(tables.findings_table(inv, modes=[many, weak]))
    assert max(map(len, text.splitlines())) <= tables.WIDTH
    assert "[bold]the" in text  # model text is printed as written, never read as markup
    wide = piped(tables.findings_table(inv, modes=[many, weak]), width=2000)

    def words(t: str) -> set[str]:
        return set(re.findall(r"[^\s─]+", t))
    assert words(text) <= words(wide) and "+4:" in text and "f31" in text


def test_json_lists_modes_with_their_claims_and_each_findings_mode(run: ModeRun, view: InvestigationView) -> None:
    modes = mode_summaries(view)
    out = summary(run.session, run.result, 1.0, modes)
    text = json.dumps(out, allow_nan=False)  # strict JSON
    back = json.loads(text)
    assert back["modes"] == [m.model_dump(mode="json") for m in modes]
    m1 = back["modes"][0]
    assert set(m1) >= {"mode_id", "idea", "labels", "best", "findings", "reasons", "confirmation", "baseline",
                       "ratio", "ratio_ci", "adjusted_p", "weak"}
    best = by_id(run)[m1["best"]]
    r = effect_of(best)
    assert (m1["confirmation"]["k"], m1["baseline"]["n"]) == (best.confirmation.hypothesis.k,
                                                              best.confirmation.baseline.n)
    assert m1["ratio"] == pytest.approx(r.ratio) and m1["ratio_ci"] == pytest.approx([r.low, r.high])
    assert m1["adjusted_p"] == best.confirmation.adjusted_p and m1["weak"] is False
    assert {f["finding_id"]: f["mode_id"] for f in back["findings"]} == {"f1": "m1", "f2": "m1", "f3": "m2"}


def test_live_view_and_replay_show_each_placement_in_one_line(run: ModeRun, capsys: pytest.CaptureFixture[str]) -> None:
    events = read_transcript(run.transcript)
    placed = [e for e in events if e.kind == "mode"]
    assert [(e.mode_id, e.finding_id) for e in placed] == [("m1", "f1"), ("m1", "f2"), ("m2", "f3")]
    lines = [piped(render_event(e)).strip() for e in placed]
    assert lines == ["mode m1 formed by f1: fails as snow leopard",
                     "mode m1: f2 joins — it holds every word of f1's caption",
                     "mode m2 formed by f3: fails as snow leopard"]
    assert main(["replay", str(run.transcript), "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert all(line in out for line in lines)


def test_the_ledger_lists_findings_by_mode_one_entry_each(run: ModeRun, view: InvestigationView) -> None:
    m1, _ = mode_summaries(view)
    text = ledger(view, budget=20_000)
    line = next(x for x in text.splitlines() if x.startswith("- recorded findings"))
    best = by_id(run)[m1.best]
    assert line == (f"- recorded findings (3) by failure mode (one cause, its best finding first): m1 {m1.best} "
                    f"{json.dumps(best.caption)} (phrasings: {', '.join(m1.phrasings)}); m2 f3 {json.dumps(HILL)}")


def test_chat_findings_show_the_modes_first(tmp_path: Path) -> None:
    from tests.test_chat import Harness

    h = Harness(tmp_path)
    screen = h.type(f"/measure n=200 {SNOW}", f"/measure n=200 confirm {SNOW}", "/record t1 t2 snow", "/findings",
                    "/quit")
    assert "mode m1 formed by f1" in screen  # the live line, as the runner places the finding
    assert screen.index("cat: 1 failure mode from 1 confirmed finding") < screen.index("cat: 1 confirmed finding")


def test_a_supported_test_whose_failures_read_as_a_mode_is_shown_as_that_mode(tmp_path: Path) -> None:
    """A tested candidate the planner left unconfirmed because it reads as a mode's phrasing is counted with that
    mode, and the other tests say so, instead of a supported test with no word on why it is no finding."""
    dusk = f"{CAT} in the snow at dusk."

    def caption_it(events: object) -> Turn:
        last = [e for e in events if getattr(e, "kind", "") == "tool_returned"][-1]  # type: ignore[attr-defined]
        return Turn(reasoning="Caption its failures.",
                    tool_calls=[call(71, "caption_failures", measurement_id=last.result["measurement_id"])])

    script = [*SCRIPT[:-1], Turn(reasoning="Test.", tool_calls=[call(70, "measure_rate", caption=dusk, max_n=200)]),
              caption_it, SCRIPT[-1]]
    session = new_session(fake_backends(), tmp_path / "run", budget=20_000)
    assert session.run(ScriptedPlanner(script)).status == "completed"
    view = InvestigationView.from_transcript(session.transcript)
    test = next(t for t in view.tests if t.caption == dusk)
    assert test.verdict == "supported" and test.test_id == "t7" and test.hypothesis is not None
    t7 = test.hypothesis.failures
    assert view.test_modes() == {"t7": "m1"}
    m1, m2 = mode_summaries(view)
    assert (m1.tests, m2.tests) == (["t7"], [])
    text = piped(tables.findings_table(session.investigation, modes=[m1, m2]))
    block = text[text.index("\nm1 "):text.index("\nm2 ")]
    assert _rows(text, r"m\d+ ")["m1"].rstrip().endswith("+1: f2; 1") and block.split()[-1] == "test"
    assert "supported, as m1" in _rows(text, r"t7 ")["t7"] and "'as m1': its failures read as" in text
    # The report lists it under its mode, and the JSON of the mode holds it.
    [report] = load_runs(session.run_dir)
    assert report.modes == [m1, m2]
    rows = [" ".join(" ".join(r).split()) for r in Dom(build_report(session.run_dir)).rows["modes"]]
    assert rows[0].startswith("m1 ") and rows[0].endswith(" 1 1 test")
    assert f"tested, its failures read as this cause, not confirmed on its own: {dusk} (t7, {t7.k}/{t7.n})" in rows[1]
