"""The answer key (``investigate --reveal``) in the terminal: planted bugs and decoys, then the findings' verdicts."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text


def _ratio(v: dict[str, Any]) -> str:
    def x(a: float | None) -> str:
        return "∞" if a is None else f"{a:.3g}"
    low, high = v["ratio_ci"]
    return f"{x(v['ratio'])}× [{x(low)}, {x(high)}] ({v['k']}/{v['n']} vs {v['baseline_k']}/{v['baseline_n']})"


def found_by(p: dict[str, Any], modes: dict[str, list[str]]) -> str:
    """``mode m3 (f3, f4, f18, f25)``: the failure modes whose findings name the plant, each with all its findings
    (the findings themselves for a key without modes)."""
    named = [m for m in p.get("modes", []) if m in modes]
    if not named:
        return ", ".join(p["findings"])
    return f"mode{'s' * (len(named) != 1)} " + ", ".join(f"{m} ({', '.join(modes[m])})" for m in named)


def render_answer_key(key: dict[str, Any]) -> RenderableType:
    planted = key["planted"]
    head = Text.assemble(
        ("Answer key ", "bold magenta"),
        (f"(toyworld {key['world']!r}, class {key['class']!r}; shown after the run, never to the planner; oracle "
         f"ratios on {key['oracle_images']:,} fresh images of each caption against the class prompt)", "dim"))
    if not planted:
        return Group(head, Text(f"The world plants no bug and no decoy in {key['class']!r}."))
    lines: list[RenderableType] = [head]
    for p in planted:
        what = (f"bug: {p['caption']!r} fails as {p['confuser']}" if p["kind"] == "bug" and p["confuser"]
                else f"{p['kind']}: {p['caption']!r}")
        line = Text.assemble(("• ", ""), (p["name"], "bold"), f" ({what}; oracle {_ratio(p['oracle'])}): ")
        if p["kind"] == "bug":
            line.append("FOUND" if p["found"] else "MISSED", style="bold green" if p["found"] else "bold red")
            line.append(f" by {found_by(p, key.get('modes', {}))}: " if p["found"] else ": ")
            line.append(p["why"] + ".", style="" if p["found"] else "yellow")
        else:
            named = f" Named by {found_by(p, key.get('modes', {}))}." if p["findings"] else " No finding names it."
            line.append("a decoy, which the classifier was trained to ignore." + named)
        lines.append(line)
    real = [f for f in key["findings"] if f["real"]]
    lines.append(Text(f"Confirmed findings: {len(key['findings'])}, of which {len(real)} real by the oracle "
                      f"(its 95% interval above 1.2×) and {len(key['false_findings'])} false"
                      + (f" ({', '.join(key['false_findings'])})" if key["false_findings"] else "") + "; "
                      + (", ".join(f"{f['finding_id']} names {f['bug']!r}" for f in key["findings"] if f["bug"])
                         or "none names a planted bug") + "."))
    others = len(real) - sum(1 for f in real if f["bug"])
    if others:
        lines.append(Text(f"The other {others} real finding{'s' * (others != 1)} name no plant: failures the "
                          "classifier learned from its training images' own correlations, real all the same.",
                          style="dim"))
    return Group(*lines)
