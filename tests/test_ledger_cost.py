"""The ledger tells an LLM planner what a confirmation really costs with the tools' defaults."""

from __future__ import annotations

from sleuth.agent.llm.ledger import confirmation_cost, next_step
from sleuth.tools.defaults import BASELINE_N, FIRST_N


def test_the_first_confirmation_pays_for_its_baseline_and_later_ones_for_their_first_look():
    assert confirmation_cost(0) == BASELINE_N + FIRST_N == 1_100
    assert confirmation_cost(3) == FIRST_N


def test_the_ledger_says_finish_only_when_a_confirmation_cannot_be_paid_for():
    tests = [{"purpose": "discovery", "verdict": "supported", "caption": "a cat in the snow", "test_id": "t1",
              "rate_ratio": {"low": 3.0}}]
    step = next_step(tests, [], [], 0, 800, saw_baseline=True, proposals=True)
    assert step.startswith("finish: 800 images are left") and "1,100" in step
    later = next_step(tests, [], [], 1, 800, saw_baseline=True, proposals=True, declared=10)
    assert later.startswith("confirm") and "a cat in the snow" in later
