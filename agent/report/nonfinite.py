"""Transcripts write inf and nan as JSON null (JSON has neither); put them back before validating tool results."""

from __future__ import annotations

import math
from typing import Any

from sleuth.tools import stats


def _counts(d: Any) -> tuple[int, int] | None:
    if isinstance(d, dict) and isinstance(d.get("failures"), dict):
        d = d["failures"]
    if isinstance(d, dict) and isinstance(d.get("k"), int) and isinstance(d.get("n"), int):
        return d["k"], d["n"]
    return None


def restore_non_finite(data: Any) -> Any:
    """Undo the JSON nulls that stand for inf and nan in transcripts (an infinite rate ratio when the baseline had no
    failure, an undefined one when neither sample had any), so results validate against the tools' models again.

    A ratio is recomputed from its k/n counts when they sit beside it; otherwise null means inf (nan when the
    ratio's method says it is undefined), and a rate of an empty sample is nan.
    """
    if isinstance(data, list):
        return [restore_non_finite(x) for x in data]
    if not isinstance(data, dict):
        return data
    out = {k: restore_non_finite(v) for k, v in data.items()}
    rr = out.get("rate_ratio")
    if isinstance(rr, dict) and None in (rr.get("ratio"), rr.get("low"), rr.get("high")):
        one, zero = _counts(out.get("hypothesis")), _counts(out.get("baseline"))
        if one is not None and zero is not None:
            fresh = stats.rate_ratio(*one, *zero, confidence=rr.get("confidence", 0.95))
            out["rate_ratio"] = fresh.model_dump()
        else:
            undefined = "undefined" in str(rr.get("method", ""))
            out["rate_ratio"] = {**rr, "ratio": math.nan if undefined and rr.get("ratio") is None else rr["ratio"],
                                 "low": 0.0 if rr.get("low") is None else rr["low"],
                                 "high": math.inf if rr.get("high") is None else rr["high"]}
            if out["rate_ratio"]["ratio"] is None:
                out["rate_ratio"]["ratio"] = math.inf
    if {"k", "n", "rate"} <= set(out) and out["rate"] is None:
        out["rate"] = math.nan
    return out
