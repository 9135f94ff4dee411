"""Failure modes scored against a world's ground truth: are they pure, and is each cause one mode?

The benchmark reads a run's modes (its ``mode`` events, agent/modes.py) and the attribute values each finding's
caption names, as the world's own parser reads it (``scene_values``): scoring only, never seen by a planner.

- A mode is *pure* when one attribute value is named by every finding it holds ("in a river", "underwater" and "on a
  boat" all name water).
- Its *cause* is that shared value (all of them, when several are shared); an impure mode's cause is what most of
  its findings name.
- Modes whose causes share a value are one *distinct cause*; *redundancy* is modes per distinct cause (1.0: each
  cause found is one mode).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from sleuth.agent.view import InvestigationView
from sleuth.tools.backends.toyworld.config import World
from sleuth.tools.backends.toyworld.parser import parse


def scene_values(caption: str, world: World, class_prompt: str) -> frozenset[str]:
    """The attribute values ``caption`` asks for beyond its class prompt's, as 'attribute=value'."""
    base = parse(class_prompt, world).scene_constraints
    got = parse(caption, world).scene_constraints
    return frozenset(f"{attr}={v}" for attr, values in got.items() if base.get(attr) != values for v in values)


def cause_of(values: Sequence[frozenset[str]]) -> tuple[bool, frozenset[str]]:
    """(pure, cause) of a mode whose findings name ``values``: the values every finding names, or else those most of
    them name."""
    if not values:
        return False, frozenset()
    shared = frozenset.intersection(*values)
    if shared:
        return True, shared
    counts = Counter(v for vs in values for v in vs)
    return False, frozenset(v for v, c in counts.items() if 2 * c > len(values))


def distinct_causes(causes: Sequence[frozenset[str]]) -> int:
    """Modes whose causes share a value are one cause (connected components); a mode with no cause is its own."""
    parent = list(range(len(causes)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(causes)):
        for j in range(i):
            if causes[i] & causes[j]:
                parent[root(i)] = root(j)
    return len({root(i) for i in range(len(causes))})


def run_modes(view: InvestigationView, world: World) -> dict[str, Any]:
    """A run's modes scored: each mode's findings, purity and cause; the run's distinct causes and phrasings."""
    prompt = view.started.class_prompt if view.started is not None and view.started.class_prompt else ""
    rows: list[dict[str, Any]] = []
    causes: list[frozenset[str]] = []
    claims = view.mode_claims()
    for claim in claims:
        values = [scene_values(f.caption, world, prompt) for f in claim.findings]
        pure, cause = cause_of(values)
        causes.append(cause)
        rows.append({"mode_id": claim.mode.mode_id, "findings": [f.finding_id for f in claim.findings],
                     "best": claim.best.finding_id, "pure": pure, "cause": sorted(cause)})
    return {"modes": rows, "n_modes": len(rows), "pure": sum(1 for r in rows if r["pure"]),
            "causes": distinct_causes(causes), "phrasings": sum(len(c.findings) - 1 for c in claims)}


def mode_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Purity and redundancy over runs (each with ``modes`` from ``run_modes``): pure modes / modes, modes / distinct
    causes, and modes per class."""
    scored = [r["modes"] for r in runs if r.get("modes")]
    n = sum(m["n_modes"] for m in scored)
    pure = sum(m["pure"] for m in scored)
    causes = sum(m["causes"] for m in scored)
    per_class = [m["n_modes"] for m in scored]
    return {"classes": len(scored), "modes": n, "pure": pure, "purity": pure / n if n else None,
            "distinct_causes": causes, "redundancy": n / causes if causes else None,
            "modes_per_class_median": statistics.median(per_class) if per_class else None,
            "modes_per_class_mean": n / len(scored) if scored else None,
            "phrasings": sum(m["phrasings"] for m in scored)}
