"""The oracle: ground truth for benchmarks and tests (planners never see it).

It knows the planted bugs and decoys, and measures any caption's true failure rate by large sampling. Rates of a
condition and of its class baseline are measured on the same seeds (paired: the same poses, positions and
textures), so their ratio is precise with a few thousand images.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from sleuth.tools.backends.criteria import failed
from sleuth.tools.backends.toyworld.classifier import ToyClassifier
from sleuth.tools.backends.toyworld.config import World, load_world
from sleuth.tools.backends.toyworld.generator import ToyGenerator
from sleuth.tools.backends.toyworld.parser import STOP_WORDS, ParsedPrompt, sample_scenes
from sleuth.tools.backends.toyworld.render import Renderer
from sleuth.tools.backends.toyworld.train import training_scenes

CLASS_PROMPT = "a realistic photograph of a {label}"
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class PlantedBug:
    """A planted bug (or a decoy: an attribute the classifier was trained to ignore)."""

    name: str
    class_: str
    attributes: dict[str, str]
    words: tuple[str, ...]
    """Caption words that name it."""
    caption: str
    """A full caption that asks for it."""
    kind: Literal["bug", "decoy"] = "bug"
    strength: Literal["strong", "subtle", "none"] = "none"
    confuser: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def full_caption(label: str, phrase: str) -> str:
    """A caption in the papers' style: a domain phrase leads ("a pencil sketch of a goldfish."), others follow."""
    if phrase.startswith(("a ", "an ")):
        return f"{phrase} of a {label}."
    return f"{CLASS_PROMPT.format(label=label)}. {phrase}."


