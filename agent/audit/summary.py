"""What an audit found: per-class summaries, the findings of all classes ranked, and the terminal tables.

Each class's summary holds its failure modes (``ModeSummary``, as ``investigate --json`` prints them, read from the
class's transcript) and each finding names its mode (``mode_id``); the tables count modes beside findings.

Findings (``FindingSummary``, the shape ``investigate --json`` prints too) are ranked by effect size (the discovery rate
ratio against the class baseline; an infinite ratio, a baseline without failures, ranks highest), then by the lower
end of its interval. Hypotheses supported on discovery seeds but not confirmed (``HypothesisSummary``) are listed
apart, ranked the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from sleuth.agent.audit.budget import cost_of, stopped_by
from sleuth.agent.events import Event, RunFinished
from sleuth.agent.mode_summary import mode_ids, mode_summaries
from sleuth.agent.replay.resume import Continued
from sleuth.agent.view import InvestigationView
from sleuth.tools.defaults import ALPHA
from sleuth.tools.findings import FindingSummary, HypothesisSummary
from sleuth.tools.investigation import Investigation, normalise_caption
from sleuth.tools.text import pv


def hypotheses(inv: Investigation) -> list[HypothesisSummary]:
    """Every discovery test of the class's family, with its evidence."""
    return [HypothesisSummary.of(inv.label, t.id, t.caption, t.kind, t.k1, t.n1, t.k0, t.n0, t.p_value, t.adjusted_p,
                                 t.verdict)
            for t in inv.tests if t.purpose == "discovery"]


def class_summary(label: str, slug: str, inv: Investigation, events: Sequence[Event], cont: Continued,
                  seconds: float) -> dict[str, Any]:
    finished = events[-1] if events and isinstance(events[-1], RunFinished) else None
    found = [FindingSummary.of(label, f) for f in inv.findings]
    modes = mode_summaries(InvestigationView.from_events(events))
    ids = mode_ids(modes)
    confirmed = {normalise_caption(f.caption) for f in found}
    tested = hypotheses(inv)
    # Supported by the family's final adjustment (a verdict is given when its test is run, before later tests
    # enlarge the family).
    candidates = [h for h in tested if h.kind == "rate" and h.adjusted_p <= inv.alpha
                  and normalise_caption(h.caption) not in confirmed]
    return {
        "class": label, "dir": slug,
        "status": finished.status if finished else "unfinished",
        "answer": finished.answer if finished else None,
        "stopped_by": stopped_by(events),
        "images": inv.budget.used, "image_budget": inv.budget.images,
        "seconds": round(seconds, 2), "cost_usd": round(cost_of(events), 6),
        "events": len(events), "turns": sum(e.kind == "planner_turn" for e in events),
        "hypotheses_tested": len(tested),
        "alpha": inv.alpha, "confirmations_declared": inv.max_confirmations,
        "modes": [m.model_dump(mode="json") for m in modes],
        "findings": [{**f.model_dump(mode="json"), "mode_id": ids.get(f.finding_id)} for f in found],
        "unconfirmed": [h.model_dump(mode="json") for h in candidates],
        "hypotheses": [h.model_dump(mode="json") for h in tested],
        "recovery": {"resumed": cont.recovered_events > 0 and not cont.already_finished,
                     "events_found": cont.recovered_events, "calls_rerun": cont.rerun_calls,
                     "calls_completed": cont.completed_calls,
                     "torn_line_moved_to": str(cont.torn_path) if cont.torn_path else None,
                     "torn_bytes": cont.torn_bytes,
                     # Every torn line any resume moved aside, kept on disk as evidence.
                     "torn_lines": [{"file": p.name, "bytes": p.stat().st_size}
                                    for p in sorted(cont.transcript.parent.glob(f"{cont.transcript.name}.torn-*"))]},
    }


def skipped_summary(label: str, slug: str, reason: str) -> dict[str, Any]:
    return {"class": label, "dir": slug, "status": "skipped", "answer": None, "stopped_by": reason, "images": 0,
            "image_budget": 0, "seconds": 0.0, "cost_usd": 0.0, "events": 0, "turns": 0, "hypotheses_tested": 0,
            "confirmations_declared": 0, "modes": [],
            "findings": [], "unconfirmed": [], "hypotheses": [], "recovery": None}


def _effect(ratio: float | None, ci: Sequence[float | None]) -> tuple[float, float]:
    return (-(ratio if ratio is not None else math.inf), -(ci[0] if ci[0] is not None else 0.0))


