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
  rank and select hypotheses but certify nothing. A discovery test stops early for success only at alpha over the
  discovery tests so far, itself included, so that a stop is a supported verdict when it is made.
- *Confirmation* (measure_rate with confirm=true): each attempt draws fresh seeds, disjoint from every seed used
  before, so its data are independent of everything that led to choosing it. An investigation declares its
  confirmation family up front (MAX_CONFIRMATIONS attempts, 10 by default; attempts beyond are refused) and tests
  attempt i at alpha / M (Bonferroni over the declared family). A repeat of a caption is another attempt.
- *Sizes fixed before the baseline.* Every attempt compares with one confirmation baseline k0/n0, drawn once (at the
  first attempt, at the size first asked; it is never topped up), or, where the declared designs each give a
  baseline size, with the first ``baseline_n`` images of that baseline's seeds: drawn up to a design's size when an
  attempt of it first needs them and read as a prefix by smaller designs, so that every attempt's baseline is a
  sample of a size fixed before any of it was drawn. Fisher's p is super-uniform averaged over k0, not
  given k0: against a baseline in its lower tail (80/2,000 at a true 5%) a null attempt of 1,600 images rejects 5.1%
  of the time at a level of 0.5%. So a planner that reads k0 (every result prints it) and then picks an attempt's sizes
  could pick, for each k0, the sizes most likely to reject (exact: 5.7% over 10 attempts at alpha 5%). Hence an
  attempt's design (first look, most images, alpha spending, and so its looks and thresholds) is one of the *declared
  designs*, fixed before the baseline is drawn: in the run config (`confirmation_designs`, each with its number of
  attempts, summing to M) or by the first attempt (its `designs`, or else its own sizes for all M attempts), which is
  made before it draws the baseline. Any other sizes are refused, as is an attempt beyond its design's share.
