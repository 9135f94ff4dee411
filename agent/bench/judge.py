"""The oracle's verdict on a finding: is its caption's failure rate really above the class baseline, by a margin?

A finding is *real* when the oracle's 95% interval for the failure-rate ratio (caption over class prompt, both on
the same fresh seeds beyond every investigation's) lies wholly above ``metrics.REAL_RATIO``. Judging is staged to
keep benchmarks affordable: a first look on ``first`` images decides when its 99% interval already lies wholly
above or wholly below the threshold; otherwise the caption is measured on all ``n`` images and the 95% interval
decides. (The two looks together misjudge a ratio of exactly 1.2 at most 0.5% + 2.5% of the time.) The Katz interval
treats the two samples as independent; they share seeds, so it is conservative.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sleuth.agent.bench.metrics import REAL_RATIO, is_real
from sleuth.tools import stats
from sleuth.tools.backends.criteria import failed
from sleuth.tools.backends.toyworld import CLASS_PROMPT, Oracle

ORACLE_SEED = 1 << 50
"""The oracle's seeds lie beyond every investigation's discovery and confirmation seeds."""
EARLY_CONFIDENCE = 0.99


def json_number(x: float | None) -> float | None:
    """Strict JSON has no infinity or nan: those become null."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


class OracleJudge:
    """Oracle verdicts on captions, cached: each (class, caption) is measured once."""

    def __init__(self, oracle: Oracle, n: int = 10_000, criterion: str = "top1", first: int | None = None,
                 threshold: float = REAL_RATIO) -> None:
        self.oracle = oracle
        self.n = n
        self.first = min(n, first if first is not None else max(1000, n // 5))
        self.criterion = criterion
        self.threshold = threshold
        self._base: dict[str, np.ndarray] = {}
        self._cache: dict[tuple[str, str, bool], dict[str, Any]] = {}

    def _failed(self, caption: str, label: str, n: int, start: int = 0) -> np.ndarray:
        logits = self.oracle.predictions(caption, n, ORACLE_SEED + start)
        return np.asarray(failed(logits, label, self.oracle.labels, self.criterion), dtype=bool)

    def baseline(self, label: str) -> np.ndarray:
        """Which of the ``n`` oracle images of the class prompt fail."""
        if label not in self._base:
            self._base[label] = self._failed(CLASS_PROMPT.format(label=label), label, self.n)
        return self._base[label]

    def judge(self, label: str, caption: str, full: bool = False) -> dict[str, Any]:
        """The verdict: counts, ratio with its interval, one-sided exact p, ``real``; ``full`` skips the early look."""
        key = (label, " ".join(caption.lower().split()), full)
        if key in self._cache:
            return self._cache[key]
        base = self.baseline(label)
        bad = self._failed(caption, label, self.first)
        stage, confidence = "first", EARLY_CONFIDENCE
        early = stats.rate_ratio(int(bad.sum()), len(bad), int(base[:len(bad)].sum()), len(bad), EARLY_CONFIDENCE)
        decided = early.low > self.threshold or early.high < self.threshold
        if full or not decided or self.first == self.n:
            if self.first < self.n:
                bad = np.concatenate([bad, self._failed(caption, label, self.n - self.first, self.first)])
            stage, confidence = "full", 0.95
        n = len(bad)
        k1, k0 = int(bad.sum()), int(base[:n].sum())
        ci = stats.rate_ratio(k1, n, k0, n, confidence)
        cmp = stats.compare_rates(k1, n, k0, n)
        out = {"k": k1, "n": n, "baseline_k": k0, "baseline_n": n, "ratio": json_number(ci.ratio),
               "ratio_ci": [json_number(ci.low), json_number(ci.high)], "confidence": confidence, "stage": stage,
               "p_value": cmp.p_value, "real": is_real(ci.low, self.threshold)}
        self._cache[key] = out
        return out
