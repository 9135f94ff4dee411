"""The world stays on the far side of the images: nothing a planner or a tool holds leads to a world config.

Tools reach models through interface views (``tools/backends/base.py``); the world config, its priors, vocabulary
and planted bugs, the oracle and the objects that hold them (the toyworld implementations) must not be reachable
from a tool context, a session or a planner by following attributes, dataclass fields, slots, containers and bound
methods. The perturbation vocabulary is one object whatever world is loaded.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from sleuth.agent.config import PlannerConfig
from sleuth.agent.llm.client import LLMClient, LLMConfig
from sleuth.agent.planners import PlanFor, build_planner
from sleuth.agent.planners.llm import LLMPlanner
from sleuth.agent.session import Session
from sleuth.tools import investigation_tools, perturb_caption
from sleuth.tools.backends.toyworld import (
    Oracle,
    captioner,
    classifier,
    config,
    editor,
    embedder,
    generator,
    load_backends,
    load_world,
    parser,
    render,
)
from sleuth.tools.backends.toyworld.oracle import PlantedBug
from sleuth.tools.cache import PredictionCache
from sleuth.tools.vocabulary import general_vocabulary
from tests.fakeworld import new_session

CAT = "a realistic photograph of a cat"
FORBIDDEN = (config.World, config.Vocabularies, config.Value, config.ClassSpec, config.Bug, config.Decoy,
             config.Departure, Oracle, PlantedBug, parser.Lexicon, render.Renderer, generator.ToyGenerator,
             classifier.ToyClassifier, captioner.ToyCaptioner, embedder.ToyEmbedder, editor.ToyEditor)
"""The world config and its parts, the oracle, and the implementations that keep a world."""
_LEAVES = (str, bytes, int, float, complex, bool, type(None), np.ndarray, np.generic, Path, range)


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield f"[{k!r}]", k
            yield f"[{k!r}]", v
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for i, v in enumerate(obj):
            yield f"[{i}]", v
    elif isinstance(obj, types.MethodType):
        yield ".__self__", obj.__self__
    elif isinstance(obj, functools.partial):
        yield ".func", obj.func
        yield from ((f".args[{i}]", a) for i, a in enumerate(obj.args))
        yield from ((f".keywords[{k}]", v) for k, v in obj.keywords.items())
    elif isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type)):
        return  # code, not state: a view's implementation lives in its closures, past this boundary
    else:
        if dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                if hasattr(obj, f.name):
                    yield f".{f.name}", getattr(obj, f.name)
        for k, v in getattr(obj, "__dict__", {}).items():
            yield f".{k}", v
        for cls in type(obj).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if isinstance(slot, str) and hasattr(obj, slot):
                    yield f".{slot}", getattr(obj, slot)


def reachable(root: Any, name: str) -> dict[int, tuple[str, Any]]:
    """Every object reachable from ``root``, by id, with the path that first reached it."""
    seen: dict[int, tuple[str, Any]] = {}
    stack = [(name, root)]
    while stack:
        path, obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _LEAVES):
            continue
        seen[id(obj)] = (path, obj)
        stack.extend((path + step, child) for step, child in _children(obj))
    return seen


def assert_isolated(root: Any, name: str, world: config.World) -> int:
    owned = {id(world), id(world.vocabulary), id(world.default_priors), id(world.bugs), id(world.decoys),
             *(id(c.priors) for c in world.classes), *(id(p) for p in world.default_priors.values())}
    found = reachable(root, name)
    leaks = [(path, type(obj).__name__) for i, (path, obj) in found.items()
             if isinstance(obj, FORBIDDEN) or i in owned]
    assert not leaks, f"reachable from {name}: {leaks[:5]}"
    return len(found)


@pytest.fixture(scope="module")
def world() -> config.World:
    return load_world()


@pytest.fixture(scope="module")
def session(world: config.World, tmp_path_factory: pytest.TempPathFactory) -> Session:
    """A toyworld session after every tool has run once (so its caches and stores hold state)."""
    backends = load_backends(world)
    s = new_session(backends, tmp_path_factory.mktemp("run"), cache=PredictionCache(), budget=5000)
    reg = investigation_tools()
    base = reg.call("generate_and_classify", {"prompt": CAT, "n": 200}, s.ctx)
    reg.call("caption_failures", {"measurement_id": base.measurement_id}, s.ctx)
    reg.call("perturb_caption", {"caption": CAT, "n": 3}, s.ctx)
    reg.call("measure_rate", {"caption": CAT + " at night.", "max_n": 100}, s.ctx)
    reg.call("measure_rate", {"caption": CAT + " at night.", "mode": "counterfactual", "max_n": 40}, s.ctx)
    reg.call("edit_image", {"images": base.success_images[:2], "source_caption": CAT,
                            "target_caption": CAT + " at night."}, s.ctx)
    return s


def test_the_walk_finds_the_world_where_it_is(world: config.World) -> None:
    # The test can fail: an implementation object holds the world, and a bound method leads to its owner.
    gen = generator.ToyGenerator(world)
    with pytest.raises(AssertionError, match="World"):
        assert_isolated({"generate": gen.generate}, "bound", world)
    with pytest.raises(AssertionError, match="ToyGenerator"):
        assert_isolated([gen], "list", world)


def test_no_world_reachable_from_a_tool_context_or_a_session(session: Session, world: config.World) -> None:
    n = assert_isolated(session.ctx, "ctx", world)
    assert n > 1000  # the walk went through the investigation's samples, images, tests and backends
    assert_isolated(session, "session", world)
    assert_isolated(session.investigation.backends, "backends", world)


def test_no_world_reachable_from_any_planner(session: Session, world: config.World) -> None:
    prompt = session.backends.prompt_for("cat")
    for name in ("protocol", "wiles", "random"):
        labels = session.backends.classifier.labels.labels
        planner = build_planner(PlannerConfig(name=name), PlanFor(label="cat", class_prompt=prompt, labels=labels,
                                                                  budget=5000))
        planner.next_turn([])  # started: its script and state exist
        assert_isolated(planner, name, world)
    client = LLMClient(LLMConfig(model="openai/stub", api_base="http://127.0.0.1:9"))
    llm = LLMPlanner(client, investigation_tools(), label="cat", class_prompt=prompt,
                     labels=session.backends.classifier.labels.labels, budget=5000)
    assert_isolated(llm, "llm", world)


def test_the_perturbation_vocabulary_is_one_object_whatever_the_world(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    used: list[object] = []
    monkeypatch.setattr(perturb_caption, "general_vocabulary", lambda: used.append(general_vocabulary()) or used[-1])
    # Another world: the default one with its values renamed and its bugs moved (same renderer, other lists).
    data = load_world().model_dump(mode="json", by_alias=True)
    data["name"] = "renamed"
    data["bugs"] = data["bugs"][3:]
    for v in data["vocabulary"]["background"]:
        v["words"] = [w + "y" for w in v["words"]]
    other = tmp_path / "renamed.yaml"
    other.write_text(yaml.safe_dump(data))
    edits = []
    for w in (None, "nobugs", str(other)):
        backends = load_backends(w)
        s = new_session(backends, tmp_path / str(len(edits)), cache=PredictionCache(), budget=100)
        r = investigation_tools().call("perturb_caption", {"caption": CAT, "n": 100, "rendered_only": False}, s.ctx)
        edits.append([(e.type, e.caption) for e in r.edits])
    assert len(used) == 3 and all(v is general_vocabulary() for v in used)
    assert edits[0] == edits[1] == edits[2] and len(edits[0]) > 150
