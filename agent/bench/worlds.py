"""Which worlds a benchmark runs: ``--worlds default,random:5,my.yaml`` parsed into validated world configs.

``random:N`` names random worlds 0..N-1 (``sleuth world random --seed S``); any other item is a world config file or
a packaged world's name. Every world is loaded (validated) when the spec is parsed, so a bad item fails before any
work starts, with one line naming it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from sleuth.tools.backends.base import BackendError
from sleuth.tools.backends.toyworld.config import World, load_world
from sleuth.tools.backends.toyworld.random_world import random_world

MAX_RANDOM = 1000
_RANDOM = re.compile(r"random:(.*)")


@dataclass(frozen=True)
class WorldSpec:
    key: str
    """The world's name, unique within a benchmark (results are filed under it)."""
    source: str
    """How it was named: 'random:S', a packaged name, or a file path."""
    world: World


def packaged_worlds() -> list[str]:
    root = resources.files("sleuth.tools.backends.toyworld").joinpath("worlds")
    return sorted(f.name.removesuffix(".yaml") for f in root.iterdir() if f.name.endswith(".yaml"))


def _random_count(item: str, text: str) -> int:
    if not text.strip().isdigit() or not 1 <= int(text) <= MAX_RANDOM:
        raise ValueError(f"--worlds: {item!r}: expected random:N with N a count from 1 to {MAX_RANDOM} "
                         "(random worlds 0..N-1)")
    return int(text)


def parse_worlds(text: str) -> list[WorldSpec]:
    """The worlds a comma list names, in order, each once."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ValueError("--worlds: no world named; e.g. --worlds random:20 or --worlds default,my.yaml")
    specs: list[WorldSpec] = []
    for item in items:
        m = _RANDOM.fullmatch(item)
        if m:
            specs += [WorldSpec(f"random-{s}", f"random:{s}", random_world(s))
                      for s in range(_random_count(item, m.group(1)))]
            continue
        if not Path(item).is_file() and item not in packaged_worlds():
            raise ValueError(f"--worlds: {item!r}: no such file, not a packaged world ({', '.join(packaged_worlds())})"
                             " and not random:N")
        try:
            world = load_world(item)
        except BackendError as e:
            raise ValueError(f"--worlds: {e}") from None
        specs.append(WorldSpec(world.name, item, world))
    out: dict[str, WorldSpec] = {}
    for s in specs:
        seen = out.get(s.key)
        if seen is None:
            out[s.key] = s
        elif seen.world.config_hash() != s.world.config_hash():
            raise ValueError(f"--worlds: two different worlds are named {s.key!r} ({seen.source}, {s.source})")
    return list(out.values())


def bench_classes(world: World, bug_free: int = 0, classes: Sequence[str] | None = None) -> list[tuple[str, bool]]:
    """(class, bug_free) pairs to investigate: ``classes`` if given (["all"]: every class), else the classes with
    planted bugs plus ``bug_free`` classes without one (drawn with the world's seed: the same world, the same
    classes)."""
    labels = list(world.labels.labels)
    planted = [b.class_ for b in world.bugs]
    if classes and list(classes) == ["all"]:
        classes = labels
    if classes:
        unknown = [c for c in classes if c not in labels]
        if unknown:
            raise ValueError(f"world {world.name} has no class {unknown[0]!r} (classes: {', '.join(labels)})")
        return [(c, c not in planted) for c in classes]
    with_bugs = [c for c in labels if c in planted]
    others = [c for c in labels if c not in planted]
    random.Random(world.seed).shuffle(others)
    return [(c, False) for c in with_bugs] + [(c, True) for c in sorted(others[:bug_free], key=labels.index)]
