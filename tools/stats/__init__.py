"""Statistics behind every claim sleuth makes: rates with intervals, exact comparisons, multiplicity, sequential tests.

Pure numbers in, numbers out (numpy and scipy); nothing else of the project is imported. Results are frozen pydantic
models so they serialise into transcripts (nan and inf are written as the strings "NaN" / "Infinity" and read back).

Which methods, and why:

- **Rates are shown as k/n with a Wilson score interval.** Failure rates are often small (k of 0 to a few in n of
  hundreds); there the Wald interval has poor coverage and collapses to a zero width at k = 0, while Wilson stays close
  to nominal coverage and is not as wide as Clopper–Pearson. Clopper–Pearson (guaranteed coverage, conservative) is
  available where a worst-case guarantee matters.
- **Decisions use exact tests.** Hypothesis rate > baseline rate is tested one-sided with Fisher's exact test
  (conditional; a hypergeometric tail) or Boschloo's test (unconditional, uniformly more powerful, slower).
  Counterfactual edits give paired before/after outcomes, tested with the exact McNemar test (a binomial test on the
  discordant pairs). Large-sample approximations are unreliable at the small counts these audits produce.
- **Effect sizes** are rate ratios with a Katz (log-scale) interval; zero counts are reported honestly as 0, inf or
  nan with the side of the interval the data do inform.
- **Families are corrected with Holm by default.** Each finding claims its own effect, so the error to control is the
  chance that *any* claim is false (family-wise error); Benjamini–Hochberg (false discovery rate) is offered for
  exploratory screens where a share of false leads is acceptable.
- **Sequential sampling** spends alpha over planned looks (Lan–DeMets), so stopping early keeps the error valid;
  see `SequentialPlan`.

Modules: `rates` (intervals, rate ratios), `comparisons` (exact tests, multiplicity), `sequential` (plans).
"""

from sleuth.tools.stats.comparisons import (
    Comparison,
    McNemar,
    adjust_pvalues,
    compare_rates,
    fisher_p_greater,
    mcnemar_exact,
)
from sleuth.tools.stats.rates import Rate, RatioCI, binomial_rate, rate_ratio
from sleuth.tools.stats.sequential import (
    SequentialDecision,
    SequentialPlan,
    Spending,
    alpha_spent,
    default_plan,
)

__all__ = [
    "Comparison",
    "McNemar",
    "Rate",
    "RatioCI",
    "SequentialDecision",
    "SequentialPlan",
    "Spending",
    "adjust_pvalues",
    "alpha_spent",
    "binomial_rate",
    "compare_rates",
    "default_plan",
    "fisher_p_greater",
    "mcnemar_exact",
    "rate_ratio",
]
