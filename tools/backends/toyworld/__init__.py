"""toyworld: the embedded offline world with planted bugs.

A world config names classes, attribute vocabularies, natural priors and the training set's planted departures;
the generator renders scenes from captions, a small CNN trained on the biased training set is the classifier
under audit, an attribute network captions and embeds, and the editor re-renders a scene with an attribute
changed. ``Oracle`` holds the ground truth (for benchmarks and tests only).
"""

from __future__ import annotations

from pathlib import Path

from sleuth.tools.backends.base import Backends, Vocabulary
from sleuth.tools.backends.toyworld.captioner import LIGHTS, PLACES, ToyCaptioner
from sleuth.tools.backends.toyworld.classifier import ToyClassifier
from sleuth.tools.backends.toyworld.config import World, load_world
from sleuth.tools.backends.toyworld.editor import ToyEditor
from sleuth.tools.backends.toyworld.embedder import ToyEmbedder
from sleuth.tools.backends.toyworld.generator import ToyGenerator
from sleuth.tools.backends.toyworld.oracle import CLASS_PROMPT, Oracle, PlantedBug
from sleuth.tools.backends.toyworld.train import Progress

__all__ = ["CLASS_PROMPT", "Oracle", "PlantedBug", "World", "load_backends", "load_world", "vocabulary"]


def vocabulary(world: World) -> Vocabulary:
    """The world's attribute words, phrased for offline caption perturbation (LANCE edit types)."""
    voc = world.vocabulary
    return Vocabulary(
        subject=["small", "large", "young", "sleeping"],
        object=[f"a {v.name}" for v in voc.co_object if v.name != "none"],
        background=[PLACES.get(v.name, f"on the {v.name}").removeprefix("it is ") for v in voc.background],
        adjective=[v.name for v in voc.colour],
        domain=["pencil sketch" if v.name == "sketch" else v.name for v in voc.domain if v.name != "photo"],
        lighting=[LIGHTS[v.name].removeprefix("it is ") for v in voc.lighting if v.name in LIGHTS],
    )


def load_backends(world: str | Path | World | None = None, *, size: int = 64, device: str = "cpu",
                  progress: Progress | None = None) -> Backends:
    """All five toyworld backends for ``world`` (a config path, a packaged world name, or None: the default).

    Networks load on first use; a world without shipped or cached weights trains then (``progress`` is called as
    ``(task, done, total)``) and caches them under ``$SLEUTH_CACHE`` or ``~/.cache/sleuth/toyworld``.
    """
    w = world if isinstance(world, World) else load_world(world)
    generator = ToyGenerator(w, size)
    captioner = ToyCaptioner(w, device, progress)
    return Backends(
        generator=generator,
        classifier=ToyClassifier(w, device, progress),
        captioner=captioner,
        embedder=ToyEmbedder(captioner),
        editor=ToyEditor(generator),
        vocabulary=vocabulary(w),
        class_prompt=CLASS_PROMPT,
    )
