"""The generator: prompt + seed -> a rendered scene, with the scene kept in ``Generation.meta`` for the editor."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sleuth.tools.backends.base import BackendError, Generation
from sleuth.tools.backends.toyworld.config import World
from sleuth.tools.backends.toyworld.parser import Lexicon, ParsedPrompt, Scene, parse, sample_scenes
from sleuth.tools.backends.toyworld.render import Renderer

META_KEY = "toyworld"


class ToyGenerator:
    """Text -> image for one world: parse the prompt, draw the scene from the natural priors, render it."""

    def __init__(self, world: World, size: int = 64) -> None:
        if not 32 <= size <= 128:
            raise BackendError(f"toyworld renders 32 to 128 px images, not {size}")
        self.world = world
        self.size = size
        # Hashed once: every image's metadata carries it, and hashing the config costs ~0.5 ms.
        self.config_hash = world.config_hash()
        self.id = f"toyworld-render:{world.name}:{self.config_hash[:8]}:{size}px"
        self._renderer: Renderer | None = None
        self._lexicon: Lexicon | None = None
        self._parsed: dict[str, ParsedPrompt] = {}

    @property
    def renderer(self) -> Renderer:
        if self._renderer is None:
            self._renderer = Renderer(self.world, self.size)
        return self._renderer

    def parse(self, prompt: str) -> ParsedPrompt:
        if prompt not in self._parsed:
            if self._lexicon is None:
                self._lexicon = Lexicon(self.world)
            if len(self._parsed) > 4096:
                self._parsed.clear()
            self._parsed[prompt] = parse(prompt, self.world, self._lexicon)
        return self._parsed[prompt]

    def unrendered(self, prompts: Sequence[str]) -> list[tuple[str, ...]]:
        """The words of each prompt the parser cannot render, without drawing anything (a text encoder's feedback)."""
        return [tuple(self.parse(p).unrendered) for p in prompts]

    def scenes(self, prompts: Sequence[str], seeds: Sequence[int]) -> list[Scene]:
        if len(prompts) != len(seeds):
            raise BackendError(f"generate needs one seed per prompt, got {len(prompts)} prompts and {len(seeds)} seeds")
        out: list[Scene | None] = [None] * len(prompts)
        groups: dict[str, list[int]] = {}
        for i, p in enumerate(prompts):
            groups.setdefault(p, []).append(i)
        for p, rows in groups.items():
            drawn = sample_scenes(self.parse(p), np.asarray([seeds[i] for i in rows], dtype=np.int64), self.world)
            for i, sc in zip(rows, drawn):
                out[i] = sc
        return [sc for sc in out if sc is not None]

    def meta(self, prompt: str, seed: int, scene: Scene) -> dict:
        return {META_KEY: self.config_hash, "world": self.world.name, "size": self.size,
                "prompt": prompt, "seed": int(seed), "scene": scene.to_dict()}

    def generate(self, prompts: Sequence[str], seeds: Sequence[int]) -> list[Generation]:
        scenes = self.scenes(prompts, seeds)
        images = self.renderer.render(scenes)
        return [Generation(image=img, prompt=p, seed=int(s), unrendered=tuple(self.parse(p).unrendered),
                           meta=self.meta(p, s, sc))
                for img, p, s, sc in zip(images, prompts, seeds, scenes)]

    def images(self, prompts: Sequence[str], seeds: Sequence[int]) -> np.ndarray:
        """Only the pixels (no per-image records): the fast path for benchmarks and the oracle."""
        return self.renderer.render(self.scenes(prompts, seeds))
