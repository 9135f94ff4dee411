"""The editor: toyworld's analogue of inversion + prompt-to-prompt.

An image toyworld generated carries its scene in ``Generation.meta``; editing re-renders that scene with the
attributes that differ between the parsed source and target captions changed, and everything else (pose, size,
position, textures, noise) fixed. An image toyworld did not make cannot be inverted: that is a ``BackendError``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from sleuth.tools.backends.base import BackendError, EditCost, EditOutcome, Generation
from sleuth.tools.backends.toyworld.generator import META_KEY, ToyGenerator
from sleuth.tools.backends.toyworld.parser import ParsedPrompt, Scene, pick, uniforms

ATTRS = ("background", "colour", "co_object", "co_colour", "lighting", "domain")


class ToyEditor:
    def __init__(self, generator: ToyGenerator) -> None:
        self.generator = generator
        self.world = generator.world
        self.id = f"toyworld-editor:{self.world.name}"
        self.cost = EditCost(inversion=0.0, edit=1.0)
        """Reading the scene back is free; an edit renders one image."""
        self.sham_is_placebo = True
        """An edit changes only the attributes the parsed captions disagree on, and a neutral phrasing parses to
        nothing: its edit re-renders the scene unchanged, as the sham does (tests/test_placebo.py checks it)."""

    def invert(self, generation: Generation) -> Scene:
        """The scene behind ``generation``; raises if the image is not an untouched toyworld render."""
        meta = generation.meta or {}
        if META_KEY not in meta or "scene" not in meta:
            raise BackendError(f"{self.id} can only edit images toyworld generated; this one carries no toyworld scene")
        if meta[META_KEY] != self.generator.config_hash:
            raise BackendError(f"{self.id}: the image comes from another toyworld config "
                               f"(world {meta.get('world')!r}); load that world to edit it")
        if meta.get("size") != self.generator.size:
            raise BackendError(f"{self.id}: the image is {meta.get('size')} px but this editor renders "
                               f"{self.generator.size} px")
        scene = Scene.from_dict(meta["scene"])
        again = self.generator.renderer.render([scene])[0]
        image = np.asarray(generation.image)
        if image.shape != again.shape or not np.array_equal(image, again):
            raise BackendError(f"{self.id}: the image does not re-render from its toyworld scene "
                               "(it was changed after generation), so it cannot be edited")
        return scene

    def edited_scene(self, scene: Scene, seed: int, source: ParsedPrompt,
                     target: ParsedPrompt) -> tuple[Scene, list[str]]:
        """``scene`` with the attributes the captions disagree on changed; also the names of those attributes."""
        changes: dict[str, str] = {}
        u = uniforms(np.asarray([seed]), self.world.seed + 17)[0]
        label = target.label if target.label and target.label != source.label else scene.label
        for j, attr in enumerate(ATTRS):
            before = source.scene_constraints.get(attr)
            after = target.scene_constraints.get(attr)
            if after == before or (after is None and before is None):
                continue
            current = getattr(scene, attr)
            if after is not None and current in after:
                continue
            values = self.world.vocabulary.names(attr)
            probs = self.world.natural(label, attr)
            if after is None:  # the target drops the attribute: anything the source did not say
                allowed = [v for v in values if v not in (before or [])] or values
            else:
                allowed = after
            choice = values[int(pick(np.asarray([u[j]]), probs, values, allowed)[0])]
            if choice != current:
                changes[attr] = choice
        if label != scene.label:
            changes["label"] = label
        return replace(scene, **changes), sorted(changes)  # type: ignore[arg-type]

    def edit(self, generation: Generation, source_caption: str, target_caption: str) -> EditOutcome:
        scene = self.invert(generation)
        source = self.generator.parse(source_caption)
        target = self.generator.parse(target_caption)
        new, changed = self.edited_scene(scene, generation.seed, source, target)
        image = self.generator.renderer.render([new])[0] if changed else np.asarray(generation.image).copy()
        unrendered = tuple(w for w in target.unrendered if w not in source.unrendered)
        diff = float(np.abs(image.astype(np.int16) - np.asarray(generation.image).astype(np.int16)).mean() / 255)
        meta = self.generator.meta(target_caption, generation.seed, new)
        meta["changed"] = changed
        return EditOutcome(
            image=image, source_caption=source_caption, target_caption=target_caption,
            scores={"attributes_changed": float(len(changed)), "mean_abs_pixel_change": diff},
            passed={"edit_applied": bool(changed), "fully_rendered": not unrendered},
            unrendered=unrendered, meta=meta,
        )
