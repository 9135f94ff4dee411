"""What an audit found: per-class summaries, the findings of all classes ranked, and the terminal table.

Findings are ranked confirmed first, then by effect size (the rate ratio against the class baseline; an infinite
ratio, a baseline without failures, ranks highest), then by the lower end of its interval. Hypotheses supported on
discovery seeds that were not confirmed are listed after the confirmed ones, marked as such.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from sleuth.agent.audit_budget import cost_of, stopped_by
from sleuth.agent.events import Event, RunFinished
from sleuth.agent.resume import Continued
from sleuth.tools import stats
from sleuth.tools.investigation import Investigation, normalise_caption


def _num(x: Any) -> float | None:
    """JSON has no infinity: non-finite numbers are written as null."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _rate(k: int, n: int) -> dict[str, Any]:
    r = stats.binomial_rate(k, n)
    return {"k": k, "n": n, "low": _num(r.low), "high": _num(r.high)}


def _finding(label: str, f: dict[str, Any]) -> dict[str, Any]:
    d, c, cf = f["discovery"], f["confirmation"], f.get("counterfactual")
    return {
        "class": label, "caption": f["caption"], "confirmed": bool(f["confirmed"]), "finding_id": f["finding_id"],
        "rate_ratio": _num(d["rate_ratio"]["ratio"]),
        "rate_ratio_ci": [_num(d["rate_ratio"]["low"]), _num(d["rate_ratio"]["high"])],
        "adjusted_p": _num(d["adjusted_p"]),
        "hypothesis": _rate(d["hypothesis"]["k"], d["hypothesis"]["n"]),
        "baseline": _rate(d["baseline"]["k"], d["baseline"]["n"]),
        "confirmation": {"hypothesis": _rate(c["hypothesis"]["k"], c["hypothesis"]["n"]),
                         "baseline": _rate(c["baseline"]["k"], c["baseline"]["n"]),
                         "adjusted_p": _num(c["adjusted_p"]), "rate_ratio": _num(c["rate_ratio"]["ratio"])},
        "counterfactual": None if cf is None else {"k": cf["hypothesis"]["k"], "n": cf["hypothesis"]["n"],
                                                   "p_value": _num(cf["p_value"])},
        "summary": f.get("summary", ""),
    }


def hypotheses(inv: Investigation) -> list[dict[str, Any]]:
    """Every discovery test of the class's family, with its evidence."""
    out = []
    for t in inv.tests:
        if t.purpose != "discovery":
            continue
        rr = stats.rate_ratio(t.k1, t.n1, t.k0, t.n0)
        out.append({"test_id": t.id, "caption": t.caption, "kind": t.kind, "hypothesis": _rate(t.k1, t.n1),
                    "baseline": _rate(t.k0, t.n0), "rate_ratio": _num(rr.ratio),
                    "rate_ratio_ci": [_num(rr.low), _num(rr.high)], "p_value": _num(t.p_value),
                    "adjusted_p": _num(t.adjusted_p), "verdict": t.verdict})
    return out


def class_summary(label: str, slug: str, inv: Investigation, events: Sequence[Event], cont: Continued,
                  seconds: float) -> dict[str, Any]:
    finished = events[-1] if events and isinstance(events[-1], RunFinished) else None
    found = [_finding(label, f) for f in inv.findings]
    confirmed = {normalise_caption(f["caption"]) for f in found}
    candidates = [{"class": label, "caption": h["caption"], "confirmed": False, "rate_ratio": h["rate_ratio"],
                   "rate_ratio_ci": h["rate_ratio_ci"], "adjusted_p": h["adjusted_p"],
                   "hypothesis": h["hypothesis"], "baseline": h["baseline"]}
                  for h in hypotheses(inv)
                  # Supported by the family's final adjustment (a verdict is given when its test is run, before
                  # later tests enlarge the family).
                  if h["kind"] == "rate" and h["adjusted_p"] is not None and h["adjusted_p"] <= inv.alpha
                  and normalise_caption(h["caption"]) not in confirmed]
    return {
        "class": label, "dir": slug,
        "status": finished.status if finished else "unfinished",
        "answer": finished.answer if finished else None,
        "stopped_by": stopped_by(events),
        "images": inv.budget.used, "image_budget": inv.budget.images,
        "seconds": round(seconds, 2), "cost_usd": round(cost_of(events), 6),
        "events": len(events), "turns": sum(e.kind == "planner_turn" for e in events),
        "hypotheses_tested": sum(t.purpose == "discovery" for t in inv.tests),
        "findings": found, "unconfirmed": candidates, "hypotheses": hypotheses(inv),
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
            "findings": [], "unconfirmed": [], "hypotheses": [], "recovery": None}


