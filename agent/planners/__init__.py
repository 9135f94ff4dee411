"""Planners: whatever decides the next turn (reasoning, tool calls or a final answer) behind ``runner.Planner``.

``PLANNERS`` is the one registry of planners every command builds from (``--planner``, an audit's ``planner.name``,
``sleuth bench --planners``); ``build_planner`` makes one from a ``PlannerConfig``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sleuth.agent.config import PlannerConfig
from sleuth.agent.runner import Planner
from sleuth.tools.defaults import ALPHA, BASELINE_N, MAX_CONFIRMATIONS
from sleuth.tools.designs import ConfirmationDesign

Mode = Literal["investigate", "chat"]
PROTOCOL_BASELINE_N = 300
"""The protocol planner's baseline: strong failures show against it, and images are the cost."""


@dataclass(frozen=True)
class PlanFor:
    """What a planner is built for."""

    label: str
    class_prompt: str
    labels: tuple[str, ...]
    budget: int
    seed: int = 0
    alpha: float = ALPHA
    mode: Mode = "investigate"
    confirmations: int = MAX_CONFIRMATIONS
    """The declared confirmation attempts (each tested at alpha / this)."""
    designs: tuple[ConfirmationDesign, ...] | None = None
    """The confirmation sizes the run config declared, if it did (else a planner may declare its own with its
    first confirmation)."""


@dataclass(frozen=True)
class PlannerSpec:
    name: str
    help: str
    build: Callable[[PlannerConfig, PlanFor], Planner]
    offline: bool = True
    """Needs no language model (the benchmark's default set)."""
    adversarial: bool = False
    """A script that tries to get unsupported findings past the tools (calibration only; never a default)."""
    baseline_n: int = BASELINE_N
    """Images of the class baseline it asks for unless the config says otherwise."""
    max_turns: int = 100
    """Most turns of a run unless the config says otherwise."""
    confirmations: Callable[[int], int] | None = None
    """The confirmation attempts it declares for a budget (None: MAX_CONFIRMATIONS)."""


