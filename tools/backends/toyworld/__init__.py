"""toyworld: the embedded offline world with planted bugs.

A world config names classes, attribute vocabularies, natural priors and the training set's planted departures;
the generator renders scenes from captions, a small CNN trained on the biased training set is the classifier
under audit, an attribute network captions and embeds, and the editor re-renders a scene with an attribute
changed. ``Oracle`` holds the ground truth (for benchmarks and tests only).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sleuth.tools.backends.base import Backends
from sleuth.tools.backends.toyworld.config import World, load_world

if TYPE_CHECKING:
    from sleuth.tools.backends.toyworld.oracle import CLASS_PROMPT, Oracle, PlantedBug
    from sleuth.tools.backends.toyworld.train import Progress

__all__ = ["CLASS_PROMPT", "Oracle", "PlantedBug", "World", "load_backends", "load_world"]

# The networks import torch: the package itself stays light, so reading a world config (its classes, for a command's
# argument check) costs no torch import.
_LAZY = {"CLASS_PROMPT": "oracle", "Oracle": "oracle", "PlantedBug": "oracle"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_backends(world: str | Path | World | None = None, *, size: int = 64, device: str = "cpu",
                  progress: Progress | None = None, classifier_weights: str | Path | None = None) -> Backends:
    """All five toyworld backends for ``world`` (a config path, a packaged world name, or None: the default), as the
    interface views tools hold: nothing in them leads back to the world config.

    Networks load on first use; a world without shipped or cached weights trains then (``progress`` is called as
    ``(task, done, total)``) and caches them under ``$SLEUTH_CACHE`` or ``~/.cache/sleuth/toyworld``.
    ``classifier_weights``: the classifier's weights from that file instead (e.g. what `sleuth mitigate` wrote).
    """
    from sleuth.tools.backends.toyworld.captioner import ToyCaptioner
    from sleuth.tools.backends.toyworld.classifier import ToyClassifier
    from sleuth.tools.backends.toyworld.editor import ToyEditor
    from sleuth.tools.backends.toyworld.embedder import ToyEmbedder
    from sleuth.tools.backends.toyworld.generator import ToyGenerator
    from sleuth.tools.backends.toyworld.oracle import CLASS_PROMPT

    w = world if isinstance(world, World) else load_world(world)
    generator = ToyGenerator(w, size)
    captioner = ToyCaptioner(w, device, progress)
    return Backends(
        generator=generator,
        classifier=ToyClassifier(w, device, progress, weights=classifier_weights),
        captioner=captioner,
        embedder=ToyEmbedder(captioner),
        editor=ToyEditor(generator),
        class_prompt=CLASS_PROMPT,
    )
