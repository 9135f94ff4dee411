"""The findings tables: failure modes first, then confirmed findings, then every other test; the rest are counted.

A failure mode (agent/modes.py) is one row with its one claim, its best-evidenced finding's confirmation, in the
words ``agent/mode_summary.py`` gives every view (a weak claim in words); its other findings are its phrasings.
Confirmed findings show their confirmation on fresh seeds (the effect corrected for selection where the
confirmation gives one), its adjusted p and whether counterfactual edits of the attribute caused failures: one row
per finding. Model-written text goes into ``Text`` cells, never through rich's markup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from sleuth.agent.mode_summary import (
    WEAK_MARK,
    ModeSummary,
    counts_text,
    effect_text,
    fails_as,
    is_weak,
    mode_ids,
    p_text,
    phrasings_text,
)
from sleuth.tools import stats
from sleuth.tools.findings import Evidence, Finding
from sleuth.tools.investigation import Investigation, Test
from sleuth.tools.text import num, pv, together

if TYPE_CHECKING:
    from sleuth.agent.mitigate import MitigationResult

WIDTH = 120
"""Columns of the output when it is not a terminal (a pipe, a file): wide enough that no table splits a word."""


def console(*, stderr: bool = False) -> Console:
    """The terminal's console; a fixed ``WIDTH`` when the output is a pipe or a file, so lines never wrap there."""
    c = Console(stderr=stderr, highlight=False)
    return c if c.is_terminal else Console(stderr=stderr, highlight=False, width=WIDTH)


def _rate(k: int, n: int) -> str:
    r = stats.binomial_rate(k, n)
    return f"{k}/{n} [{100 * r.low:.1f}–{100 * r.high:.1f}%]"


def _ratio(r: stats.RatioCI | None) -> str:
    return "n/a" if r is None else f"{num(r.ratio)}× [{num(r.low)}, {num(r.high)}]"


WEAK_WORDS = "weak: corrected for selection, the data do not say by how much more"


def bound_words(alpha: float) -> str:
    """How a table's caption explains the headline bound."""
    return ("fails at least: times the class's failure rate, the least ratio the confirmation's own exact test still "
            f"rejects (all of them hold together with {together(alpha)} probability)")


def _headline(c: Evidence) -> str:
    """A confirmation's one number: its bound (``≥ 2.61×``, then "weak" where the correction for selection leaves
    open by how much more), or its effect with interval where the transcript has no bound."""
    if c.bound is None:
        return _ratio(c.effect or c.rate_ratio)
    return f"≥ {num(c.bound)}×" + (f" {WEAK_MARK}" if is_weak(c.effect or c.rate_ratio) else "")


def short(caption: str, class_prompt: str) -> str:
    """The caption with the class prompt elided: the words that make the hypothesis stand out."""
    if caption.lower().startswith(class_prompt.lower()):
        rest = caption[len(class_prompt):].lstrip(". ").strip()
        return f"… {rest}" if rest else caption
    return caption


def _baseline(inv: Investigation) -> tuple[int, int]:
    b = inv.baselines.get("discovery")
    return (b.k, b.n) if b is not None else (0, 0)


def _test(inv: Investigation, tid: str) -> Test | None:
    return next((t for t in inv.tests if t.id == tid), None)


def edits_verdict(inv: Investigation, f: Finding) -> str:
    """Did editing the attribute into images cause failures (exact McNemar against control edits)? In one word."""
    cf = f.counterfactual
    if cf is None:
        return "not tested"
    t = _test(inv, cf.test_id)
    return t.verdict if t is not None and t.verdict else ("supported" if cf.adjusted_p < inv.alpha else "not supported")


def counterfactual_verdict(inv: Investigation, f: Finding) -> str:
    """The edits' verdict with its adjusted p."""
    verdict = edits_verdict(inv, f)
    return verdict if f.counterfactual is None else f"{verdict}, p {pv(f.counterfactual.adjusted_p)}"


def _table(title: str, *, narrow: bool = False) -> Table:
    # No vertical rules: the numbers keep their room, and a pipe gets plain aligned columns (``narrow``: two spaces
    # between them instead of three, for a table of many columns).
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                 collapse_padding=narrow)


