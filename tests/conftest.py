"""Shared fixtures (a transcript holding one event of every kind), the test tiers and ``--module-use``.

Tiers: ``pytest`` runs the fast tier (everything not marked ``e2e`` or ``slow``), ``pytest -m e2e`` the end-to-end
tier, ``pytest -m slow`` real checkpoints, GPU, real LLM APIs and long training (docs/testing.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sleuth.agent.events import (
    ErrorEvent,
    Event,
    Finding,
    PlannerTurn,
    RunFinished,
    RunStarted,
    ToolCall,
    ToolCalled,
    ToolReturned,
    Usage,
    UserMessage,
)
from sleuth.agent.transcript import TranscriptWriter

TIERS = ("e2e", "slow")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--module-use", action="store_true",
                     help="fail unless the selected tests exercise every module of agent/ and tools/ (module_use.py)")


def pytest_configure(config: pytest.Config) -> None:
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:  # a pytest-xdist worker (make test): torch gets this worker's share of the cores, not all of them
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))
    if config.getoption("--module-use"):
        from module_use import ModuleUse, project_modules

        config.pluginmanager.register(ModuleUse(project_modules()), "module_use")


def pytest_collection_finish(session: pytest.Session) -> None:
    """A tier that selects no test of the suite is a mistake (a marker renamed or dropped), not an empty success."""
    config = session.config
    expr = config.option.markexpr
    whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.keyword
    if whole and not session.items and any(tier in expr for tier in TIERS):
        raise pytest.UsageError(f"-m {expr!r} selects no test (docs/testing.md: the tiers and their markers)")


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Tests (and the commands they start) use a cache of their own, never the user's ~/.cache/sleuth."""
    old = os.environ.get("SLEUTH_CACHE")
    os.environ["SLEUTH_CACHE"] = str(tmp_path_factory.mktemp("sleuth-cache"))
    yield
    if old is None:
        os.environ.pop("SLEUTH_CACHE", None)
    else:
        os.environ["SLEUTH_CACHE"] = old


@pytest.fixture(autouse=True)
def _fresh_seed_claims() -> None:
    """Each test starts as on a machine that never ran an investigation: no seed is claimed, so a fresh run
    confirms on draw 0 whatever ran before it (predictions stay cached: they do not depend on the claims)."""
    from tests.fakeworld import forget_seed_claims

    forget_seed_claims()


@pytest.fixture()
def sample_events() -> list[Event]:
    """Nine events, every kind; the middle one (line 5) is a tool result holding ``"k":37``."""
    return [
        RunStarted(run_id="r1", command="investigate", config={"class": "cat", "budget": 100},
                   versions={"python": "3.11"}, seeds={"seed": 0, "discovery": 0}, planner="scripted",
                   backends={"generator": "toy-gen", "classifier": "toy-cls"}),
        UserMessage(text="look for failures of cat"),
        PlannerTurn(reasoning="I measure the baseline of the class prompt first.",
                    tool_calls=[ToolCall(id="c1", name="measure_rate", arguments={"caption": "a cat", "n": 120}),
                                ToolCall(id="c2", name="measure_rate", arguments='{"caption": ')],
                    model="test-model", usage=Usage(prompt_tokens=10, completion_tokens=5), cost_usd=0.0012),
        ToolCalled(call_id="c1", name="measure_rate", arguments={"caption": "a cat", "n": 120}),
        ToolReturned(call_id="c1", name="measure_rate", ok=True,
                     result={"k": 37, "n": 120, "rate": 0.30833, "looks": list(range(12))}, duration_s=0.25),
        ToolReturned(call_id="c2", name="measure_rate", ok=False, error="arguments are not valid JSON",
                     duration_s=0.001),
        Finding(finding_id="f1", finding={"caption": "a cat in the snow", "rate_ratio": 4.2, "adjusted_p": 0.003}),
        ErrorEvent(message="ValueError: boom", where="tool measure_rate", traceback="Traceback (most recent...)"),
        RunFinished(status="completed", answer="cats in snow fail", n_findings=1),
    ]


@pytest.fixture()
def written(tmp_path: Path, sample_events: list[Event]) -> tuple[Path, list[Event]]:
    """``sample_events`` written to ``tmp_path/run/transcript.jsonl``; returns the path and the events as written."""
    path = tmp_path / "run" / "transcript.jsonl"
    with TranscriptWriter(path) as writer:
        out = [writer.append(e) for e in sample_events]
    return path, out
