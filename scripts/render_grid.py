"""Render docs/toyworld_grid.png: a few images per class, then one row per attribute value, labelled."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sleuth.tools.backends.toyworld import load_world
from sleuth.tools.backends.toyworld.generator import ToyGenerator

CELL = 96
LABEL_W = 150


def rows(world_name: str | None) -> list[tuple[str, list[str]]]:
    world = load_world(world_name)
    out = []
    for label in world.labels.labels:
        out.append((label, [f"a realistic photograph of a {label}"] * 8))
    cycle = ["cat", "dog", "fly", "bee", "crayfish", "crab", "goldfish", "fox"]
    extra = [("in the snow", "it is in the snow"), ("on the sand", "it is on the sand"),
             ("in the water", "it is in the water"), ("on the rocks", "it is on the rocks"),
             ("in the sky", "it is in the sky"), ("in the forest", "it is in the forest"),
             ("indoors", "it is indoors"), ("on the road", "it is on the road"),
             ("on a flower", "it is on a flower"), ("in a net", "it is in a net"),
             ("with a person", "there is a person next to it"), ("with a ball", "there is a ball next to it"),
             ("at dusk", "it is at dusk"), ("at night", "it is at night"), ("in the fog", "it is in the fog")]
    for name, sentence in extra:
        out.append((name, [f"a realistic photograph of a {c}. {sentence}." for c in cycle]))
    out.append(("pencil sketch", [f"a pencil sketch of a {c}." for c in cycle]))
    out.append(("painting", [f"a painting of a {c}." for c in cycle]))
    out.append(("orange / blue", [f"a realistic photograph of an {'orange' if i % 2 else 'blue'} {c}."
                                  for i, c in enumerate(cycle)]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--world", default=None)
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "toyworld_grid.png"))
    args = p.parse_args(argv)
    gen = ToyGenerator(load_world(args.world), 64)
    table = rows(args.world)
    sheet = Image.new("RGB", (LABEL_W + 8 * CELL, len(table) * CELL), "white")
    draw = ImageDraw.Draw(sheet)
    for r, (name, prompts) in enumerate(table):
        images = [g.image for g in gen.generate(prompts, list(range(r * 10, r * 10 + len(prompts))))]
        for c, img in enumerate(images):
            cell = Image.fromarray(img).resize((CELL, CELL), Image.Resampling.NEAREST)
            sheet.paste(cell, (LABEL_W + c * CELL, r * CELL))
        draw.text((8, r * CELL + CELL // 2 - 6), name, fill="black")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    sheet.save(args.out, optimize=True)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
