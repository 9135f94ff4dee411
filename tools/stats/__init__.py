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
  Counterfactual edits give paired outcomes (each image edited, and the same image control-edited through the same
  editor: a placebo caption that changes as many words and names nothing, or the unchanged caption where the editor
  renders only what captions name), tested with the exact McNemar test (a binomial test on the discordant pairs):
  the test is of the attribute, since the editor's own effect, and its reaction to any change of caption, is in
  both arms. Large-sample approximations are unreliable at the small counts these audits produce.
- **Effect sizes** are rate ratios with a Katz (log-scale) interval for independent samples, and the matched-pairs
  log-scale interval (Bonett–Price adjusted) for paired ones (`paired_rate_ratio`: exact coverage at least 0.906 at
  n = 20, 0.916 at 50, 0.930 at 100, 0.943 at 200 over ratios 1–5 and rates 2–20%, short of 0.94 only for ratios of
  3 or more with most failures shared; tests/test_paired_coverage.py; narrower than Katz when edits agree with
  their controls on most images); zero counts are reported honestly as 0, inf or nan with the side of the interval
  the data do inform.
- **Families are corrected with Holm by default.** Each finding claims its own effect, so the error to control is the
  chance that *any* claim is false (family-wise error); Benjamini–Hochberg (false discovery rate) is offered for
  exploratory screens where a share of false leads is acceptable.
- **Non-inferiority** of a paired accuracy (a classifier before and after a fix) uses Newcombe's hybrid score
  interval for the paired difference (`paired_difference`): shown when its one-sided lower bound clears the margin.
- **Sequential sampling** spends alpha over planned looks (Lan–DeMets), so stopping early keeps the error valid;
  see `SequentialPlan`.

**The guarantee of an investigation, whatever the planner does.** A planner (an LLM) chooses adaptively what to
measure, how often, and when to stop; the tools must keep the error of *findings* at alpha for any such sequence.
The design: discovery is a screen, and the guarantee comes from confirmation alone.

- *Discovery* (measure_rate without confirm): any number of tests, any looks, any adaptive choice. Its p-values are
  Holm-adjusted over the discovery tests so far, shown as such, and readjusted over the final family in reports; they
  rank and select hypotheses but certify nothing.
- *Confirmation* (measure_rate with confirm=true): each attempt draws fresh seeds, disjoint from every seed used
  before, so its data are independent of everything that led to choosing it. An investigation declares its
  confirmation family up front (MAX_CONFIRMATIONS attempts, 10 by default; attempts beyond are refused) and tests
  attempt i at alpha / M (Bonferroni over the declared family). A repeat of a caption is another attempt.
- *Proof sketch.* Let H_i be the null hypothesis the i-th attempt tests (chosen by any rule from the data before it).
  Given that past, attempt i's data are fresh, so P(p_i <= alpha/M | past) <= alpha/M when H_i is true (the sequential
  plan's overall p-value is valid: a union bound over its looks). A false finding needs some attempt on a true null
  to reject; with at most M attempts, P(any false finding) <= sum_i alpha/M = alpha, by the union bound, however the
  planner chose, stopped or repeated. Holm over the attempts made would not do: a planner that stops at its first
  success makes the family size depend on the outcomes.
- *Printed values are final.* A confirmation's adjusted p is min(1, M p) when it is printed and forever after.
  `record_finding` requires the confirmation of the very caption recorded (a sample test with confirm=true, adjusted
  p <= alpha, rate above the baseline) and a discovery measurement of it or of a caption it refines (words left out,
  none added, at most 3 content words fewer); a counterfactual test cited must be one of that caption.
- *No stranded hypotheses.* A confirmation's sequential plan runs at alpha / M, so it stops for success only where it
  survives the correction; a discovery stopped early is never a dead end, since confirmation does not depend on its
  adjusted p. When the budget ends sampling early, the last look is tested at all the alpha not yet spent, and the
  reported p-value uses that threshold (`overall_p_value(final=True)`).
- *Effects* are reported from the confirmation (fresh seeds: no winner's curse) and findings are ranked by the lower
  bound of its interval.
- *p-values* are exact under the binomial sampling model of images drawn independently from the generator (i.i.d.
  seeds); terminal and report show them floored at 1e-6 ("< 1e-6"), since smaller values only restate that model.

**Across an audit's classes** (`agent/audit/summary.py`), each class's declared confirmation family gets alpha / C
of the audit's C classes: a finding is audit-significant when min(1, C * its adjusted p) <= alpha, so by the same
union bound over every attempt the classes declared, P(any false audit-significant finding) <= alpha (family-wise).

Modules: `rates` (intervals, rate ratios), `comparisons` (exact tests, multiplicity), `sequential` (plans).
"""

from sleuth.tools.stats.comparisons import (
    Comparison,
    McNemar,
    NonInferiority,
    PairedDifference,
    adjust_pvalues,
    compare_rates,
    fisher_p_greater,
    mcnemar_exact,
    non_inferiority,
    paired_difference,
)
from sleuth.tools.stats.rates import Rate, RatioCI, binomial_rate, paired_rate_ratio, rate_ratio
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
    "NonInferiority",
    "PairedDifference",
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
    "non_inferiority",
    "paired_difference",
    "paired_rate_ratio",
    "rate_ratio",
]
