"""Training data for toyworld-clip and toyworld-sd: renders of a world's natural distribution and their captions.

A scene is drawn from the world's natural priors (the distribution the generator draws from, never the classifier's
biased training set). To let a small model see rare combinations, a share of scenes has one attribute drawn uniformly
over its values, for every class alike. Each scene gets a text naming its class and a random subset of its
attributes, in one of two styles: a prompt ("a painting of a white cat in the snow at night") or the captioner's
sentences ("the cat. it is in the snow. the cat is white."). Words are drawn from the world's own vocabulary and the
parser's synonyms, so the text encoder learns the phrasings the toyworld generator understands. A share of texts is
empty: the unconditional branch that classifier-free guidance and null-text inversion use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sleuth.tools.backends.toyworld.config import World
from sleuth.tools.backends.toyworld.parser import ParsedPrompt, Scene, sample_scenes
from sleuth.tools.backends.toyworld.render import Renderer
from sleuth.tools.backends.toyworld.synonyms import SYNONYMS

ATTRIBUTES = ("background", "colour", "co_object", "lighting", "domain")
MENTION = {"background": 0.85, "colour": 0.8, "co_object": 0.6, "lighting": 0.7, "domain": 0.8}
"""Probability that a text names the attribute (a co-occurring object and non-default values are always worth it)."""
UNIFORM_SHARE = 0.5
"""Share of scenes with one attribute drawn uniformly instead of from the prior."""
EMPTY_SHARE = 0.1
"""Share of empty texts (the unconditional branch)."""
SYNONYM_SHARE = 0.25
"""Chance of a parser synonym instead of one of the world's own words."""
CAPTION_SHARE = 0.3
"""Share of texts in the captioner's sentence style."""
SEED_BASE = 2**50
"""Training scenes' seeds start here: apart from investigations' [0, 2**41) and mitigations' [2**48, 2**50)."""

PLACE = {"grass": ("on the", "in the"), "sand": ("on the",), "snow": ("in the",), "water": ("in the",),
         "road": ("on the",), "indoor": ("",), "forest": ("in the",), "sky": ("in the",), "rock": ("on the",)}
CO = {"flower": "on a {colour}{word}", "net": "in a {word}", "person": "with a {word}", "ball": "with a {colour}{word}"}
LIGHT = {"day": "in {word}", "dusk": "at {word}", "night": "at {word}", "fog": "in the {word}"}
CAPTION_PLACES = {"grass": "it is on the grass", "sand": "it is on the sand", "snow": "it is in the snow",
                  "water": "it is in the water", "road": "it is on the road", "indoor": "it is indoors",
                  "forest": "it is in the forest", "sky": "it is in the sky", "rock": "it is on the rocks"}
CAPTION_LIGHTS = {"day": "it is daytime", "dusk": "it is at dusk", "night": "it is at night",
                  "fog": "it is in the fog"}
CAPTION_DOMAINS = {"photo": "it is a photo", "sketch": "it is a pencil sketch", "painting": "it is a painting"}


@dataclass
class Batch:
    """Rendered images (uint8, N×H×W×3), their scenes and texts."""

    images: np.ndarray
    scenes: list[Scene]
    texts: list[str]