def ranked(classes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Confirmed findings of every class, surest large effect first: by the confirmation's headline bound (how much
    more often the caption fails at least), or the lower end of its rate ratio's interval where a transcript has no
    bound."""
    rows = [f for c in classes for f in c["findings"]]

    def low(f: dict[str, Any]) -> float:
        c = f["confirmation"]
        return c.get("at_least") or c["rate_ratio_ci"][0] or 0.0
    return sorted(rows, key=lambda f: (-low(f), f["label"], f["caption"]))


def ranked_unconfirmed(classes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = [h for c in classes for h in c["unconfirmed"]]
    return sorted(rows, key=lambda h: (*_effect(h["rate_ratio"], h["rate_ratio_ci"]), h["label"], h["caption"]))


def audit_summary(run_dir: str, config: dict[str, Any], classes: list[dict[str, Any]],
                  seconds: float) -> dict[str, Any]:
    statuses = {c["status"] for c in classes}
    status = "completed" if statuses <= {"completed", "budget_spent"} else ("budget" if "skipped" in statuses or any(
        c["stopped_by"] for c in classes) else "partial")
    findings = ranked(classes)
    alpha = float(config.get("alpha") or ALPHA)
    control = audit_family(findings, len(classes), alpha, [c.get("confirmations_declared") for c in classes])
    return {
        "run_dir": run_dir, "status": status, "config": config,
        "images": sum(c["images"] for c in classes), "seconds": round(seconds, 2),
        "cost_usd": round(sum(c["cost_usd"] for c in classes), 6),
        "audit_control": control,
        # The failure modes first, strongest bound first (each as its class summary has it, with its class).
        "modes": sorted((m for c in classes for m in c.get("modes") or []),
                        key=lambda m: (-(m.get("at_least") or 0.0), m["adjusted_p"], m["label"], m["mode_id"])),
        "classes": classes, "findings": findings, "unconfirmed": ranked_unconfirmed(classes),
    }


def audit_family(findings: list[dict[str, Any]], n_classes: int, alpha: float,
                 declared: Sequence[int | None] = ()) -> dict[str, Any]:
    """Mark each finding ``audit_significant`` under a family-wise error bound over the whole audit, and describe it.

    The family is every confirmation attempt the audit declared: each of the ``n_classes`` classes (skipped ones
    too: the class list is fixed when the audit starts) declares M_c attempts, each tested within its class at
    alpha / M_c. The audit gives each class alpha / n_classes, so attempt i of class c is audit-significant when its
    p-value is <= alpha / (n_classes * M_c), i.e. when ``audit_p`` = min(1, n_classes * adjusted_p) <= alpha. A
    confirmation's p-value is valid at every level (the sequential plan's overall p-value), so the union bound over
    the declared attempts, sum_c M_c * alpha / (n_classes * M_c) = alpha, bounds the chance that any audit-significant
    finding is false (family-wise error), whatever the planners did. Benjamini-Hochberg over the findings' adjusted p
    would not: they are each <= alpha by construction, so it marks every finding significant.
    """
    c = max(1, n_classes)
    for f in findings:
        f["audit_p"] = min(1.0, c * float(f["confirmation"]["adjusted_p"]))
        f["audit_significant"] = bool(f["audit_p"] <= alpha)
    known = [m for m in declared if m is not None]
    attempts = f"{sum(known)} declared confirmation attempts" if len(known) == len(declared) and known else (
        "every declared confirmation attempt")
    return {
        "error": "family-wise",
        "level": alpha,
        "family": f"{attempts} of the audit's {n_classes} classes",
        "method": (f"Bonferroni over classes: each class's confirmation family (attempts at alpha/M within the class) "
                   f"gets alpha/{c}; audit_p = min(1, {c} x adjusted_p)"),
        "statement": (f"the chance that any finding marked audit_significant is false is at most {alpha:g}, over "
                      f"{attempts} of all {n_classes} classes; a finding that is not audit_significant is confirmed "
                      f"within its class only (family-wise error {alpha:g} per class)"),
        "audit_significant": sum(f["audit_significant"] for f in findings),
    }


def _x(x: float | None) -> str:
    return "∞" if x is None else f"{x:.3g}"


def _kn(r: dict[str, Any]) -> str:
    return f"{r['k']}/{r['n']} [{100 * r['low']:.1f}–{100 * r['high']:.1f}%]"


def n_modes(summary: dict[str, Any]) -> int:
    """Failure modes of the audit's classes (a summary written before modes were recorded counts none)."""
    return sum(len(c.get("modes") or []) for c in summary["classes"])


