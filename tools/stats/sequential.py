"""Group-sequential testing: sample a hypothesis in batches and stop early for success or futility, with the
overall false-positive rate kept at alpha by Lan–DeMets alpha spending."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from sleuth.tools.stats.comparisons import fisher_p_greater
from sleuth.tools.stats.rates import FROZEN, check_count, check_counts, rate_ratio

Spending = Literal["obrien-fleming", "pocock", "bonferroni"]


def alpha_spent(t: float, alpha: float, spending: Spending) -> float:
    """Cumulative alpha a Lan–DeMets spending function allows by information fraction t in [0, 1].

    O'Brien–Fleming type: 2 - 2 Phi(z_{1-alpha/2} / sqrt t), with alpha the one-sided level (the form used for
    one-sided designs, e.g. gsDesign's sfLDOF): it spends almost nothing early and reaches alpha at t = 1.
    Pocock type: alpha log(1 + (e - 1) t), spending more evenly. Both are 0 at t = 0 and alpha at t = 1.
    """
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"information fraction must be in [0, 1], got {t}")
    if t == 0.0:
        return 0.0
    if spending == "obrien-fleming":
        z = NormalDist().inv_cdf(1.0 - alpha / 2.0) / math.sqrt(t)
        return min(alpha, math.erfc(z / math.sqrt(2.0)))  # 2 (1 - Phi(z)), accurate far into the tail
    if spending == "pocock":
        return min(alpha, alpha * math.log1p((math.e - 1.0) * t))
    raise ValueError(f"no spending function {spending!r} (bonferroni splits alpha evenly over the looks)")


class SequentialDecision(BaseModel):
    model_config = FROZEN

    action: Literal["continue", "success", "futility"] = Field(
        description="'continue' at the last look means the plan is exhausted without a decision (inconclusive).")
    look: int = Field(description="0-based index of the look in the plan.")
    p_value: float = Field(description="One-sided Fisher p-value at this look (nominal, not adjusted).")
    threshold: float = Field(description="The nominal alpha this look rejects at.")
    reason: str


class SequentialPlan(BaseModel):
    """Group-sequential one-sided test of hypothesis rate > baseline rate, hypothesis sampled in batches.

    At look j (cumulative hypothesis sample size n_j) the test rejects if the one-sided exact (Fisher) p-value is
    <= alpha_j, the increment of a Lan–DeMets alpha-spending function at information fractions t_j = n_j / n_K:
    alpha_j = f(t_j) - f(t_{j-1}) (see `alpha_spent`), or alpha / K each for "bonferroni".

    Validity: under the null each Fisher p-value is super-uniform, P(p_j <= a) <= a, so by the union bound
    P(reject at any look) <= sum_j P(p_j <= alpha_j) <= sum_j alpha_j = f(1) = alpha, whatever the correlation between
    looks (they share the baseline and the earlier images). No normal approximation or independent-increments
    assumption is needed; the spending shape only decides where the power goes. Futility stopping only removes
    rejections, so it keeps validity even when it is ignored (non-binding). The thresholds depend only on the planned
    sizes, so a look made with a few images more or fewer than planned (or a larger baseline) keeps the guarantee.

    The final look's threshold can be used on its own: when sampling ends before the planned last look for a reason
    that does not depend on this test's outcomes (e.g. the image budget ran out), the look where it ends may reject at
    all the alpha not yet spent, alpha - sum_{i<j} alpha_i (`final_threshold`, `decide(..., final=True)`); the union
    bound still sums to alpha. Likewise min_j p_j * alpha / alpha_j is a valid p-value for the whole sequence
    (`overall_p_value`).
    """

    model_config = FROZEN

    looks: list[int] = Field(description="Cumulative hypothesis sample sizes, e.g. [50, 100, 200, 400].")
    alpha: float = Field(0.05, description="One-sided type-I error of the whole sequence.")
    spending: Spending = "obrien-fleming"
    futility_ratio: float = Field(1.0, gt=0.0, description="Stop for futility when the upper end of the rate "
                                                           "ratio's interval falls below this.")
    futility_confidence: float = Field(0.95, gt=0.0, lt=1.0, description="Coverage of that interval.")

    @field_validator("looks")
    @classmethod
    def _increasing(cls, looks: list[int]) -> list[int]:
        if not looks or looks[0] < 1 or any(b <= a for a, b in zip(looks, looks[1:])):
            raise ValueError(f"looks must be positive and strictly increasing, got {looks}")
        return looks

    @field_validator("alpha")
    @classmethod
    def _level(cls, alpha: float) -> float:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        return alpha

    def thresholds(self) -> list[float]:
        """Per-look nominal alpha; they sum to alpha (up to rounding, never above it by more than an ulp or two)."""
        k = len(self.looks)
        if self.spending == "bonferroni":
            return [self.alpha / k] * k
        spent = [alpha_spent(n / self.looks[-1], self.alpha, self.spending) for n in self.looks]
        spent[-1] = self.alpha
        return [max(0.0, b - a) for a, b in zip([0.0] + spent[:-1], spent)]

    def final_threshold(self, look: int) -> float:
        """The threshold for `look` when it is the last look made: all the alpha not spent at earlier looks."""
        self._check_look(look)
        return max(0.0, self.alpha - sum(self.thresholds()[:look]))

    def overall_p_value(self, p_values: Sequence[float], *, final: bool = False) -> float:
        """A p-value for the whole sequence from the p-values of the looks made: min_j p_j * alpha / alpha_j.

        ``final=True``: the last look was declared final (``decide(..., final=True)``), so its alpha_j is the
        threshold it was tested at, ``final_threshold``."""
        alphas = self.thresholds()
        if not 0 < len(p_values) <= len(alphas):
            raise ValueError(f"need 1 to {len(alphas)} p-values, got {len(p_values)}")
        if final:
            last = len(p_values) - 1
            alphas = [*alphas[:last], self.final_threshold(last)]
        scaled = [p * self.alpha / a for p, a in zip(p_values, alphas) if a > 0.0]
        return min([1.0, *scaled])

    def _check_look(self, look: int) -> None:
        if not 0 <= look < len(self.looks):
            raise ValueError(f"look must be an index 0..{len(self.looks) - 1} into {self.looks}, got {look}")

    def decide(self, look: int, k1: int, n1: int, k0: int, n0: int, *, final: bool = False) -> SequentialDecision:
        """Decision at look index `look` (0-based) given hypothesis k1/n1 and baseline k0/n0 so far.

        `final=True` declares this the last look to be made (decided without looking at this test's outcomes), so
        it rejects at `final_threshold`. The planned last look does so automatically.
        """
        self._check_look(look)
        k1, n1 = check_counts(k1, n1, "k1", "n1")
        k0, n0 = check_counts(k0, n0, "k0", "n0")
        last = final or look == len(self.looks) - 1
        threshold = self.final_threshold(look) if last else self.thresholds()[look]
        p = float(fisher_p_greater(k1, n1, k0, n0)) if n1 and n0 else 1.0
        at = f"look {look + 1}/{len(self.looks)} ({k1}/{n1} vs {k0}/{n0})"
        if p <= threshold:
            return SequentialDecision(action="success", look=look, p_value=p, threshold=threshold,
                                      reason=f"{at}: p = {p:.3g} <= {threshold:.3g}")
        ratio = rate_ratio(k1, n1, k0, n0, confidence=self.futility_confidence)
        if ratio.high < self.futility_ratio:
            return SequentialDecision(
                action="futility", look=look, p_value=p, threshold=threshold,
                reason=f"{at}: rate ratio upper bound {ratio.high:.3g} < {self.futility_ratio:g}")
        tail = "plan exhausted, inconclusive" if last else "continue sampling"
        return SequentialDecision(action="continue", look=look, p_value=p, threshold=threshold,
                                  reason=f"{at}: p = {p:.3g} > {threshold:.3g}; {tail}")


def default_plan(max_n: int, first: int = 50, alpha: float = 0.05,
                 spending: Spending = "obrien-fleming") -> SequentialPlan:
    """A plan with looks doubling from `first` up to `max_n` (e.g. 50, 100, 200, 400 for 400), O'Brien–Fleming spending
    unless another is named."""
    max_n, first = check_count("max_n", max_n), check_count("first", first)
    if max_n < 1 or first < 1:
        raise ValueError(f"need max_n >= 1 and first >= 1, got max_n={max_n}, first={first}")
    looks: list[int] = []
    n = first
    while n < max_n:
        looks.append(n)
        n *= 2
    # A last step much smaller than the look before it adds little information but still takes a share of alpha.
    if looks and max_n < 1.5 * looks[-1]:
        looks.pop()
    return SequentialPlan(looks=[*looks, max_n], alpha=alpha, spending=spending)
