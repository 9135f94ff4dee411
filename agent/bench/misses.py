"""The miss report: for every planted bug a run did not find, how far it got, read from the run's transcript.

Each call of the transcript that names the bug (its caption asks for the bug's attribute values, as the world's
parser reads it) moves the bug along the stages of an investigation; the furthest stage reached is why it was
missed. ``STAGES`` lists them, furthest first. A bug the classifier did not learn (the oracle measures it below
``LEARNED`` x its class) is counted apart: there was little to find.

The screen's verdict uses one rule for every planner: a bug *screened, not tested* had a pooled screen whose
posterior probability of failing at twice the class's baseline rate (a Beta prior with the weight of two images,
centred on the baseline rate of the run's class-prompt looks) was at least 0.9; *screened out* had screens below
that. A bug whose screen made that 99% likely (``WAITED_AT``) while the run confirmed another phrasing of a failure
mode it had found already (a finding placed in an existing mode) *waited behind a mode's phrasings*: images went to
a variant of a known cause while a strong candidate was left untested.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from scipy import stats as sps

from sleuth.agent.view import InvestigationView, caption_key
from sleuth.tools import generate_and_classify

LEARNED = 2.0
"""A planted bug the oracle measures below this ratio was not learned by the classifier."""
STAGES: tuple[str, ...] = (
    "found",
    "recorded, not real",
    "confirmed, not recorded",
    "confirmation not significant",
    "supported, not confirmed",
    "tested, not supported",
    "waited behind a mode's phrasings",
    "screened, not tested",
    "screened out",
    "proposed, not screened",
    "never proposed",
)
"""How far a planted bug got in a run, furthest first."""
MISS_STAGES = STAGES[1:]
WAITED_AT = 0.99
"""A screen this likely to fail at twice the class's rate should not wait while phrasings of known causes are
confirmed."""


def stage_of(view: InvestigationView, names: Callable[[str], bool], found: bool) -> dict[str, Any]:
    """How far one planted bug got in one run: its stage, with the screen's pooled k/n and the tests' verdicts."""
    class_prompt = view.started.class_prompt if view.started is not None else None
    base_k = base_n = 0
    pooled: dict[str, tuple[int, int]] = {}
    """Screening images of each caption naming the bug: a look adds to them, a screen's row (which pools its
    caption's earlier looks) replaces them."""
    for r in view.returned:
        x = r.result
        if isinstance(x, generate_and_classify.Result) and x.screen is not None:
            for row in x.screen.captions:
                if names(row.caption):
                    pooled[caption_key(row.caption)] = (row.k, row.n)
        elif isinstance(x, generate_and_classify.Result):
            failures = x.summary.failures
            prompt = r.arguments.get("prompt")
            if prompt == class_prompt:
                base_k += failures.k
                base_n += failures.n
            elif names(str(prompt or "")):
                k, n = pooled.get(caption_key(str(prompt)), (0, 0))
                pooled[caption_key(str(prompt))] = (k + failures.k, n + failures.n)
    screen_k = sum(k for k, _ in pooled.values())
    screen_n = sum(n for _, n in pooled.values())
    proposed = any(names(p.caption) for p in view.proposals)
    tests = [t for t in view.tests if t.mode != "counterfactual" and names(t.caption)]
    recorded = any(names(f.caption) for f in view.recorded)
    discovery = [t for t in tests if t.purpose == "discovery"]
    confirmation = [t for t in tests if t.purpose == "confirmation"]
    p0 = (base_k + 1) / (base_n + 2) if base_n else None
    p2 = None
    if p0 is not None and screen_n:  # a Beta prior with the weight of two images, centred on the baseline rate
        p2 = float(sps.beta.sf(min(2 * p0, 1.0), screen_k + 2 * p0, screen_n - screen_k + 2 * (1 - p0)))
    screen = {"k": screen_k, "n": screen_n, "p_twice_baseline": p2}
    if found:
        stage = "found"
    elif recorded:
        stage = "recorded, not real"
    elif any(t.verdict == "supported" for t in confirmation):
        stage = "confirmed, not recorded"
    elif confirmation:
        stage = "confirmation not significant"
    elif any(t.verdict == "supported" for t in discovery):
        stage = "supported, not confirmed"
    elif discovery:
        stage = "tested, not supported"
    elif screen_n:
        p = screen["p_twice_baseline"]
        phrasings = sum(len(m.findings) - 1 for m in view.mode_claims())
        if p is not None and p >= WAITED_AT and phrasings:
            stage = "waited behind a mode's phrasings"
        elif p is not None and p >= 0.9:
            stage = "screened, not tested"
        else:
            stage = "screened out"
    elif proposed:
        stage = "proposed, not screened"
    else:
        stage = "never proposed"
    return {"stage": stage, "screen": screen, "tests": len(discovery), "confirmations": len(confirmation)}


def miss_counts(bugs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per stage, the planted bugs the classifier learned (oracle ratio >= LEARNED) that reached it; and the bugs
    it did not learn, apart."""
    learned = [b for b in bugs if (b.get("ratio") or 0) >= LEARNED]
    counts = {s: sum(1 for b in learned if b["stage"] == s) for s in STAGES}
    return {"learned": len(learned), "not_learned": len(bugs) - len(learned),
            "not_learned_found": sum(1 for b in bugs if (b.get("ratio") or 0) < LEARNED and b["stage"] == "found"),
            "stages": counts}
