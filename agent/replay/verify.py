"""How a re-run result differs from its recording, and whether that matters: the verification tolerance policy.

Another CPU rounds a float differently and a GPU never repeats a diffusion image bit for bit, so "the bytes differ"
cannot be the test of a shared transcript. Every difference gets one of four classes:

- **identical**: the bytes are equal;
- **equivalent**: images within ``PIXEL_TOLERANCE`` grey levels on at most ``PIXEL_SHARE`` of their pixels (compared
  by pixels when both artifacts are at hand), other numbers within ``FLOAT_TOLERANCE``, the same labels and counts;
- **drifted**: an observation changed (a count, a label, an image beyond tolerance, a float beyond tolerance); each
  is reported with by how much, and the recorded *conclusions* are then checked;
- **different**: a conclusion changed: a measurement's verdict (significance after correction), a finding recorded
  or refused, a finding's confirmation, its rate ratio outside the re-run's interval, a call that succeeded now
  failing (or the other way round), the number of findings at the end.

A transcript is then identical, equivalent, drifted (every conclusion held) or different; a broken hash chain or
recorded numbers that contradict each other (a rate that is not its own k/n) make it *tampered*. Conclusions are
named by each tool module's ``conclusions(result)``, so the policy knows no tool by name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.stats import binomial_rate

Kind = Literal["identical", "equivalent", "drifted", "different", "tampered"]
ORDER: dict[str, int] = {"identical": 0, "equivalent": 1, "drifted": 2, "different": 3, "tampered": 4}
ACCEPTED: tuple[str, ...] = ("identical", "equivalent", "drifted")
"""Transcript classes that pass ``--verify`` (exit 0); ``--strict`` accepts only identical."""

PIXEL_TOLERANCE = 2
"""Grey levels (0..255) a pixel may differ by and still be equivalent."""
PIXEL_SHARE = 0.01
"""Share of an image's pixel values that may differ (each within ``PIXEL_TOLERANCE``)."""
FLOAT_TOLERANCE = 1e-4
"""Relative and absolute: probabilities and p-values within 1e-4, larger numbers within 0.01%."""
MAX_REPORTED = 8
"""Differences reported per call; the first few say what changed."""

_REF = re.compile(r"^[0-9a-f]{64}$")


def worst(kinds: Any) -> Kind:
    out: Kind = "identical"
    for k in kinds:
        if ORDER[k] > ORDER[out]:
            out = k
    return out


class Difference(BaseModel):
    line: int = Field(description="1-based transcript line of the recorded outcome.")
    tool: str
    call_id: str
    kind: Kind
    path: str = Field(description="Where the results differ, e.g. result.hypothesis.failures.k.")
    recorded: Any = None
    replayed: Any = None
    note: str = ""

    def describe(self) -> str:
        note = f" ({self.note})" if self.note else ""
        return (f"line {self.line}: {self.tool} ({self.call_id}): {self.kind}: {self.path}: recorded "
                f"{short(self.recorded)}, re-run gives {short(self.replayed)}{note}")


def short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class ImageStores:
    """Where recorded images (beside the transcript) and re-run images (a scratch store) can be read by ref."""

    recorded: ArtifactStore | None = None
    replayed: ArtifactStore | None = None
    aliases: dict[str, str] = field(default_factory=dict)
    """Recorded ref -> re-run ref, for images that differ in bytes."""

    def compare(self, a: str, b: str) -> tuple[Kind, str]:
        """Class of the difference between recorded image ``a`` and re-run image ``b`` (refs that differ)."""
        if self.recorded is None or self.replayed is None or not self.recorded.exists(a) \
                or not self.replayed.exists(b):
            return "drifted", "the recorded image is not kept: compared by hash only"
        x = self.recorded.get_image(a).astype(np.int16)
        y = self.replayed.get_image(b).astype(np.int16)
        if x.shape != y.shape:
            return "drifted", f"image size {x.shape[:2]} became {y.shape[:2]}"
        d = np.abs(x - y)
        share = float((d > 0).mean())
        text = f"max |Δ| {int(d.max())} grey level{'s' * (int(d.max()) != 1)} on {100 * share:.2g}% of pixel values"
        if int(d.max()) <= PIXEL_TOLERANCE and share <= PIXEL_SHARE:
            return "equivalent", "image within tolerance: " + text
        return "drifted", "image beyond tolerance: " + text


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _as_float(x: Any) -> float | None:
    """A JSON number, or a non-finite one spelt as a string."""
    if _is_number(x):
        return float(x)
    if x in ("Infinity", "-Infinity", "NaN"):
        return float(x)
    return None


def _float_kind(a: float, b: float) -> Kind:
    if a == b or (math.isnan(a) and math.isnan(b)):
        return "identical"
    if math.isclose(a, b, rel_tol=FLOAT_TOLERANCE, abs_tol=FLOAT_TOLERANCE):
        return "equivalent"
    return "drifted"


