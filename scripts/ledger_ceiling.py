"""What the LLM planner would find if its model copied the ledger's suggestion every turn, offline and in seconds.

Each turn takes the ledger's suggested calls (agent/llm/ledger.py); where it suggests words only, the baseline look,
perturb_caption with n=100, or finish. It is the ceiling of the ledger's policy, not a measurement of any model:
a change to the ledger is tried here on the default world before a run with a model.

    python scripts/ledger_ceiling.py --classes cat,crayfish,fly --budget 6000
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from sleuth.agent.bench.discovery import names_bug
from sleuth.agent.config import PlannerConfig, RunConfig
from sleuth.agent.events import Event, ToolCall
from sleuth.agent.llm.ledger import suggestion
from sleuth.agent.runner import Turn
from sleuth.agent.session import Session
from sleuth.tools.backends.toyworld import load_backends
from sleuth.tools.backends.toyworld.config import load_world
from sleuth.tools.cache import PredictionCache


class LedgerCopy:
    """Takes the ledger's suggestion every turn."""

    name = "ledger-copy"

    def __init__(self, class_prompt: str) -> None:
        self.class_prompt = class_prompt
        self.turns = 0

    def next_turn(self, events: Sequence[Event]) -> Turn:
        self.turns += 1
        step, calls = suggestion(events)
        if not calls:
            args: dict[str, Any]
            if step.startswith("generate_and_classify of the class prompt"):
                calls = [{"name": "generate_and_classify",
                          "arguments": {"prompt": self.class_prompt, "n": 100, "effect": 3.0}}]
            elif step.startswith("perturb_caption"):
                calls = [{"name": "perturb_caption", "arguments": {"caption": self.class_prompt, "n": 100}}]
            else:
                args = {"summary": "The ledger's next step: " + step[:300]}
                calls = [{"name": "finish", "arguments": args}]
        return Turn(reasoning=step[:300], tool_calls=[
            ToolCall(id=f"c{self.turns}_{i}", name=c["name"], arguments=c["arguments"]) for i, c in enumerate(calls)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--classes", default="cat,crayfish,fly")
    ap.add_argument("--budget", type=int, default=6000)
    ap.add_argument("--world", default=None, help="a world config file (default: the default world)")
    ap.add_argument("--out", type=Path, default=None, help="where the transcripts go (default: a temporary folder)")
    a = ap.parse_args()
    world = load_world(a.world)
    backends = load_backends(world)
    out = a.out or Path(mkdtemp(prefix="ledger-ceiling-"))
    print(f"transcripts in {out}")
    for label in a.classes.split(","):
        # declared as the llm planner declares (its confirmation attempts for the budget)
        config = RunConfig.model_validate({"class": label, "seed": 0, "budget": a.budget,
                                           "planner": PlannerConfig.model_validate({"name": "llm:ledger-copy"})})
        session = Session(backends=backends, config=config, run_dir=out / label, cache=PredictionCache())
        planner = LedgerCopy(session.investigation.class_prompt)
        t0 = time.perf_counter()
        result = session.run(planner, max_turns=200)
        inv = session.investigation
        found = [f.caption for f in inv.findings if f.confirmed]
        bugs = [c for c in found if any(names_bug(c, b, world) for b in world.bugs if b.class_ == label)]
        print(f"{label}: {result.status}, {result.n_turns} turns, {inv.budget.used:,} images, {len(found)} findings, "
              f"{len(bugs)} naming a planted bug {bugs}, {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
