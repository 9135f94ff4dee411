"""Two benchmark runs side by side, bug by bug: which planted bugs each found, by how many images, and whether the
difference is more than one seed's noise.

Each side is a ``sleuth bench discovery`` result: its ``--json`` output, or its ``--out`` folder (the per-class result
files). Bugs are paired by (world, class, bug); a side's planner is chosen by name. The comparison reports, over the
bugs the classifier learned (the oracle measures them at ``LEARNED`` x or more) and those at 5x or more:

- recall on each side and the discordant pairs, with the exact McNemar test (two-sided binomial on the discordant
  pairs);
- recall within each of ``by`` images (a bug counts when a real finding naming it was recorded by then), and the bugs
  found by ``by`` images on one side only. Two runs of one planner given different budgets that find the same bugs by
  N images are *anytime* up to N: what they find does not depend on how many images they were given.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scipy import stats as sps

from sleuth.agent.bench.metrics import rate_with_ci
from sleuth.agent.bench.misses import LEARNED

STRONG_BAND = 5.0


def load_runs(path: str | Path) -> list[dict[str, Any]]:
    """The runs of a benchmark: its ``--json`` output file or its ``--out`` folder."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*/results/*/*.json"))
        if not files:
            raise ValueError(f"{p}: no benchmark results (expected <world>/results/<class>/<planner>-s<seed>.json)")
        return [json.loads(f.read_text()) for f in files]
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{p}: not a benchmark's --json output ({e})") from None
    if not isinstance(data, dict) or "runs" not in data:
        raise ValueError(f"{p}: not a benchmark's --json output (no 'runs')")
    return list(data["runs"])


def bug_rows(runs: Sequence[dict[str, Any]], planner: str) -> dict[tuple[str, str, str, int], dict[str, Any]]:
    """Each planted bug of ``planner``'s runs: its oracle ratio, whether found and when, its stage."""
    out = {}
    for r in runs:
        if r["planner"] != planner:
            continue
        for b in r["bugs"]:
            hits = [f.get("images_until") for f in r["findings"] if f.get("bug") == b["name"]]
            times = [t for t in hits if t is not None]
            out[(r["world"], r["label"], b["name"], r.get("seed", 0))] = {
                "ratio": b["oracle"]["ratio"], "found": bool(hits), "images_until": min(times) if times else None,
                "stage": (b.get("outcome") or {}).get("stage"), "budget": r.get("settings", {}).get("budget")}
    return out


def planners_of(runs: Sequence[dict[str, Any]]) -> list[str]:
    return sorted({r["planner"] for r in runs})


def mcnemar(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value for ``b`` and ``c`` discordant pairs."""
    return float(sps.binomtest(b, b + c, 0.5).pvalue) if b + c else 1.0


def _found_by(row: dict[str, Any], n: int | None) -> bool:
    return row["found"] and (n is None or (row["images_until"] is not None and row["images_until"] <= n))


def compare(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], planner_a: str, planner_b: str,
            by: Sequence[int] = (3_000, 5_000)) -> dict[str, Any]:
    """The comparison of the module's docstring, as plain numbers and bug names."""
    ra, rb = bug_rows(a, planner_a), bug_rows(b, planner_b)
    keys = sorted(set(ra) & set(rb))
    out: dict[str, Any] = {"planner_a": planner_a, "planner_b": planner_b, "paired_bugs": len(keys),
                           "unpaired": len(set(ra) ^ set(rb)), "groups": {}}
    groups = {f"learned (>= {LEARNED:g}x)": LEARNED, f">= {STRONG_BAND:g}x": STRONG_BAND}
    for name, low in groups.items():
        mine = [k for k in keys if (ra[k]["ratio"] or 0) >= low]
        group: dict[str, Any] = {"bugs": len(mine)}
        for n in [None, *by]:
            fa = [k for k in mine if _found_by(ra[k], n)]
            fb = [k for k in mine if _found_by(rb[k], n)]
            only_a = sorted(set(fa) - set(fb))
            only_b = sorted(set(fb) - set(fa))
            group["all" if n is None else f"by {n}"] = {
                "a": rate_with_ci(len(fa), len(mine)), "b": rate_with_ci(len(fb), len(mine)),
                "only_a": [_name(k) for k in only_a], "only_b": [_name(k) for k in only_b],
                "mcnemar_p": mcnemar(len(only_a), len(only_b)), "same": not only_a and not only_b}
        out["groups"][name] = group
    return out


def steps(transcript: str | Path) -> list[tuple[int, str, Any, Any]]:
    """A run's tool calls in order: (images used before it, tool, arguments, result), and its findings' and modes'
    records, for comparing what two runs did."""
    from sleuth.agent.transcript import read_transcript

    out: list[tuple[int, str, Any, Any]] = []
    calls: dict[str, Any] = {}
    used = 0
    for e in read_transcript(transcript):
        if e.kind == "tool_called":
            calls[e.call_id] = e.arguments
        elif e.kind == "tool_returned":
            out.append((used, e.name, calls.get(e.call_id), e.result if e.ok else e.error))
            used += e.images_used
        elif e.kind in ("finding", "mode"):
            out.append((used, e.kind, e.model_dump(mode="json", exclude={"seq", "ts", "hash", "prev_hash"}), None))
    return out


def agree_until(a: str | Path, b: str | Path) -> int | None:
    """Images two runs had used when their calls or results first differed (None: one is the other's beginning)."""
    sa, sb = steps(a), steps(b)
    for x, y in zip(sa, sb):
        if x != y:
            return min(x[0], y[0])
    return None


def agreement(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], planner_a: str, planner_b: str,
              by: int) -> dict[str, Any]:
    """Per class run on both sides, the images until their transcripts first differ; how many agree up to ``by``."""
    ta = {(r["world"], r["label"], r.get("seed", 0)): r["transcript"] for r in a if r["planner"] == planner_a}
    tb = {(r["world"], r["label"], r.get("seed", 0)): r["transcript"] for r in b if r["planner"] == planner_b}
    rows = []
    for key in sorted(set(ta) & set(tb)):
        try:
            until = agree_until(ta[key], tb[key])
        except (OSError, ValueError):
            continue
        rows.append({"world": key[0], "class": key[1], "seed": key[2], "differ_at": until})
    same = [r for r in rows if r["differ_at"] is None or r["differ_at"] >= by]
    return {"by": by, "classes": len(rows), "agree": len(same),
            "differ_before": [f"{r['world']}: {r['class']} at {r['differ_at']:,}" for r in rows if r not in same]}


def _name(key: tuple[str, str, str, int]) -> str:
    world, _, bug, seed = key
    return f"{world}: {bug}" + (f" (seed {seed})" if seed else "")