Found = list[tuple[Kind, str, Any, Any, str]]


def diff_values(recorded: Any, replayed: Any, path: str, images: ImageStores, out: Found) -> None:
    """Append (kind, path, recorded, replayed, note) for every difference between two JSON values."""
    if recorded == replayed and type(recorded) is type(replayed):
        return
    if isinstance(recorded, dict) and isinstance(replayed, dict):
        for k in list(recorded) + [k for k in replayed if k not in recorded]:
            if k not in recorded:
                # A field the tool has gained since the recording: more information, not a changed observation.
                out.append(("equivalent", f"{path}.{k}", "<absent>", replayed[k], "field added since the recording"))
            elif k not in replayed:
                out.append(("drifted", f"{path}.{k}", recorded[k], "<absent>", "field no longer given"))
            else:
                diff_values(recorded[k], replayed[k], f"{path}.{k}", images, out)
        return
    if isinstance(recorded, list) and isinstance(replayed, list):
        if len(recorded) != len(replayed):
            out.append(("drifted", f"{path}.length", len(recorded), len(replayed),
                        f"{len(replayed) - len(recorded):+d} items"))
        for i, (a, b) in enumerate(zip(recorded, replayed)):
            diff_values(a, b, f"{path}[{i}]", images, out)
        return
    if isinstance(recorded, bool) or isinstance(replayed, bool):
        out.append(("drifted", path, recorded, replayed, ""))
        return
    if isinstance(recorded, int) and isinstance(replayed, int):
        out.append(("drifted", path, recorded, replayed, f"{replayed - recorded:+d}"))
        return
    fa, fb = _as_float(recorded), _as_float(replayed)
    if fa is not None and fb is not None:
        kind = _float_kind(fa, fb)
        if kind != "identical":
            out.append((kind, path, recorded, replayed, "" if kind == "equivalent" else f"{fb - fa:+.3g}"))
        return
    if isinstance(recorded, str) and isinstance(replayed, str) and _REF.match(recorded) and _REF.match(replayed):
        kind, note = images.compare(recorded, replayed)
        images.aliases[recorded] = replayed
        out.append((kind, path, recorded[:12] + "…", replayed[:12] + "…", note))
        return
    out.append(("drifted", path, recorded, replayed, ""))


Conclusions = Callable[[dict[str, Any], dict[str, Any]], list[tuple[str, Any, Any]]]
"""(recorded result, re-run result) -> the conclusions that changed, as (name, recorded, re-run)."""


def compare_outcomes(recorded_ok: bool, recorded: dict[str, Any] | str | None, replayed_ok: bool,
                     replayed: dict[str, Any] | str | None, conclusions: Conclusions | None,
                     images: ImageStores) -> Found:
    """Every difference between a recorded call outcome and its re-run, changed conclusions first."""
    out: Found = []
    if recorded_ok != replayed_ok:
        out.append(("different", "ok", recorded_ok, replayed_ok,
                    "the call " + ("now fails" if recorded_ok else "now succeeds") +
                    (f": {short(replayed, 200)}" if not replayed_ok else "")))
        return out
    if not recorded_ok:
        if recorded != replayed:
            out.append(("drifted", "error", recorded, replayed, "the call failed both times, with other words"))
        return out
    assert isinstance(recorded, dict) and isinstance(replayed, dict)
    if conclusions is not None:
        for name, before, after in conclusions(recorded, replayed):
            out.append(("different", f"conclusion.{name}", before, after, "a recorded conclusion no longer holds"))
    diff_values(recorded, replayed, "result", images, out)
    return out


def inconsistencies(result: Any, path: str = "result") -> list[str]:
    """Recorded rates that are not their own k/n with their interval: numbers edited after the fact."""
    found: list[str] = []
    if isinstance(result, dict):
        if {"k", "n", "rate", "low", "high", "method"} <= set(result) and result.get("method") in (
                "wilson", "clopper-pearson"):
            try:
                again = binomial_rate(int(result["k"]), int(result["n"]), float(result.get("confidence", 0.95)),
                                      result["method"])
            except (ValueError, TypeError):
                return [f"{path}: k={result.get('k')!r}, n={result.get('n')!r} are not a rate"]
            for key in ("rate", "low", "high"):
                a, b = _as_float(result[key]), getattr(again, key)
                if a is None or not (a == b or (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9,
                                                                                                 abs_tol=1e-12)):
                    found.append(f"{path}: {result['k']}/{result['n']} does not give {key} {result[key]!r}")
                    break
        for k, v in result.items():
            found += inconsistencies(v, f"{path}.{k}")
    elif isinstance(result, list):
        for i, v in enumerate(result):
            found += inconsistencies(v, f"{path}[{i}]")
    return found
