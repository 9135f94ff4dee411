"""The discovery benchmark's results as rich tables (the command line's readable output)."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table


def _rate(r: dict[str, Any] | None) -> str:
    if not r or r.get("rate") is None:
        return "–"
    lo, hi = r["ci"]
    return f"{r['k']}/{r['n']} = {100 * r['rate']:.0f}% [{100 * lo:.0f}–{100 * hi:.0f}]"


def _q(q: dict[str, Any], scale: float = 1.0, unit: str = "") -> str:
    if q.get("median") is None:
        return "–"
    return f"{q['median'] / scale:,.1f}{unit} ({q['p90'] / scale:,.1f}{unit})"


def discovery_table(out: dict[str, Any]) -> Group:
    worlds = out["worlds"]
    planted = sum(len(w["classes"]) - len(w["bug_free_classes"]) for w in worlds)
    free = sum(len(w["bug_free_classes"]) for w in worlds)
    title = (f"Planted-bug discovery: {len(worlds)} world(s), {planted} classes with planted bugs"
             f"{f', {free} without' if free else ''}, seeds {','.join(map(str, out['seeds']))}, "
             f"budget {out['budget']:,} images per class")
    main = Table(title=title, caption="A finding is real when the oracle's 95% interval for its failure-rate ratio "
                                      "lies above 1.2x; false: confirmed but not real. Medians (90th percentiles).")
    low = (out.get("strength_bands") or [2.0])[0]
    for col in ("planner", "recall [95% CI]", f"recall, bugs ≥{low:g}x", "false findings", "false on bug-free classes",
                "images / class: median (p90)", "s / class", "images until confirmed", "same, bugs ≥10x"):
        main.add_column(col, justify="left" if col == "planner" else "right")
    for name, r in out["planners"].items():
        free_r = r["bug_free_classes"]
        main.add_row(name, _rate(r["recall"]), _rate(r["recall_measurable"]),
                     f"{r['false_confirmed']}/{r['confirmed_findings']}",
                     f"{free_r['false']}/{free_r['confirmed']} in {free_r['runs']} runs" if free_r["runs"] else "–",
                     _q(r["images_per_class"], 1000, "k"), _q(r["seconds_per_class"]),
                     _q(r["images_until_confirmed"], 1000, "k"),
                     _q(r.get("images_until_confirmed_strong") or {}, 1000, "k"))
    bands = [b for b in _bands(out) if any(b in r["recall_by_strength"] for r in out["planners"].values())]
    budgets = [c["budget"] for c in next(iter(out["planners"].values()))["recall_vs_budget"]] if out["planners"] else []
    detail = Table(title="Recall by strength (oracle ratio) and by images used",
                   caption="n/a: more images than the runs' budget.")
    detail.add_column("planner")
    for b in bands:
        detail.add_column(b, justify="right")
    for b in budgets:
        detail.add_column(f"≤{b // 1000}k images", justify="right")
    for name, r in out["planners"].items():
        curve = [_rate(c) if c["measured"] else "n/a" for c in r["recall_vs_budget"]]
        detail.add_row(name, *(_rate(r["recall_by_strength"].get(b)) for b in bands), *curve)
    parts: list[Table] = [main, detail]
    if any(r.get("modes", {}).get("modes") for r in out["planners"].values()):
        parts.append(modes_table(out))
    if any(r.get("misses", {}).get("learned") for r in out["planners"].values()):
        parts.append(misses_table(out))
    return Group(*parts)


def modes_table(out: dict[str, Any]) -> Table:
    """Per planner, its failure modes scored against the worlds: purity and redundancy (agent/bench/modes.py)."""
    t = Table(title="Failure modes against the worlds' ground truth",
              caption="Pure: every finding of the mode names one attribute value (as the world's parser reads its "
                      "caption). Redundancy: modes per distinct cause found (1.0: one mode a cause). Phrasings: "
                      "findings beyond the first of their mode.")
    for col in ("planner", "findings", "modes", "modes / class: median (mean)", "pure", "distinct causes",
                "redundancy", "phrasings"):
        t.add_column(col, justify="left" if col == "planner" else "right")
    for name, r in out["planners"].items():
        m = r.get("modes") or {}
        if not m.get("modes"):
            continue
        t.add_row(name, f"{r['confirmed_findings']:,}", f"{m['modes']:,}",
                  f"{m['modes_per_class_median']:g} ({m['modes_per_class_mean']:.1f})",
                  f"{m['pure']}/{m['modes']} = {100 * m['purity']:.1f}%", f"{m['distinct_causes']:,}",
                  f"{m['redundancy']:.2f}", f"{m['phrasings']:,}")
    return t


def misses_table(out: dict[str, Any]) -> Table:
    """Per planner, how far each planted bug the classifier learned (oracle ratio >= 2x) got."""
    from sleuth.agent.bench.misses import LEARNED, STAGES

    rows = {name: r["misses"] for name, r in out["planners"].items() if r.get("misses", {}).get("learned")}
    stages = [s for s in STAGES if any(m["stages"].get(s) for m in rows.values())]
    t = Table(title=f"Where the planted bugs the classifier learned (oracle ≥ {LEARNED:g}x) were found or lost",
              caption="The furthest stage each bug reached in its run, read from the transcript. Screened, not "
                      "tested: the pooled screen made 2x the baseline 90% likely; waited behind a mode's "
                      "phrasings: 99% likely while the run confirmed phrasings of causes it had found. Not "
                      "learned: the oracle "
                      f"measures the bug below {LEARNED:g}x (found among them in brackets).")
    t.add_column("planner")
    t.add_column("learned", justify="right")
    for s in stages:
        t.add_column(s, justify="right")
    t.add_column("not learned", justify="right")
    for name, m in rows.items():
        t.add_row(name, str(m["learned"]), *(str(m["stages"].get(s, 0)) for s in stages),
                  f"{m['not_learned']} ({m['not_learned_found']})")
    return t


def _bands(out: dict[str, Any]) -> list[str]:
    from sleuth.agent.bench.metrics import band_order

    return band_order(out.get("strength_bands") or (2.0, 5.0, 10.0, 20.0))


def calibration_table(out: dict[str, Any]) -> Table:
    """One row per planner and kind of classifier: how often a null hypothesis got through each stage."""
    t = Table(title=f"Calibration on world {out['world']}: {out['runs_per_planner_and_kind']} runs per planner and "
                    f"classifier, budget {out['budget']:,} images; runs in which a null hypothesis got through "
                    f"(95% CI), target ≤ {100 * out['alpha']:.0f}% for confirmation and finding",
              title_justify="left")
    for col in ("planner", "classifier", "discovery (screen)", "confirmation", "finding", "real finding",
                "audits of 12: audit-significant", "images/run"):
        t.add_column(col, justify="left" if col in ("planner", "classifier") else "right")
    for planner, per in out["planners"].items():
        for kind, v in per.items():
            real = _rate(v.get("runs_with_a_real_finding")) if kind == "partial-null" else "–"
            audits = _rate(v["audits"]["audit_significant"]) if v.get("audits") else "–"
            t.add_row(planner, kind, _rate(v["discovery"]), _rate(v["confirmation"]), _rate(v["finding"]), real,
                      audits, f"{v['images_per_run']:,}")
    t.caption = ("held: every confirmation and finding rate ≤ alpha" if out["held"] else
                 "NOT HELD: a confirmation or finding rate exceeds alpha")
    return t


def compare_table(out: dict[str, Any], a: str, b: str) -> Table:
    """Two benchmarks side by side (agent/bench/compare.py): recall on each side and the bugs only one found."""
    t = Table(title=f"A = {a} ({out['planner_a']}) against B = {b} ({out['planner_b']}): {out['paired_bugs']} planted "
                    "bugs paired", title_justify="left",
              caption="Only A / only B: bugs found on one side and not the other (exact McNemar p, two-sided). "
                      "'by N': a real finding naming the bug was recorded within N images.")
    for col in ("bugs", "within", "A", "B", "only A", "only B", "McNemar p"):
        t.add_column(col, justify="left" if col in ("bugs", "within") else "right")
    for name, g in out["groups"].items():
        for when, v in g.items():
            if when == "bugs":
                continue
            t.add_row(f"{name} ({g['bugs']})", "the run" if when == "all" else when, _rate(v["a"]), _rate(v["b"]),
                      str(len(v["only_a"])), str(len(v["only_b"])), f"{v['mcnemar_p']:.2g}")
    return t