class Captions:
    """Texts for scenes of one world, drawn with a seeded generator."""

    def __init__(self, world: World) -> None:
        self.world = world
        voc = world.vocabulary
        self.words: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
        for attr in ("background", "co_object", "lighting", "domain", "colour"):
            for v in getattr(voc, attr):
                own = [w for w in [v.name, *v.words] if w != "none"]
                extra = list(SYNONYMS.get(attr, {}).get(v.name, ()))
                self.words[(attr, v.name)] = (own, extra)
        self.class_words = {c.name: ([c.name], list(c.synonyms)) for c in world.classes}

    def word(self, key: tuple[str, str], rng: np.random.Generator) -> str:
        own, extra = self.words[key] if key in self.words else self.class_words[key[1]]
        pool = extra if extra and rng.random() < SYNONYM_SHARE else own
        return str(pool[int(rng.integers(len(pool)))])

    def class_word(self, label: str, rng: np.random.Generator) -> str:
        return self.word(("class", label), rng)

    def text(self, scene: Scene, rng: np.random.Generator) -> str:
        if rng.random() < EMPTY_SHARE:
            return ""
        said = {a: rng.random() < MENTION[a] for a in ATTRIBUTES}
        if scene.co_object == "none":
            said["co_object"] = False
        if rng.random() < CAPTION_SHARE:
            return self._sentences(scene, said, rng)
        return self._prompt(scene, said, rng)

    def _prompt(self, scene: Scene, said: dict[str, bool], rng: np.random.Generator) -> str:
        head = ""
        if said["domain"]:
            word = self.word(("domain", scene.domain), rng)
            if scene.domain == "photo" and rng.random() < 0.5:
                word = "realistic photograph"  # sleuth's own class prompt: "a realistic photograph of a {label}"
            head = f"{_article(word)} {word} of"
        colour = self.word(("colour", scene.colour), rng) + " " if said["colour"] else ""
        noun = self.class_word(scene.label, rng)
        subject = f"{head} {_article(colour or noun)} {colour}{noun}".strip()
        parts: list[str] = []
        if said["background"]:
            word = self.word(("background", scene.background), rng)
            preps = PLACE.get(scene.background, ("in the",))
            prep = preps[int(rng.integers(len(preps)))]
            parts.append(f"{prep} {word}".strip())
        if said["co_object"]:
            word = self.word(("co_object", scene.co_object), rng)
            cc = self.word(("colour", scene.co_colour), rng) + " " if rng.random() < 0.5 else ""
            parts.append(CO.get(scene.co_object, "with a {colour}{word}").format(colour=cc, word=word))
        if said["lighting"]:
            word = self.word(("lighting", scene.lighting), rng)
            parts.append(LIGHT.get(scene.lighting, "at {word}").format(word=word))
        order = rng.permutation(len(parts))
        return " ".join([subject, *(parts[i] for i in order)])

    def _sentences(self, scene: Scene, said: dict[str, bool], rng: np.random.Generator) -> str:
        noun = self.class_word(scene.label, rng)
        out = [f"the {noun}"]
        if said["background"]:
            out.append(CAPTION_PLACES.get(scene.background, f"it is in the {scene.background}"))
        if said["colour"]:
            out.append(f"the {noun} is {self.word(('colour', scene.colour), rng)}")
        if said["co_object"]:
            cc = self.word(("colour", scene.co_colour), rng)
            said_co = {"flower": f"it is on a {cc} flower", "net": "it is in a net",
                       "person": "there is a person next to it"}
            out.append(said_co.get(scene.co_object, f"there is a {cc} {scene.co_object} next to it"))
        if said["lighting"]:
            out.append(CAPTION_LIGHTS.get(scene.lighting, f"it is at {scene.lighting}"))
        if said["domain"]:
            out.append(CAPTION_DOMAINS.get(scene.domain, f"it is a {scene.domain}"))
        return ". ".join(out) + "."


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


class Scenes:
    """Scenes, renders and texts for training: counter-based, so item ``i`` of a given seed is always the same."""

    def __init__(self, world: World, seed: int, size: int = 64) -> None:
        self.world = world
        self.seed = seed
        self.renderer = Renderer(world, size)
        self.captions = Captions(world)
        self.labels = list(world.labels.labels)

    def scenes(self, start: int, n: int) -> list[Scene]:
        rng = np.random.default_rng([self.seed, start, 11])
        labels = rng.integers(len(self.labels), size=n)
        forced = rng.random(n) < UNIFORM_SHARE
        which = rng.integers(len(ATTRIBUTES), size=n)
        pick = rng.random(n)
        groups: dict[tuple[str, str, str], list[int]] = {}
        for i in range(n):
            attr = value = ""
            if forced[i]:
                attr = ATTRIBUTES[int(which[i])]
                values = self.world.vocabulary.names(attr)
                value = values[min(int(pick[i] * len(values)), len(values) - 1)]
            groups.setdefault((self.labels[int(labels[i])], attr, value), []).append(i)
        out: list[Scene | None] = [None] * n
        for (label, attr, value), rows in groups.items():
            parsed = ParsedPrompt({attr: [value]} if attr else {}, [], label)
            seeds = [SEED_BASE + self.seed * 2**32 + start + i for i in rows]
            for i, scene in zip(rows, sample_scenes(parsed, seeds, self.world), strict=True):
                out[i] = scene
        return [s for s in out if s is not None]

    def batch(self, start: int, n: int) -> Batch:
        scenes = self.scenes(start, n)
        rng = np.random.default_rng([self.seed, start, 13])
        texts = [self.captions.text(s, rng) for s in scenes]
        return Batch(self.renderer.render(scenes), scenes, texts)


def to_unit(images: np.ndarray | Sequence[np.ndarray]) -> torch.Tensor:
    """uint8 N×H×W×3 -> float N×3×H×W in [-1, 1] (the diffusers convention)."""
    x = torch.from_numpy(np.ascontiguousarray(np.stack(list(images)) if not isinstance(images, np.ndarray)
                                              else images))
    return x.permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


def to_uint8(x: torch.Tensor) -> np.ndarray:
    return ((x.clamp(-1, 1) + 1) * 127.5 + 0.5).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
