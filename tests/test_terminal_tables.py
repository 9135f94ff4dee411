"""The terminal's findings tables: confirmed findings only in the first, one row each, with the confirmation's ratio
and adjusted p as documented, the counterfactual verdict as a column; other tests apart; no wrapped words in a pipe."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from sleuth.agent.planners.protocol_v1 import ProtocolV1Planner
from sleuth.agent.session import Session
from sleuth.agent.terminal import tables
from sleuth.agent.terminal.render import render_event
from sleuth.agent.transcript import read_transcript
from sleuth.tools.findings import Finding
from tests.fakeworld import fake_backends, new_session

CAT = "a realistic photograph of a cat"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Session:
    """The protocol planner on the fake world: one confirmed finding (snow) with counterfactual edits."""
    session = new_session(fake_backends(), tmp_path_factory.mktemp("runs") / "cat", budget=20_000)
    assert session.run(ProtocolV1Planner("cat", CAT, baseline_n=1000)).status == "completed"
    return session


def piped(renderable: object, width: int = tables.WIDTH) -> str:
    """What a pipe or a file receives: no terminal, a fixed width."""
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=False, highlight=False).print(renderable)
    return buf.getvalue()


def sections(text: str) -> tuple[str, str]:
    """The confirmed-findings table and the rest (the other tests)."""
    head, _, rest = text.partition("Other tests")
    return head, rest


def test_confirmed_table_has_one_row_per_finding_with_its_confirmation(run: Session) -> None:
    inv = run.investigation
    [f] = inv.findings
    assert f.counterfactual is not None  # the protocol planner edits before it records
    confirmed, other = sections(piped(tables.findings_table(inv)))
    assert "1 confirmed finding" in confirmed and "in the snow" in confirmed
    rows = [line for line in confirmed.splitlines() if line.startswith(f.finding_id + " ")]
    assert len(rows) == 1  # one row: no second row for the finding's counterfactual test
    c = f.confirmation
    # The confirmation's headline bound (not a ratio of the discovery's), its counts and the counterfactual verdict,
    # on the one row.
    assert f"{c.hypothesis.k}/{c.hypothesis.n} vs {c.baseline.k}/{c.baseline.n}" in rows[0]
    assert c.bound is not None and c.bound >= 1 and f"≥ {c.bound:.3g}×" in rows[0] and "fails at least" in confirmed
    assert f"{f.discovery.rate_ratio.ratio:.3g}×" not in rows[0]
    cf = next(t for t in inv.tests if t.id == f.counterfactual.test_id)
    assert f"{cf.verdict}, p " in rows[0]
    # Every test behind the finding stays out of the second table; the others are there or counted.
    behind = {f.discovery.test_id, f.confirmation.test_id, f.counterfactual.test_id}
    listed = set(re.findall(r"^(t\d+) ", other, flags=re.M))
    assert listed and not listed & behind
    hidden = int(re.search(r"(\d+) other tests? not supported", other).group(1))  # type: ignore[union-attr]
    assert len(listed) + hidden == len(inv.tests) - len(behind)


def test_p_values_print_as_documented(run: Session) -> None:
    inv = run.investigation
    f = inv.findings[0]
    tiny = f.model_copy(update={"confirmation": f.confirmation.model_copy(update={"adjusted_p": 9.3e-23})})
    inv.findings[0] = tiny
    try:
        text = piped(tables.confirmed_table(inv))
    finally:
        inv.findings[0] = f
    assert "< 1e-06" in text and "e-23" not in text


def test_piped_output_keeps_every_line_within_the_width_and_every_word_whole(run: Session) -> None:
    inv = run.investigation
    f = inv.findings[0]
    long = f"{CAT}. [bold]the cat is grey[/bold]. there is a person next to it. it is in the snow at dawn by a lake."
    inv.findings.append(Finding.model_validate({**f.model_dump(), "finding_id": "f9", "caption": long}))
    try:
        text = piped(tables.findings_table(inv, show_all=True))
    finally:
        inv.findings.pop()
    lines = text.splitlines()
    assert lines and max(map(len, lines)) <= tables.WIDTH
    # Markup in model text is printed as written, not interpreted.
    assert "[bold]the" in text
    # No word is split across lines: every word printed is a word of the same tables printed with room to spare.
    inv.findings.append(Finding.model_validate({**f.model_dump(), "finding_id": "f9", "caption": long}))
    try:
        wide = piped(tables.findings_table(inv, show_all=True), width=2000)
    finally:
        inv.findings.pop()
    assert max(map(len, wide.splitlines())) > tables.WIDTH  # the tables would not fit in one line of WIDTH
    def words(t: str) -> set[str]:
        return set(re.findall(r"[^\s─]+", t))
    assert words(text) <= words(wide)


def test_the_console_is_fixed_width_when_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    c = tables.console()
    assert not c.is_terminal and c.width == tables.WIDTH


def test_a_finding_prints_once_in_the_live_view(run: Session) -> None:
    events = read_transcript(Path(run.transcript))
    out = "".join(piped(r) for r in map(render_event, events) if r is not None)
    for f in run.investigation.findings:
        assert out.count(f"finding {f.finding_id}: ") == 1, f.finding_id