def confirmations_by_budget(budget: int) -> int:
    """One confirmation attempt per 250 images of the budget, from MAX_CONFIRMATIONS to 80 (each attempt is tested at
    alpha over the family's size)."""
    return max(MAX_CONFIRMATIONS, min(80, budget // 250))


PROTOCOL_CONFIRMATIONS = 40
"""The protocol planner's declared confirmation attempts, whatever the budget."""


def protocol_confirmations(budget: int) -> int:
    """The protocol planner's: PROTOCOL_CONFIRMATIONS for any budget. Each attempt is tested at alpha over the
    declared family, so a family that grew with the budget would make a run given 20,000 images confirm less than
    one given 10,000 by the time both have spent 5,000: what a run finds by N images must not depend on the budget
    it was given. Its attempts go to distinct failure modes first, so 40 leave room for phrasings."""
    return PROTOCOL_CONFIRMATIONS


def llm_confirmations(budget: int) -> int:
    """The LLM planner's: one confirmation attempt per 125 images, from MAX_CONFIRMATIONS to 80. Its ledger suggests
    confirming every supported discovery in the screen's order, so attempts, not images, ran out first: copying the
    ledger at 24 attempts (one per 250 images) ended the crayfish's 6,000 images at 2,854, its planted bug untested
    (scripts/ledger_ceiling.py)."""
    return confirmations_by_budget(2 * budget)


def _protocol(c: PlannerConfig, p: PlanFor) -> Planner:
    from sleuth.agent.planners.protocol import ProtocolPlanner

    return ProtocolPlanner(p.label, p.class_prompt, baseline_n=c.baseline_n or PROTOCOL_BASELINE_N, budget=p.budget,
                           confirmations=p.confirmations, designs=list(p.designs) if p.designs else None,
                           proposer=c.proposer)


def _protocol_v2(c: PlannerConfig, p: PlanFor) -> Planner:
    from sleuth.agent.planners.protocol_v2 import ProtocolV2Planner

    return ProtocolV2Planner(p.label, p.class_prompt, baseline_n=c.baseline_n or PROTOCOL_BASELINE_N, budget=p.budget,
                             name="protocol-v2")


def _protocol_v1(c: PlannerConfig, p: PlanFor) -> Planner:
    from sleuth.agent.planners.protocol_v1 import ProtocolV1Planner

    return ProtocolV1Planner(p.label, p.class_prompt, baseline_n=c.baseline_n or BASELINE_N, budget=p.budget,
                             name="protocol-v1")


def _wiles(c: PlannerConfig, p: PlanFor) -> Planner:
    from sleuth.agent.planners.protocol_v1 import ProtocolV1Planner

    return ProtocolV1Planner(p.label, p.class_prompt, baseline_n=c.baseline_n or BASELINE_N, explore=False,
                             refine=False, counterfactual=False, name="wiles")


def _random(c: PlannerConfig, p: PlanFor) -> Planner:
    from sleuth.agent.planners.random_perturb import RandomPerturbationPlanner

    return RandomPerturbationPlanner(p.label, p.class_prompt, budget=p.budget, seed=p.seed,
                                     baseline_n=c.baseline_n or BASELINE_N)


def _llm(c: PlannerConfig, p: PlanFor) -> Planner:
    from sleuth.agent.llm import LLMClient
    from sleuth.agent.llm.context import ContextConfig
    from sleuth.agent.planners.llm import LLMPlanner
    from sleuth.tools import investigation_tools

    assert c.llm is not None  # PlannerConfig refuses the llm planner without a model
    client = LLMClient(c.llm)
    planner = LLMPlanner(client, investigation_tools(), label=p.label, class_prompt=p.class_prompt, labels=p.labels,
                         budget=p.budget, alpha=p.alpha, mode=p.mode, confirmations=p.confirmations,
                         context=ContextConfig(max_tokens=c.context_tokens, sees_images=c.sees_images))
    return planner


def _adversary(name: str) -> Callable[[PlannerConfig, PlanFor], Planner]:
    def build(c: PlannerConfig, p: PlanFor) -> Planner:
        from sleuth.agent.planners.adversarial import CLASSES

        return CLASSES[name](name, p.label, p.class_prompt)

    return build


_ADVERSARY_HELP = {
    "adv-early": "adversary: records straight after discovery, then on unadjusted p-values",
    "adv-mismatch": "adversary: cites one caption's discovery for another caption's confirmation",
    "adv-repeat": "adversary: confirms one caption over and over until an attempt passes",
    "adv-many": "adversary: confirms as many different captions as the tools allow",
    "adv-peek": "adversary: the smallest confirmation baseline, then asks to top it up; many small looks",
}

PLANNERS: dict[str, PlannerSpec] = {s.name: s for s in (
    PlannerSpec("protocol", "an anytime search: every caption and single-attribute perturbation screened on a "
                            "ladder of small looks, tests and confirmation at once, in passes at 3x, 2x and 1.5x the "
                            "class's failure rate while images remain; distinct findings by what their failures "
                            "show (offline, deterministic; the default)",
                _protocol, baseline_n=PROTOCOL_BASELINE_N, max_turns=1000, confirmations=protocol_confirmations),
    PlannerSpec("protocol-v2", "the earlier protocol: one pass at 3x, at most two findings per failure mode, a stop "
                               "when nothing plausible at 3x is left", _protocol_v2, baseline_n=PROTOCOL_BASELINE_N),
    PlannerSpec("protocol-v1", "the earlier protocol: screens, then tests two dozen perturbations and the caption "
                               "hypotheses, refines, counterfactuals and confirms up to ten at the end", _protocol_v1),
    PlannerSpec("wiles", "captioning of failures and confirmation only (Wiles et al.'s core loop, no refinement or "
                         "edits)", _wiles),
    PlannerSpec("random", "random caption perturbations on a fixed sample size, same budget, confirmation", _random),
    PlannerSpec("llm", "a language model through litellm (--llm MODEL)", _llm, offline=False,
                confirmations=llm_confirmations),
    *(PlannerSpec(name, text, _adversary(name), adversarial=True) for name, text in _ADVERSARY_HELP.items()),
)}


OFFLINE_PLANNERS = tuple(name for name, spec in PLANNERS.items() if spec.offline and not spec.adversarial)
"""The planners that need no language model (the benchmark runs them by default)."""

ADVERSARIAL_PLANNERS = tuple(name for name, spec in PLANNERS.items() if spec.adversarial)
"""Scripts that play tricks on the tools (``sleuth bench discovery --calibrate`` runs them)."""


def baseline_images(config: PlannerConfig) -> int:
    """Images of the class baseline the configured planner asks for."""
    spec = PLANNERS.get(config.name)
    return config.baseline_n or (spec.baseline_n if spec is not None else BASELINE_N)


def declared_confirmations(name: str, budget: int) -> int:
    """The confirmation attempts the planner ``name`` declares for ``budget`` images."""
    spec = PLANNERS.get(name)
    return spec.confirmations(budget) if spec is not None and spec.confirmations is not None else MAX_CONFIRMATIONS


def max_turns(config: PlannerConfig) -> int:
    """Most turns of a run of the configured planner."""
    spec = PLANNERS.get(config.name)
    return config.max_turns or (spec.max_turns if spec is not None else 100)


def build_planner(config: PlannerConfig, target: PlanFor) -> Planner:
    """The planner ``config`` names, built for ``target``."""
    try:
        spec = PLANNERS[config.name]
    except KeyError:
        raise ValueError(f"unknown planner {config.name!r} (known: {', '.join(PLANNERS)})") from None
    return spec.build(config, target)