def _effect_key(f: dict[str, Any]) -> tuple[Any, ...]:
    ratio = f["rate_ratio"] if f["rate_ratio"] is not None else math.inf
    low = f["rate_ratio_ci"][0] if f["rate_ratio_ci"][0] is not None else 0.0
    return (not f["confirmed"], -ratio, -low, f["class"], f["caption"])


def ranked(classes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Confirmed findings and unconfirmed supported hypotheses of every class, confirmed first, largest effect first."""
    rows = [f for c in classes for f in [*c["findings"], *c["unconfirmed"]]]
    return sorted(rows, key=_effect_key)


def audit_summary(run_dir: str, config: dict[str, Any], classes: list[dict[str, Any]],
                  seconds: float) -> dict[str, Any]:
    statuses = {c["status"] for c in classes}
    status = "completed" if statuses <= {"completed"} else ("budget" if "skipped" in statuses or any(
        c["stopped_by"] for c in classes) else "partial")
    return {
        "run_dir": run_dir, "status": status, "config": config,
        "images": sum(c["images"] for c in classes), "seconds": round(seconds, 2),
        "cost_usd": round(sum(c["cost_usd"] for c in classes), 6),
        "classes": classes, "findings": ranked(classes),
    }


def _ratio(f: dict[str, Any]) -> str:
    def n(x: float | None) -> str:
        return "∞" if x is None else f"{x:.3g}"
    return f"{n(f['rate_ratio'])} [{n(f['rate_ratio_ci'][0])}, {n(f['rate_ratio_ci'][1])}]"


def _kn(r: dict[str, Any]) -> str:
    return f"{r['k']}/{r['n']} [{100 * (r['low'] or 0):.1f}–{100 * (r['high'] or 0):.1f}%]"


def findings_table(summary: dict[str, Any]) -> Table:
    rows = summary["findings"]
    n_conf = sum(f["confirmed"] for f in rows)
    table = Table(title=f"Audit findings: {n_conf} confirmed, {len(rows) - n_conf} supported but unconfirmed "
                        f"({len(summary['classes'])} classes, {summary['images']} images)")
    table.add_column("class", no_wrap=True)
    table.add_column("hypothesis", overflow="fold", ratio=3)
    table.add_column("confirmed", no_wrap=True)
    for col in ("failures k/n [95% CI]", "baseline k/n [95% CI]", "rate ratio [95% CI]", "adj. p"):
        table.add_column(col, overflow="fold", ratio=1)
    for f in rows:
        p = f["adjusted_p"]
        table.add_row(f["class"], f["caption"], "yes" if f["confirmed"] else "no", _kn(f["hypothesis"]),
                      _kn(f["baseline"]), _ratio(f), "n/a" if p is None else f"{p:.2g}",
                      style=None if f["confirmed"] else "dim")
    return table


def classes_table(summary: dict[str, Any]) -> Table:
    table = Table(title="Classes")
    for col in ("class", "status", "images", "seconds", "hypotheses", "findings", "note"):
        table.add_column(col, overflow="fold")
    for c in summary["classes"]:
        note = c["stopped_by"] or ""
        rec = c.get("recovery") or {}
        if rec.get("resumed"):
            note = (note + "; " if note else "") + f"resumed after {rec['events_found']} events"
            if rec.get("torn_line_moved_to"):
                note += f", torn line ({rec['torn_bytes']} bytes) moved aside"
        table.add_row(c["class"], c["status"], f"{c['images']}/{c['image_budget']}", f"{c['seconds']:.1f}",
                      str(c["hypotheses_tested"]), str(len(c["findings"])), note)
    return table
