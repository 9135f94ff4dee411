"""Texture banks: seeded noise textures per background type, and the mesh and brick patterns.

Everything here is computed once per renderer (a few hundred milliseconds) so that drawing an image is only
cropping, pasting and blending.

Cross-CPU determinism: banks that use transcendental functions (sin, cos, hypot) or the normal sampler are computed
in float64 and rounded to a grid of 2**-16 (``exact``). numpy dispatches those functions to different SIMD code on
different CPUs, which may differ in the last bit; in float64 such a difference crosses a grid boundary with
probability about 1e-11 per value, so every x86-64 CPU ends with the same float32 bank. Everything drawn per image
afterwards uses only IEEE-754 basic operations (+, -, *, /, sqrt, min, max, round), which are exact on every CPU.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

GRID = 2.0 ** -16
"""Banks are rounded to multiples of this: exactly representable in float32 for |x| < 256."""


def exact(a: np.ndarray) -> np.ndarray:
    """``a`` (float64) rounded to the ``GRID`` and stored as float32: the same bits on every CPU."""
    return (np.round(np.asarray(a, dtype=np.float64) / GRID) * GRID).astype(np.float32)


def value_noise(rng: np.random.Generator, t: int, cells: int, aspect: float = 1.0) -> np.ndarray:
    """Smooth noise in about [-1, 1] on a ``t`` square; ``cells`` sets the feature size."""
    h = max(2, int(cells * aspect))
    grid = rng.standard_normal((h, cells)).astype(np.float32)
    im = Image.fromarray(grid, mode="F").resize((t, t), Image.Resampling.BICUBIC)
    a = np.asarray(im, dtype=np.float32)
    return a / (np.abs(a).max() + 1e-6)


def _rgb(c: tuple[int, int, int]) -> np.ndarray:
    return np.asarray(c, dtype=np.float64) / 255.0


def background(kind: str, rng: np.random.Generator, t: int) -> np.ndarray:
    """One ``(t, t, 3)`` float32 texture of background ``kind`` (computed in float64, then ``exact``)."""
    y = np.linspace(0, 1, t, dtype=np.float64)[:, None]
    x = np.linspace(0, 1, t, dtype=np.float64)[None, :]
    low = value_noise(rng, t, 4).astype(np.float64)[..., None]
    mid = value_noise(rng, t, 12).astype(np.float64)[..., None]
    fine = value_noise(rng, t, max(8, t // 2)).astype(np.float64)[..., None]
    if kind == "grass":
        blades = value_noise(rng, t, max(8, t // 2), aspect=0.15).astype(np.float64)[..., None]
        img = _rgb((70, 140, 55)) * (1 + 0.18 * low + 0.22 * blades + 0.08 * fine)
    elif kind == "sand":
        ripple = np.sin((y * 9 + 0.25 * low[..., 0]) * 2 * np.pi)[..., None]
        img = _rgb((214, 190, 132)) * (1 + 0.07 * low + 0.05 * fine + 0.04 * ripple)
    elif kind == "snow":
        shade = 0.07 * low + 0.03 * fine
        img = _rgb((240, 243, 250)) + shade * _rgb((180, 190, 255)) - 0.02
    elif kind == "water":
        ripple = np.sin((y * 14 + 0.6 * mid[..., 0] + 0.3 * x) * 2 * np.pi)[..., None]
        img = _rgb((40, 105, 175)) * (1 + 0.16 * ripple + 0.12 * low) + 0.08 * (ripple > 0.85)
    elif kind == "road":
        img = _rgb((98, 98, 102)) * (1 + 0.12 * fine + 0.06 * low)
        stripe = (np.abs(y - 0.72) < 0.025) & (np.sin(x * 6 * 2 * np.pi) > 0)
        img = np.where(stripe[..., None], _rgb((235, 230, 210)), img)
    elif kind == "indoor":
        wall = _rgb((214, 196, 168)) * (1 + 0.04 * low)
        planks = np.abs(np.sin(y * 10 * np.pi))[..., None] < 0.08
        grain = value_noise(rng, t, max(8, t // 3), aspect=4.0).astype(np.float64)[..., None]
        floor = _rgb((150, 100, 62)) * (1 + 0.12 * grain - 0.25 * planks)
        img = np.where((y > 0.55)[..., None], floor, wall)
    elif kind == "forest":
        img = _rgb((45, 85, 42)) * (1 + 0.35 * mid + 0.15 * fine)
        for _ in range(max(3, t // 20)):
            cx, w = rng.uniform(0, 1), rng.uniform(0.03, 0.07)
            trunk = (np.abs(x - cx) < w) & (y > rng.uniform(0, 0.3))
            img = np.where(trunk[..., None], _rgb((90, 64, 40)) * (1 + 0.1 * fine), img)
    elif kind == "sky":
        img = _rgb((110, 160, 230)) * (1 - y[..., None]) + _rgb((175, 205, 240)) * y[..., None]
        cloud = np.clip((value_noise(rng, t, 5).astype(np.float64)[..., None] - 0.15) * 3, 0, 1)
        img = img * (1 - cloud) + cloud * _rgb((245, 245, 250))
    elif kind == "rock":
        cracks = np.abs(mid) < 0.06
        img = _rgb((138, 128, 116)) * (1 + 0.2 * low + 0.1 * fine - 0.3 * cracks)
    else:
        img = np.full((t, t, 3), 0.5) * (1 + 0.1 * low)
    return exact(np.clip(np.broadcast_to(img, (t, t, 3)), 0, 1))


def mesh(t: int, spacing: float, width: float, angle: float = 45.0, knots: bool = False) -> np.ndarray:
    """A diamond mesh (chain link, net) as float32 alpha on a ``t`` square (computed in float64, then ``exact``)."""
    y, x = np.mgrid[0:t, 0:t].astype(np.float64)
    a = np.deg2rad(angle)
    u = x * np.cos(a) + y * np.sin(a)
    v = -x * np.sin(a) + y * np.cos(a)
    du = np.abs((u / spacing) % 1 - 0.5) * spacing
    dv = np.abs((v / spacing) % 1 - 0.5) * spacing
    half = spacing / 2
    line = np.clip(width / 2 + 0.5 - np.minimum(half - du, half - dv), 0, 1)
    if knots:
        line = np.maximum(line, np.clip(width + 0.5 - np.hypot(half - du, half - dv), 0, 1))
    return exact(line)


def bricks(t: int, brick_h: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Brick faces (shade per brick) and mortar lines on a ``t`` square."""
    y, x = np.mgrid[0:t, 0:t].astype(np.float32)
    row = np.floor(y / brick_h)
    bw = brick_h * 2.2
    xs = x + (row % 2) * bw / 2
    col = np.floor(xs / bw)
    mortar = ((y % brick_h) < max(1.0, brick_h * 0.16)) | ((xs % bw) < max(1.0, brick_h * 0.16))
    shade = rng.uniform(0.8, 1.15, size=(int(row.max()) + 2, int(col.max()) + 2)).astype(np.float32)
    return shade[row.astype(int), col.astype(int)], mortar.astype(np.float32)