class Oracle:
    def __init__(self, world: World | str | Path | None = None, classifier: ToyClassifier | None = None,
                 size: int = 64) -> None:
        self.world = world if isinstance(world, World) else load_world(world)
        self.classifier = classifier or ToyClassifier(self.world)
        self.generator = ToyGenerator(self.world, size)
        self.labels = self.world.labels

    def _words(self, phrase: str, label: str) -> tuple[str, ...]:
        label_words = set(re.findall(r"[a-z]+", label.lower()))
        return tuple(w for w in re.findall(r"[a-z]+", phrase.lower()) if w not in STOP_WORDS and w not in label_words)

    def manifest(self) -> list[PlantedBug]:
        """Every planted bug, then every decoy."""
        out = [PlantedBug(b.name, b.class_, dict(b.attributes), self._words(b.caption, b.class_),
                          full_caption(b.class_, b.caption), "bug", b.strength, b.confuser)
               for b in self.world.bugs]
        out += [PlantedBug(d.name, d.class_, {d.attribute: d.value}, self._words(d.caption, d.class_),
                           full_caption(d.class_, d.caption), "decoy", "none", None, {"train_prob": d.train_prob})
                for d in self.world.decoys]
        return out

    def bugs(self) -> list[PlantedBug]:
        return [b for b in self.manifest() if b.kind == "bug"]

    def decoys(self) -> list[PlantedBug]:
        return [b for b in self.manifest() if b.kind == "decoy"]

    def predictions(self, caption: str, n: int, seed: int = 0) -> np.ndarray:
        """Logits of ``n`` images of ``caption`` on seeds ``seed .. seed + n - 1``."""
        out = []
        for start in range(0, n, 2000):
            seeds = list(range(seed + start, seed + min(n, start + 2000)))
            out.append(self.classifier.logits(self.generator.images([caption] * len(seeds), seeds)))
        return np.concatenate(out)

    def failure_rate(self, caption: str, label: str, n: int, seed: int = 0, criterion: str = "top1",
                     k: int = 3) -> tuple[int, int]:
        """(failures, images) of ``n`` images of ``caption`` judged against ``label``."""
        bad = failed(self.predictions(caption, n, seed), label, self.labels, criterion, k=k)
        return int(bad.sum()), n

    def accuracy(self, n_per_class: int = 300, seed: int = 12345) -> float:
        """Top-1 accuracy on fresh images of the classifier's own training distribution."""
        scenes = training_scenes(self.world, n_per_class, seed, "training")
        images = Renderer(self.world, self.generator.size).render(scenes)
        pred = np.argmax(self.classifier.logits(images), axis=1)
        truth = np.asarray([self.labels.index(s.label) for s in scenes])
        return float((pred == truth).mean())

    def check(self, n: int = 2000, seed: int = 7_000_000, criterion: str = "top1",
              progress: Progress | None = None, captioner: Any = None) -> dict[str, Any]:
        """The world's numbers: accuracy, class baselines, bug and decoy rates with their ratios."""
        labels = self.labels.labels
        jobs = len(labels) + len(self.manifest()) + 1
        done = 0

        def tick() -> None:
            nonlocal done
            done += 1
            if progress is not None:
                progress("checking world", done, jobs)

        accuracy = self.accuracy()
        tick()
        base: dict[str, tuple[int, int]] = {}
        classes = []
        for label in labels:
            k, m = self.failure_rate(CLASS_PROMPT.format(label=label), label, n, seed, criterion)
            base[label] = (k, m)
            classes.append({"name": label, "baseline_rate": k / m, "k": k, "n": m})
            tick()
        rows: dict[str, list[dict[str, Any]]] = {"bug": [], "decoy": []}
        for b in self.manifest():
            logits = self.predictions(b.caption, n, seed)
            bad = failed(logits, b.class_, self.labels, criterion)
            k0, n0 = base[b.class_]
            rate, b_rate = float(bad.mean()), k0 / n0
            top = np.bincount(np.argmax(logits, axis=1)[bad], minlength=len(labels))
            rows[b.kind].append({
                "name": b.name, "class": b.class_, "caption": b.caption, "strength": b.strength,
                "confuser": b.confuser, "baseline_rate": b_rate, "rate": rate, "k": int(bad.sum()), "n": n,
                "ratio": rate / max(b_rate, 0.5 / n0),
                "most_confused_with": labels[int(np.argmax(top))] if bad.any() else None,
            })
            tick()
        report: dict[str, Any] = {
            "world": self.world.name, "config_hash": self.world.config_hash(), "criterion": criterion,
            "n_per_condition": n, "accuracy": accuracy, "classes": classes,
            "bugs": rows["bug"], "decoys": rows["decoy"],
        }
        if captioner is not None:
            report["captioner"] = captioner_accuracy(self.world, captioner, self.generator.size)
        return report


def captioner_accuracy(world: World, captioner: Any, size: int = 64, n_per_class: int = 150,
                       seed: int = 424242) -> dict[str, Any]:
    """Per-attribute accuracy of the captioner on held-out renders: overall, and under fog, night and sketch."""
    scenes = []
    for label in world.labels.labels:
        scenes += sample_scenes(ParsedPrompt({}, [], label), np.arange(n_per_class) + seed, world, "broad",
                                salt=world.seed + seed)
    images = Renderer(world, size).render(scenes)
    pred = captioner.predict(images)
    heads = ("background", "colour", "co_object", "lighting", "domain")

    def acc(rows: list[int]) -> dict[str, float]:
        return {h: float(np.mean([pred[i][h] == getattr(scenes[i], h) for i in rows])) for h in heads} if rows else {}

    everything = list(range(len(scenes)))
    return {
        "n": len(scenes),
        "accuracy": acc(everything),
        "by_condition": {
            "day photo": acc([i for i, s in enumerate(scenes) if s.lighting == "day" and s.domain == "photo"]),
            "fog": acc([i for i, s in enumerate(scenes) if s.lighting == "fog"]),
            "night": acc([i for i, s in enumerate(scenes) if s.lighting == "night"]),
            "sketch": acc([i for i, s in enumerate(scenes) if s.domain == "sketch"]),
        },
    }