def findings_table(summary: dict[str, Any]) -> Table:
    rows = [(f, True) for f in summary["findings"]] + [(h, False) for h in summary["unconfirmed"]]
    table = Table(title=f"Audit findings: {len(summary['findings'])} confirmed in {n_modes(summary)} failure "
                        f"mode{'s' * (n_modes(summary) != 1)}, {len(summary['unconfirmed'])} supported but "
                        f"unconfirmed ({len(summary['classes'])} classes, {summary['images']} images)")
    table.add_column("class", no_wrap=True)
    table.add_column("mode", no_wrap=True)
    table.add_column("hypothesis", overflow="fold", ratio=3)
    table.add_column("confirmed", no_wrap=True)
    for col in ("failures k/n [95% CI]", "baseline k/n [95% CI]", "rate ratio", "adj. p", "audit p"):
        table.add_column(col, overflow="fold", ratio=1)
    control = summary.get("audit_control")
    table.caption = ("rate ratio: a confirmed finding's ≥ bound (it fails at least this many times as often as its "
                     "class: the least ratio its confirmation's own test still rejects), else the ratio [95% CI]")
    if isinstance(control, dict):
        table.caption += f"; audit p: {control['method']}; {control['statement']}"
    for row, confirmed in rows:
        e = row["confirmation"] if confirmed else row  # a finding's effect is its confirmation's estimate
        ci = e["rate_ratio_ci"]
        number = (f"≥ {_x(e['at_least'])}×" if confirmed and e.get("at_least") is not None
                  else f"{_x(e['rate_ratio'])} [{_x(ci[0])}, {_x(ci[1])}]")
        table.add_row(row["label"], row.get("mode_id") or "–", Text(row["caption"]), "yes" if confirmed else "no",
                      _kn(e["hypothesis"]), _kn(e["baseline"]), number,
                      pv(e["adjusted_p"]), pv(row["audit_p"]) if "audit_p" in row else "–",
                      style=None if confirmed else "dim")
    return table


def modes_table(summary: dict[str, Any]) -> Table | None:
    """The audit's failure modes first: one row per mode of every class, strongest bound first, with its audit p
    (the best finding's confirmation over the audit's family); None when no class has a mode."""
    return modes_rows(summary.get("modes") or [m for c in summary["classes"] for m in c.get("modes") or []],
                      len(summary["classes"]))


def modes_rows(modes: list[dict[str, Any]], classes: int, title: str | None = None) -> Table | None:
    """Failure modes (``ModeSummary`` as JSON) of ``classes`` classes, one row each, strongest bound first, with
    the class and the audit p (the adjusted p times ``classes``) when there are several classes, or ``title``
    given as an audit's. None: no mode."""
    if not modes:
        return None
    audit = title is None
    modes = sorted(modes, key=lambda m: (-(m.get("at_least") or 0.0), m["adjusted_p"], m["label"], m["mode_id"]))
    table = Table(title=title or f"Audit failure modes: {len(modes)} in {classes} class{'es' * (classes != 1)}, "
                                 "strongest first", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False, collapse_padding=True)
    columns: list[tuple[str, dict[str, Any]]] = [
        *([("class", {"no_wrap": True})] if audit else []), ("mode", {"no_wrap": True}),
        ("what fails", {"ratio": 1, "min_width": 20}), ("fails as", {"max_width": 14}),
        ("confirmation k/n", {"no_wrap": True}), ("fails at least", {"no_wrap": True}),
        ("audit p" if audit else "adj. p", {"no_wrap": True, "justify": "right"}),
        ("findings", {"justify": "right"})]
    for col, kw in columns:
        table.add_column(col, overflow="fold", **kw)
    for m in modes:
        c, b = m["confirmation"], m["baseline"]
        bound = m.get("at_least")
        number = (f"≥ {_x(bound)}×" if bound is not None else f"{_x(m['ratio'])}×") + (" weak" if m["weak"] else "")
        p = min(1.0, max(1, classes) * float(m["adjusted_p"])) if audit else float(m["adjusted_p"])
        table.add_row(*([m["label"]] if audit else []), m["mode_id"], Text(m["caption"]),
                      (m.get("labels") or ["–"])[0], f"{c['k']}/{c['n']} vs {b['k']}/{b['n']}", number, pv(p),
                      str(len(m["findings"])))
    table.caption = ("A failure mode is one cause; its numbers are its best-evidenced finding's confirmation "
                     "(fails at least: times its class's failure rate)"
                     + (f"; audit p: its adjusted p times the audit's {classes} classes (audit-significant at or "
                        "below alpha). Every finding: --verbose, or summary.json." if audit else "."))
    table.caption_justify = "left"
    return table


def classes_table(summary: dict[str, Any]) -> Table:
    table = Table(title="Classes")
    for col in ("class", "status", "images", "seconds", "hypotheses", "modes", "findings", "note"):
        table.add_column(col, overflow="fold")
    for c in summary["classes"]:
        note = c["stopped_by"] or ""
        rec = c.get("recovery") or {}
        if rec.get("resumed"):
            note = (note + "; " if note else "") + f"resumed after {rec['events_found']} events"
            if rec.get("torn_line_moved_to"):
                note += f", torn line ({rec['torn_bytes']} bytes) moved aside"
        table.add_row(c["class"], c["status"], f"{c['images']}/{c['image_budget']}", f"{c['seconds']:.1f}",
                      str(c["hypotheses_tested"]), str(len(c.get("modes") or [])), str(len(c["findings"])), note)
    return table
