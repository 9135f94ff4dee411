"""Silhouettes: each class drawn once, large, as three alpha layers (body, detail, light), facing right.

``body`` takes the object's colour, ``detail`` the class's detail colour (spots, stripes, eyes, claws' tips),
``light`` a pale translucent layer (wings, a fox's tail tip, a shark's belly). The renderer scales, rotates and
mirrors these canonical drawings into mask banks once, then only pastes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from PIL import Image, ImageDraw

CANVAS = 160
Layers = tuple[np.ndarray, np.ndarray, np.ndarray]
Pen = ImageDraw.ImageDraw


def _ellipse(d: Pen, box: tuple[float, float, float, float]) -> None:
    d.ellipse(box, fill=255)


def _cat(body: Pen, detail: Pen, light: Pen, rng: np.random.Generator) -> None:
    _ellipse(body, (34, 72, 112, 112))
    _ellipse(body, (100, 42, 140, 80))
    body.polygon([(102, 56), (106, 26), (120, 46)], fill=255)
    body.polygon([(120, 46), (136, 26), (138, 58)], fill=255)
    body.line([(38, 92), (22, 80), (14, 56), (20, 40)], fill=255, width=9, joint="curve")
    for x in (40, 56, 90, 104):
        body.rectangle((x, 100, x + 9, 138), fill=255)
    _ellipse(detail, (110, 54, 117, 61))
    _ellipse(detail, (125, 54, 132, 61))
    detail.polygon([(119, 66), (125, 66), (122, 70)], fill=255)


def _snow_leopard(body: Pen, detail: Pen, light: Pen, rng: np.random.Generator) -> None:
    _ellipse(body, (18, 74, 124, 112))
    _ellipse(body, (112, 56, 148, 88))
    _ellipse(body, (114, 48, 124, 62))
    _ellipse(body, (134, 48, 144, 62))
    body.line([(24, 90), (8, 100), (2, 128), (14, 146)], fill=255, width=14, joint="curve")
    for x in (26, 44, 96, 110):
        body.rectangle((x, 100, x + 12, 140), fill=255)
    for _ in range(26):
        cx, cy = rng.uniform(24, 120), rng.uniform(78, 108)
        r = rng.uniform(3, 5)
        detail.ellipse((cx - r, cy - r, cx + r, cy + r), outline=255, width=2)
    for _ in range(6):
        cx, cy = rng.uniform(4, 18), rng.uniform(100, 140)
        detail.ellipse((cx - 3, cy - 3, cx + 3, cy + 3), fill=255)
    _ellipse(detail, (126, 66, 132, 72))


def _dog(body: Pen, detail: Pen, light: Pen, rng: np.random.Generator) -> None:
    _ellipse(body, (26, 62, 118, 110))
    _ellipse(body, (100, 30, 142, 72))
    body.rectangle((120, 46, 158, 70), fill=255)
    body.line([(32, 78), (16, 50), (18, 34)], fill=255, width=10)
    for x in (32, 50, 92, 108):
        body.rectangle((x, 96, x + 13, 150), fill=255)
    _ellipse(detail, (98, 32, 116, 84))
    _ellipse(detail, (122, 40, 130, 48))
    _ellipse(detail, (150, 46, 160, 58))
    light.rectangle((120, 62, 156, 70), fill=255)


def _fox(body: Pen, detail: Pen, light: Pen, rng: np.random.Generator) -> None:
    _ellipse(body, (40, 76, 114, 104))
    body.polygon([(106, 58), (156, 78), (108, 92)], fill=255)
    body.polygon([(106, 62), (110, 30), (122, 58)], fill=255)
    body.polygon([(118, 60), (128, 32), (134, 64)], fill=255)
    body.polygon([(46, 86), (10, 70), (2, 96), (20, 112), (48, 98)], fill=255)
    for x in (46, 60, 92, 104):
        body.rectangle((x, 98, x + 6, 140), fill=255)
        detail.rectangle((x, 124, x + 6, 140), fill=255)
    light.polygon([(2, 96), (10, 86), (16, 108)], fill=255)
    light.polygon([(112, 84), (150, 80), (112, 94)], fill=255)
    _ellipse(detail, (124, 66, 130, 72))
    _ellipse(detail, (150, 74, 158, 81))


def _fly(body: Pen, detail: Pen, light: Pen, rng: np.random.Generator) -> None:
    light.ellipse((40, 30, 96, 78), fill=255)
    light.ellipse((70, 24, 120, 74), fill=255)
    _ellipse(body, (40, 72, 108, 102))
    _ellipse(body, (100, 68, 132, 100))
    for x in (58, 76, 94):
        body.line([(x, 96), (x - 12, 130)], fill=255, width=3)
        body.line([(x, 96), (x + 6, 130)], fill=255, width=3)
    _ellipse(detail, (112, 66, 136, 90))


def _bee(body: Pen, detail: Pen, light: Pen, rng: np.random.Generator) -> None:
    light.ellipse((48, 30, 100, 76), fill=255)
    light.ellipse((76, 26, 122, 72), fill=255)
    _ellipse(body, (34, 70, 116, 106))
    _ellipse(body, (108, 72, 136, 100))
    body.polygon([(36, 84), (18, 88), (36, 92)], fill=255)
    for x in (50, 68, 86):
        detail.rectangle((x, 66, x + 8, 110), fill=255)
    _ellipse(detail, (108, 72, 136, 100))
    for x in (62, 82, 100):
        body.line([(x, 102), (x - 6, 128)], fill=255, width=3)


def _crayfish(body: Pen, detail: Pen, light: Pen, rng: np.random.Generator) -> None:
    for k, x in enumerate(range(20, 100, 14)):
        h = 12 + k * 1.5
        _ellipse(body, (x, 84 - h, x + 20, 84 + h))
    _ellipse(body, (90, 66, 130, 102))
    body.polygon([(22, 84), (2, 64), (2, 104)], fill=255)
    for sign in (-1, 1):
        body.line([(120, 84 + sign * 10), (134, 84 + sign * 28)], fill=255, width=6)
        _ellipse(body, (126, 84 + sign * 28 - 10, 158, 84 + sign * 28 + 10))
        detail.line([(128, 84 + sign * 14), (158, 84 + sign * 60)], fill=255, width=2)
    for x in (60, 74, 88):
        body.line([(x, 96), (x - 4, 118)], fill=255, width=3)
        body.line([(x, 72), (x - 4, 50)], fill=255, width=3)
    _ellipse(detail, (120, 74, 126, 80))


def _crab(body: Pen, detail: Pen, light: Pen, rng: np.random.Generator) -> None:
    _ellipse(body, (36, 68, 124, 116))
    for sign, x0 in ((-1, 40), (1, 120)):
        for k in range(3):
            body.line([(x0, 96 + k * 6), (x0 + sign * 30, 110 + k * 14)], fill=255, width=5)
        body.line([(x0, 82), (x0 + sign * 20, 58)], fill=255, width=7)
        cx = x0 + sign * 22
        _ellipse(body, (cx - 14, 30, cx + 14, 60))
        detail.polygon([(cx - 4, 30), (cx + 4, 30), (cx, 44)], fill=255)
    for x in (68, 92):
        body.line([(x, 70), (x, 56)], fill=255, width=3)
        _ellipse(detail, (x - 4, 50, x + 4, 58))


def _goldfish(body: Pen, detail: Pen, light: Pen, rng: np.random.Generator) -> None:
    _ellipse(body, (48, 56, 120, 106))
    body.polygon([(54, 80), (12, 44), (24, 80), (12, 118)], fill=255)
    light.polygon([(54, 80), (16, 50), (26, 80), (16, 112)], fill=255)
    body.polygon([(70, 60), (86, 38), (100, 58)], fill=255)
    body.polygon([(84, 96), (96, 118), (104, 98)], fill=255)
    _ellipse(detail, (104, 70, 112, 78))


def _shark(body: Pen, detail: Pen, light: Pen, rng: np.random.Generator) -> None:
    body.polygon([(18, 84), (60, 66), (120, 68), (158, 84), (120, 96), (60, 100)], fill=255)
    body.polygon([(72, 68), (88, 34), (100, 68)], fill=255)
    body.polygon([(22, 84), (0, 54), (8, 84), (0, 112)], fill=255)
    body.polygon([(96, 94), (108, 122), (114, 94)], fill=255)
    light.polygon([(60, 92), (120, 88), (152, 86), (120, 96), (60, 100)], fill=255)
    _ellipse(detail, (132, 76, 138, 82))
    for x in (112, 117, 122):
        detail.line([(x, 76), (x - 2, 88)], fill=255, width=2)


SHAPES: dict[str, Callable[[Pen, Pen, Pen, np.random.Generator], None]] = {
    "cat": _cat, "snow_leopard": _snow_leopard, "dog": _dog, "fox": _fox, "fly": _fly, "bee": _bee,
    "crayfish": _crayfish, "crab": _crab, "goldfish": _goldfish, "shark": _shark,
}
PATTERNS = ("chainlink_fence", "brick_wall")
"""Classes drawn as full-image patterns rather than silhouettes."""


def canonical(shape: str, variant: int = 0) -> Layers:
    """The three layers of ``shape`` on a ``CANVAS`` square, as float32 alpha in [0, 1]."""
    layers = [Image.new("L", (CANVAS, CANVAS), 0) for _ in range(3)]
    body, detail, light = (ImageDraw.Draw(im) for im in layers)
    SHAPES[shape](body, detail, light, np.random.default_rng(1000 + variant))
    return tuple(np.asarray(im, dtype=np.float32) / 255.0 for im in layers)  # type: ignore[return-value]


def transformed(layers: Layers, px: int, angle: float, mirror: bool) -> Layers:
    """Layers scaled to a ``px`` square, rotated by ``angle`` degrees and optionally mirrored."""
    out = []
    for a in layers:
        im = Image.fromarray((a * 255).astype(np.uint8))
        if mirror:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        im = im.rotate(angle, resample=Image.Resampling.BILINEAR)
        im = im.resize((px, px), Image.Resampling.BOX if px < CANVAS else Image.Resampling.BILINEAR)
        out.append(np.asarray(im, dtype=np.float32) / 255.0)
    return tuple(out)  # type: ignore[return-value]


def person(px: int, clothes: int) -> np.ndarray:
    """A standing person, as a label map on a ``px`` square: 1 skin, 2 clothes, 3 legs."""
    im = Image.new("L", (CANVAS, CANVAS), 0)
    d = ImageDraw.Draw(im)
    d.rectangle((58, 56, 102, 110), fill=2)
    d.line([(60, 60), (44, 104)], fill=2, width=10)
    d.line([(100, 60), (116, 104)], fill=2, width=10)
    d.rectangle((62, 108, 78, 158), fill=3)
    d.rectangle((82, 108, 98, 158), fill=3)
    d.ellipse((64, 18, 96, 54), fill=1)
    if clothes % 2:
        d.rectangle((58, 90, 102, 110), fill=3)
    return np.asarray(im.resize((px, px), Image.Resampling.NEAREST))


def flower(px: int, petals: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Petals, centre disc and stem layers of a flower head seen from the front, on a ``px`` square."""
    layers = [Image.new("L", (CANVAS, CANVAS), 0) for _ in range(3)]
    p, c, s = (ImageDraw.Draw(im) for im in layers)
    s.rectangle((76, 80, 84, 160), fill=255)
    s.ellipse((84, 110, 116, 126), fill=255)
    for k in range(petals):
        t = 2 * np.pi * k / petals
        cx, cy = 80 + 34 * np.cos(t), 70 + 34 * np.sin(t)
        p.ellipse((cx - 20, cy - 20, cx + 20, cy + 20), fill=255)
    c.ellipse((62, 52, 98, 88), fill=255)
    return tuple(np.asarray(im.resize((px, px), Image.Resampling.BOX), dtype=np.float32) / 255.0
                 for im in layers)  # type: ignore[return-value]