def _s(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def modes_table(inv: Investigation, modes: Sequence[ModeSummary]) -> RenderableType | None:
    """One row per failure mode: what fails (its best finding), the label it fails as, its one claim, the best
    finding's counterfactual verdict, and its phrasings (None: no mode)."""
    if not modes:
        return None
    by_id = {f.finding_id: f for f in inv.findings}
    confirmed = sum(1 for f in inv.findings if f.confirmed)
    table = _table(f"{inv.label}: {_s(len(modes), 'failure mode')} from {_s(confirmed, 'confirmed finding')} "
                   f"(class baseline {_rate(*_baseline(inv))})", narrow=True)
    table.add_column("mode", no_wrap=True)
    # At most 96 columns besides "what fails" (gaps included), so the table fits WIDTH: a weak claim's words and a
    # long label wrap in their own narrow columns, and the numbers keep their room.
    table.add_column("what fails", ratio=1, overflow="fold", min_width=20)
    table.add_column("fails as", max_width=12)
    table.add_column("confirmation k/n", no_wrap=True)
    bounded = any(m.at_least is not None for m in modes)
    table.add_column("fails at least" if bounded else "ratio [95% CI]", max_width=18)
    table.add_column("adj. p", no_wrap=True, justify="right")
    table.add_column("edits", max_width=13)
    table.add_column("phrasings", max_width=12)
    for m in modes:
        best = by_id.get(m.best)
        table.add_row(m.mode_id, Text(f"{m.best} {short(m.caption, inv.class_prompt)}"), Text(fails_as(m)),
                      counts_text(m), Text(effect_text(m, interval=False)), p_text(m),
                      edits_verdict(inv, best) if best is not None else "not tested", phrasings_text(m))
    number = (f"{bound_words(inv.alpha)}; {WEAK_WORDS}" if bounded else
              "ratio corrected for selection; weak: its interval reaches 1")
    table.caption = ("A failure mode: the findings whose failures show one cause. Its numbers are its best-evidenced "
                     f"finding's confirmation on fresh seeds ({number}); edits: that finding's counterfactual edits "
                     "(their p in the findings table, -v); phrasings: the "
                     "mode's other findings, and its tests behind no finding ('as m…' in the other tests).")
    table.caption_justify = "left"
    return table


def confirmed_table(inv: Investigation, modes: Mapping[str, str] | None = None) -> RenderableType:
    """One row per confirmed finding: caption, confirmation counts, ratio with interval, adjusted p, edits, and the
    failure mode that holds it (``modes``: finding id -> mode id)."""
    findings = [f for f in inv.findings if f.confirmed]
    if not findings:
        return Text(f"{inv.label}: no confirmed finding (class baseline {_rate(*_baseline(inv))}).", style="bold")
    table = _table(f"{inv.label}: {_s(len(findings), 'confirmed finding')} "
                   f"(class baseline {_rate(*_baseline(inv))})")
    table.add_column("id", no_wrap=True)
    if modes:
        table.add_column("mode", no_wrap=True)
    table.add_column("finding", ratio=1, overflow="fold", min_width=24)
    table.add_column("confirmation k/n", no_wrap=True)
    bounded = any(f.confirmation.bound is not None for f in findings)
    table.add_column("fails at least" if bounded else "ratio [95% CI]")
    table.add_column("adj. p", no_wrap=True, justify="right")
    table.add_column("counterfactual edits")
    for f in findings:
        c = f.confirmation
        table.add_row(f.finding_id, *([modes.get(f.finding_id, "–")] if modes else []),
                      Text(short(f.caption, inv.class_prompt)),
                      f"{c.hypothesis.k}/{c.hypothesis.n} vs {c.baseline.k}/{c.baseline.n}",
                      _headline(c), pv(c.adjusted_p), counterfactual_verdict(inv, f))
    number = (f"{bound_words(inv.alpha)}; {WEAK_WORDS}" if bounded else
              "ratio: failure-rate ratio to the class, corrected for selection where the confirmation gives it")
    table.caption = (f"Confirmation on fresh seeds; {number}; adj. p: over {inv.max_confirmations} declared "
                     "confirmation attempts; counterfactual edits: exact McNemar against control edits.")
    table.caption_justify = "left"
    return table


def _kind(t: Test) -> str:
    if t.kind == "counterfactual":
        return "edits"
    return "confirm" if t.purpose == "confirmation" else "discover"


def other_tests_table(inv: Investigation, *, show_all: bool = False,
                      reads_as: Mapping[str, str] | None = None) -> RenderableType | None:
    """Every test not behind a confirmed finding: supported and inconclusive ones (all with ``show_all``);
    ``reads_as``: test id -> the failure mode whose phrasing its failures read as."""
    reads_as = reads_as or {}
    used = {e.test_id for f in inv.findings if f.confirmed
            for e in (f.discovery, f.confirmation, f.counterfactual) if e is not None}
    rest = [t for t in inv.tests if t.id not in used]
    shown = [t for t in rest if show_all or t.verdict in ("supported", "inconclusive")]
    shown.sort(key=lambda t: (t.verdict != "supported", t.adjusted_p))
    hidden = len(rest) - len(shown)
    note = Text(f"{hidden} other test{'s' * (hidden != 1)} not supported (see the transcript).", style="dim")
    if not shown:
        return note if hidden else None
    table = _table(f"Other tests ({len(shown)}{f' of {len(rest)}' if hidden else ''}): not confirmed findings")
    table.add_column("test", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("hypothesis", ratio=1, overflow="fold", min_width=24)
    table.add_column("failures k/n [95% CI]")
    table.add_column("ratio [95% CI]")
    table.add_column("adj. p", no_wrap=True, justify="right")
    table.add_column("verdict")
    for t in shown:
        table.add_row(t.id, _kind(t), Text(short(t.caption, inv.class_prompt)), _rate(t.k1, t.n1),
                      _ratio(stats.rate_ratio(t.k1, t.n1, t.k0, t.n0)), pv(t.adjusted_p),
                      f"{t.verdict}, as {reads_as[t.id]}" if t.id in reads_as else t.verdict)
    table.caption = (f"p {inv.adjust_method}-adjusted within its family (discovery: "
                     f"{sum(t.purpose == 'discovery' for t in inv.tests)} tests, confirmation attempts at "
                     f"alpha/{inv.max_confirmations}); ratios of discovery tests are selected, so biased upwards."
                     + "".join(f" 'as {m}': its failures read as another phrasing of failure mode {m}, whose claim "
                               "stands for it (not confirmed on its own)."
                               for m in [reads_as[t.id] for t in shown if t.id in reads_as][:1]))
    table.caption_justify = "left"
    return Group(table, note) if hidden else table


def verdict_counts(inv: Investigation, modes: Sequence[ModeSummary]) -> Text:
    """The run's tests counted by kind and verdict, and its findings by mode, on one line."""
    def count(purpose: str | None) -> tuple[int, int]:
        """Rate tests of ``purpose``; None: counterfactual tests (of either purpose)."""
        tests = [t for t in inv.tests if (t.kind == "counterfactual" if purpose is None else
                                          t.kind != "counterfactual" and t.purpose == purpose)]
        return len(tests), sum(t.verdict == "supported" for t in tests)

    (d, ds), (c, cs), (e, es) = count("discovery"), count("confirmation"), count(None)
    confirmed = sum(f.confirmed for f in inv.findings)
    return Text(f"Tests: {d} discovery ({ds} supported), {_s(c, 'confirmation attempt')} ({cs} supported), "
                f"{e} counterfactual ({es} supported). {_s(confirmed, 'confirmed finding')} in "
                f"{_s(len(modes), 'failure mode')}.")


def end_screen(inv: Investigation, modes: Sequence[ModeSummary]) -> RenderableType:
    """What a run ends with: its failure modes (or that nothing was confirmed) and its tests counted by verdict."""
    first = modes_table(inv, modes) or confirmed_table(inv)
    return Group(first, Text(""), verdict_counts(inv, modes))


def findings_table(inv: Investigation, *, show_all: bool = False,
                   modes: Sequence[ModeSummary] | None = None) -> RenderableType:
    """The failure modes (``modes``, read from the transcript's view), the confirmed findings, then the other
    tests."""
    first = modes_table(inv, modes or [])
    other = other_tests_table(inv, show_all=show_all, reads_as={t: m.mode_id for m in modes or [] for t in m.tests})
    return Group(*([first, Text("")] if first is not None else []), confirmed_table(inv, mode_ids(modes or [])),
                 *([Text(""), other] if other is not None else []))


def mitigation_tables(result: MitigationResult) -> list[RenderableType]:
    """A mitigation's findings (before and after on the same fresh images), class baselines and accuracy."""
    table = Table(title=f"mitigation of {result.classifier_before}: "
                        f"{'effective' if result.effective else 'not shown effective'}", title_justify="left")
    table.add_column("finding", ratio=3, overflow="fold")
    for col in ("before k/n [95% CI]", "after k/n [95% CI]", "after/before [95% CI]", "adj. p better",
                "adj. p worse", "verdict"):
        table.add_column(col, justify="right" if "p " in col else "left")
    for o in result.findings:
        r = o.rates
        name = f"{o.label}:{o.finding_id}{'' if o.mitigated_here else ' (not trained on)'} {o.caption}"
        table.add_row(Text(name), _rate(r.before.k, r.before.n), _rate(r.after.k, r.after.n),
                      f"{r.ratio.ratio:.2f} [{r.ratio.low:.2f}–{r.ratio.high:.2f}]", pv(r.adjusted_p_better),
                      pv(r.adjusted_p_worse), o.verdict)
    table.add_section()
    for b in result.baselines:
        table.add_row(Text(f"{b.label}: class baseline"), _rate(b.before.k, b.before.n), _rate(b.after.k, b.after.n),
                      f"{b.ratio.ratio:.2f} [{b.ratio.low:.2f}–{b.ratio.high:.2f}]", "", pv(b.adjusted_p_worse),
                      "worse" if (b.adjusted_p_worse or 1.0) < result.config.get("alpha", 0.05) else "")
    acc = result.accuracy.test
    ci = acc.interval
    text = Text(f"top-1 accuracy over {result.accuracy.classes} classes ({result.accuracy.n_per_class} fresh images "
                f"each): {100 * ci.before.rate:.2f}% → {100 * ci.after.rate:.2f}%, difference "
                f"{100 * ci.difference:+.2f} points, one-sided {100 * (1 - acc.alpha):.0f}% lower bound "
                f"{100 * ci.low:+.2f}: non-inferiority at −{100 * acc.margin:.1f} point(s) "
                f"{'shown' if acc.shown else 'NOT shown'}")
    return [table, text]