- *Proof sketch.* Number the declared attempts s = 1..M (slots), slot s with design d_s, fixed before k0 is drawn.
  Attempt i uses a slot s(i) of the planner's choosing, never used before, chosen by any rule from all data so far
  (k0 included); its null H_i says the caption fails no more often than the class. Let r_d(k0) be the probability,
  given k0, that design d rejects a null sampled on fresh seeds (at most its value for a caption failing exactly as
  often as the class: the rejection region grows with the hypothesis failures). Given the past, attempt i's images
  are fresh, so P(attempt i falsely rejects | past) <= r_{d_s(i)}(k0) (the union bound over the plan's looks, with
  futility stops, whatever rule or rate the planner sets them by, only removing rejections). Each slot is used at
  most once, so (with k0 the count of each design's own baseline prefix, whose images are i.i.d. whenever drawn)
  P(any false finding) <= E[sum_i r_{d_s(i)}(k0)] <= E[sum_{s=1..M} r_{d_s}(k0)] = sum_s E[r_{d_s}(k0)] <= M alpha/M
  = alpha, since each d_s is fixed, so E[r_{d_s}(k0)] is the unconditional level of a fixed sequential Fisher test,
  at most its alpha / M. The planner's choices (which caption, which slot, whether to stop, repeat or skip) only
  select terms of a sum that is bounded whole. What it may not choose after k0 is the design of a slot: the bound
  needs E[max_d r_d(k0)] instead, which exceeds alpha/M (tests/test_fixed_designs.py measures 5.7% for M = 10).
  Tying a design to the discovery test would not do: the planner chooses which caption to confirm after seeing k0.
  The budget is the planner's to steer as well, so a confirmation the budget cuts short tests the looks it made at
  their planned thresholds (its rejection region is part of the full plan's) and never at the alpha left unspent.
  Holm over the attempts made would not do either: a planner that stops at its first success makes the family size
  depend on the outcomes. Runs recorded before sizes were fixed replay under their own rule (`legacy`).
- *Forks* copy a transcript's first line, so every branch draws the same confirmation baseline and seeds. The slots
  above are the transcript's, not a branch's: a ledger beside the prediction cache (`Investigation.family`, the hash
  of that first line) counts the attempts of every branch and holds the sizes the first declared, so the sum over
  slots covers all branches together. An attempt is named by its caption, sizes and the seeds it will draw; a branch
  repeating a call in the same state draws the same images, so it is not another attempt. A fresh run with the same
  seed is another transcript with a family of its own (it shares the baseline, as any second investigation of the
  same class with the same seed would).
- *Measured* (tests/test_fixed_designs.py, M = 10, alpha = 5%): with all ten attempts at one fixed design (single
  looks of 50 to 3,200 images or sequential plans to 300, 800 and 2,000), the exact family-wise error of the worst
  design is 3.5% (baseline 2,000 at 5%), 2.7% (500 at 5%), 3.1% (300 at 20%), 2.6% (1,000 at 2%); with the size of
  each attempt chosen from k0 it is 5.7%, 4.0%, 4.5%, 4.2%. Simulated, 200,000 runs at 2,000 and 5%: 5.63%
  [5.53%, 5.73%] (Clopper–Pearson) with sizes chosen from k0, 3.06% [2.99%, 3.14%] at 1,600 fixed.
- *Printed values are final.* A confirmation's adjusted p is min(1, M p) when it is printed and forever after.
  `record_finding` requires the confirmation of the very caption recorded (a sample test with confirm=true, adjusted
  p <= alpha, rate above the baseline) and a discovery measurement of it or of a caption it refines (words left out,
  none added, at most 3 content words fewer); a counterfactual test cited must be one of that caption.
- *No stranded hypotheses.* A confirmation's sequential plan runs at alpha / M, so it stops for success only where it
  survives the correction; a discovery stopped early is never a dead end, since confirmation does not depend on its
  adjusted p. When the budget ends a discovery test early, its last look is tested at all the alpha not yet spent,
  and the reported p-value uses that threshold (`overall_p_value(final=True)`); a confirmation keeps its planned
  thresholds (above).
- *Effects* are reported from the confirmation, and corrected for its selection. Fresh seeds free the confirmation
  of the discovery's selection, not of its own: a finding is recorded only when its confirmation rejects, and a
  sequential confirmation stops at the first look that rejects, so among recorded findings the naive ratio
  (k1/n1)/(k0/n0) overstates the effect (at a true 2x its median is 2.8x with the protocol's first design). The
  confirmation therefore also reports `effect` (`stats.conditional_effect`, module `selection`), conditioned on the
  look it stopped at and on the failures of both samples in all: given those, the baseline rate drops out and the
  hypothesis count's distribution among the splits that reject first at that look (enumerated exactly over the
  plan's looks) depends on the odds ratio alone. The estimate is that distribution's mid-p median, the interval's
  ends its exact 2.5% and 97.5% points (for the odds ratio, coverage at least 95% given the selection, whatever the
  class rate), all three as rate ratios, the ends widened over the baseline rate's exact interval. Measured over
  10,000 simulated attempts each (tests/test_selection.py; designs 30-300 images against 300 and 50-800 against
  500, class rate 5%, alpha/16): at a true 2x the median corrected estimate is 1.93x and 1.99x (naive 2.82x and
  2.20x), coverage among recorded findings 98.8% [98.4%, 99.2%] and 98.5% [98.2%, 98.8%]; at 3x, 2.99x and 3.00x
  (naive 3.14x and 3.02x), coverage 98.5% [98.2%, 98.7%] and 98.4% [98.1%, 98.6%]. It is
  median-unbiased, not concentrated: a confirmation with the fewest failures that reject at its look, for its
  failures in all, is mostly explained by its selection, and gets an interval from 0 and often an estimate below
  1x (at a true 2x, 35% and 18% of recorded findings with the two designs get one, all of them such confirmations;
  7% at 3x); the result says so. The protocol
  planner ranks findings by the lower bound of that interval.
- *p-values* are exact under the binomial sampling model of images drawn independently from the generator (i.i.d.
  seeds); terminal and report show them floored at 1e-6 ("< 1e-6"), since smaller values only restate that model.

**Across an audit's classes** (`agent/audit/summary.py`), each class's declared confirmation family gets alpha / C
of the audit's C classes: a finding is audit-significant when min(1, C * its adjusted p) <= alpha, so by the same
union bound over every attempt the classes declared, P(any false audit-significant finding) <= alpha (family-wise).

Modules: `rates` (intervals, rate ratios), `comparisons` (exact tests, multiplicity), `sequential` (plans),
`shared_baseline` (exact errors of attempts that share a baseline), `selection` (effects corrected for selection),
`bound` (a confirmed finding's headline lower bound).
"""

from sleuth.tools.stats.bound import given_selection, headline_bound
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
from sleuth.tools.stats.selection import conditional_effect, conditional_effects
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
    "conditional_effect",
    "conditional_effects",
    "default_plan",
    "fisher_p_greater",
    "given_selection",
    "headline_bound",
    "mcnemar_exact",
    "non_inferiority",
    "paired_difference",
    "paired_rate_ratio",
    "rate_ratio",
]
