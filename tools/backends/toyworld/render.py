"""The renderer: scenes -> uint8 images, bit-identical for the same scene on every x86-64 CPU.

Texture banks, silhouette masks and noise fields are built once per renderer; an image is then a background crop,
a few pasted alpha layers, and lighting and domain styles applied to the whole batch with numpy. Drawing uses
only IEEE-754 basic operations, whose results do not depend on the CPU or the SIMD width (no BLAS, whose kernels
differ between CPUs, and no transcendental functions; see ``textures`` for the banks).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sleuth.tools.backends.toyworld import shapes, textures
from sleuth.tools.backends.toyworld.config import World
from sleuth.tools.backends.toyworld.parser import Scene

N_SCALES = 6
ANGLES = (-14.0, -7.0, 0.0, 7.0, 14.0)
N_POSES = 2 * len(ANGLES)
N_TEXTURES = 4
N_NOISE = 6
N_PATTERNS = 4
FOG = np.asarray([0.72, 0.74, 0.77], np.float32)
PAPER = np.asarray([0.97, 0.95, 0.9], np.float32)
NET = np.asarray([0.45, 0.45, 0.42], np.float32)
WING = np.asarray([0.9, 0.92, 0.96], np.float32)
SKIN = np.asarray([0.86, 0.68, 0.55], np.float32)
CLOTHES = np.asarray([[0.2, 0.3, 0.6], [0.7, 0.2, 0.2], [0.2, 0.5, 0.3], [0.85, 0.85, 0.8]], np.float32)


def _idx(u: float, n: int) -> int:
    return min(int(u * n), n - 1)


def _dist(dy: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """Euclidean length with basic operations only (np.hypot calls the C library, which differs between CPUs)."""
    return np.sqrt(dy * dy + dx * dx)


def _paste(img: np.ndarray, alpha: np.ndarray, colour: np.ndarray, top: int, left: int) -> None:
    """Alpha-blend ``colour`` (rgb, or an image the size of ``alpha``) into ``img`` at (top, left), clipped."""
    s = img.shape[0]
    h, w = alpha.shape
    y0, x0 = max(top, 0), max(left, 0)
    y1, x1 = min(top + h, s), min(left + w, s)
    if y0 >= y1 or x0 >= x1:
        return
    a = alpha[y0 - top:y1 - top, x0 - left:x1 - left, None]
    c = colour if colour.ndim == 1 else colour[y0 - top:y1 - top, x0 - left:x1 - left]
    region = img[y0:y1, x0:x1]
    region *= 1 - a
    region += a * c


class Renderer:
    """Draws scenes of one world at one size (32..128 px)."""

    def __init__(self, world: World, size: int | None = None) -> None:
        self.world = world
        self.size = s = int(size or world.size)
        self.t = t = s + s // 2
        rng = np.random.default_rng([world.seed, s, 1])
        self.backgrounds = {b.name: np.stack([textures.background(b.name, rng, t) for _ in range(N_TEXTURES)])
                            for b in world.vocabulary.background}
        self.noise = textures.exact(rng.standard_normal((N_NOISE, t, t, 3)))
        self.shade = np.stack([textures.value_noise(rng, t, 6) for _ in range(N_TEXTURES)])
        self.brush = np.stack([textures.value_noise(rng, t, 10)[..., None] * np.asarray([1.0, -0.6, 0.4], np.float32)
                               for _ in range(N_TEXTURES)])
        self.colours = {c.name: np.asarray(c.rgb, np.float32) / 255.0 for c in world.vocabulary.colour}
        self.masks: dict[str, list[list[shapes.Layers]]] = {}
        self.patterns: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        for spec in world.classes:
            lo, hi = spec.size
            if spec.shape in shapes.PATTERNS:
                self.patterns[spec.name] = [self._pattern(spec.shape, lo + (hi - lo) * (i + 0.5) / N_PATTERNS, i)
                                            for i in range(N_PATTERNS)]
                continue
            base = shapes.canonical(spec.shape)
            levels = []
            for i in range(N_SCALES):
                px = max(6, int(round(s * (lo + (hi - lo) * (i + 0.5) / N_SCALES))))
                levels.append([shapes.transformed(base, px, a, m) for m in (False, True) for a in ANGLES])
            self.masks[spec.name] = levels
        self.nets = [textures.mesh(t, s * f, max(1.2, s / 44), angle=a, knots=True)
                     for f, a in ((0.15, 40.0), (0.17, 50.0), (0.16, 45.0))]
        self.flowers = [[shapes.flower(int(s * f), p) for p in (5, 6, 8)] for f in (0.66, 0.78)]
        self.small_flowers = [shapes.flower(int(s * 0.34), p) for p in (5, 6, 8)]
        self.people = [shapes.person(int(s * f), c) for f in (0.6, 0.7) for c in (0, 1)]
        yy, xx = np.mgrid[0:s, 0:s].astype(np.float32)
        self._grid = (yy, xx)

    def _pattern(self, shape: str, frac: float, i: int) -> tuple[np.ndarray, np.ndarray]:
        t, s = self.t, self.size
        if shape == "chainlink_fence":
            spacing = s * (0.1 + 0.1 * frac)
            link = textures.mesh(t, spacing, max(1.2, s / 40), angle=45.0 + 6 * (i - 1.5))
            return link, np.clip(textures.mesh(t, spacing, max(1.0, s / 64) * 0.5, angle=45.0), 0, 1) * 0.4
        shade, mortar = textures.bricks(t, s * (0.06 + 0.08 * frac), np.random.default_rng([self.world.seed, i]))
        return shade, mortar

    # -- drawing ---------------------------------------------------------------------------------------------

    def render(self, scenes: Sequence[Scene]) -> np.ndarray:
        """``(N, size, size, 3)`` uint8 images of ``scenes``."""
        s = self.size
        out = np.empty((len(scenes), s, s, 3), np.float32)
        for i, sc in enumerate(scenes):
            out[i] = self._compose(sc)
        for light in ("dusk", "night", "fog"):
            rows = [i for i, sc in enumerate(scenes) if sc.lighting == light]
            if rows:
                amount = np.asarray([scenes[i].amount for i in rows], np.float32)[:, None, None, None]
                out[rows] = self._light(out[rows], light, amount)
        for domain in ("sketch", "painting"):
            rows = [i for i, sc in enumerate(scenes) if sc.domain == domain]
            if rows:
                out[rows] = self._style(out[rows], domain, [scenes[i] for i in rows])
        for i, sc in enumerate(scenes):
            k = _idx(sc.noise, N_NOISE)
            dy, dx = _idx(sc.tex_dx, self.t - s), _idx(sc.tex_dy, self.t - s)
            gain = self.world.noise * (2.0 if sc.lighting == "night" else 1.0)
            out[i] += gain * self.noise[k, dy:dy + s, dx:dx + s]
        return (np.clip(out, 0, 1) * 255 + 0.5).astype(np.uint8)

    def _compose(self, sc: Scene) -> np.ndarray:
        s, t = self.size, self.t
        dy, dx = _idx(sc.tex_dy, t - s), _idx(sc.tex_dx, t - s)
        k = _idx(sc.texture, N_TEXTURES)
        img = self.backgrounds[sc.background][k, dy:dy + s, dx:dx + s].copy()
        spec = self.world.spec(sc.label)
        colour = self.colours[sc.colour] * np.float32(0.82 + 0.36 * sc.tint)
        shade = 1 + 0.18 * self.shade[k, dx:dx + s, dy:dy + s, None]
        detail = np.asarray(spec.detail_rgb, np.float32) / 255.0
        co = self.colours[sc.co_colour]
        insect = spec.shape in ("fly", "bee")
        cx = int(s * (0.32 + 0.36 * sc.x))
        cy = int(s * (0.36 + 0.3 * sc.y))
        if sc.co_object == "flower":
            petals, centre, stem = self._flower(sc, insect)
            ph = petals.shape[0]
            top, left = (cy - int(ph * 0.35), cx - ph // 2) if insect else (s - ph, int(sc.co_x * (s - ph)))
            _paste(img, stem, np.asarray([0.2, 0.5, 0.2], np.float32), top, left)
            _paste(img, petals, co, top, left)
            _paste(img, centre, np.asarray([0.85, 0.6, 0.1], np.float32), top, left)
        # People and balls stand behind the subject, so they never hide it.
        if sc.co_object == "person":
            fig = self.people[_idx(sc.variant, len(self.people))]
            h = fig.shape[0]
            left = -h // 4 if sc.co_x < 0.5 else s - h + h // 4
            cloth = CLOTHES[_idx(sc.tint, len(CLOTHES))]
            for part, c in ((1, SKIN), (2, cloth), (3, np.asarray([0.15, 0.15, 0.25], np.float32))):
                _paste(img, (fig == part).astype(np.float32), c, s - h, left)
        elif sc.co_object == "ball":
            yy, xx = self._grid
            r = s * 0.09
            bx = s * (0.12 if sc.co_x >= 0.5 else 0.88)
            d = _dist(yy - (s - r - 1), xx - bx)
            a = np.clip(r + 0.5 - d, 0, 1)
            _paste(img, a, co, 0, 0)
            _paste(img, np.clip(r * 0.35 - _dist(yy - (s - 1.4 * r), xx - bx + r * 0.3), 0, 1) * 0.8,
                   np.ones(3, np.float32), 0, 0)
        if sc.label in self.patterns:
            self._draw_pattern(img, sc, colour, detail, shade)
        else:
            body, det, light = self.masks[sc.label][_idx(sc.scale, N_SCALES)][_idx(sc.pose, N_POSES)]
            top, left = cy - body.shape[0] // 2, cx - body.shape[1] // 2
            self._paste_shaded(img, body, colour, shade, top, left)
            # Wings are translucent: the body and the background show through.
            _paste(img, light * np.float32(0.6 if insect else 1.0), WING, top, left)
            _paste(img, det, detail, top, left)
        if sc.co_object == "net":
            net = self.nets[_idx(sc.variant, len(self.nets))][dy:dy + s, dx:dx + s]
            # A net is wound round the catch: the whole picture is seen through its mesh.
            _paste(img, net, NET * (0.8 + 0.4 * co), 0, 0)
        return img

    def _paste_shaded(self, img: np.ndarray, alpha: np.ndarray, colour: np.ndarray, shade: np.ndarray,
                      top: int, left: int) -> None:
        s = self.size
        h, w = alpha.shape
        y0, x0, y1, x1 = max(top, 0), max(left, 0), min(top + h, s), min(left + w, s)
        if y0 < y1 and x0 < x1:
            a = alpha[y0 - top:y1 - top, x0 - left:x1 - left, None]
            region = img[y0:y1, x0:x1]
            region *= 1 - a
            region += a * (colour * shade[y0:y1, x0:x1])

    def _flower(self, sc: Scene, insect: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if insect:
            bank = self.flowers[_idx(sc.scale, len(self.flowers))]
        else:
            bank = self.small_flowers
        return bank[_idx(sc.variant, len(bank))]

    def _draw_pattern(self, img: np.ndarray, sc: Scene, colour: np.ndarray, detail: np.ndarray,
                      shade: np.ndarray) -> None:
        s = self.size
        a, b = self.patterns[sc.label][_idx(sc.scale, N_PATTERNS)]
        oy, ox = _idx(sc.y, self.t - s), _idx(sc.x, self.t - s)
        a, b = a[oy:oy + s, ox:ox + s], b[oy:oy + s, ox:ox + s]
        if self.world.spec(sc.label).shape == "chainlink_fence":
            _paste(img, np.maximum(a, b), colour * shade, 0, 0)
            return
        top = int(s * (0.2 + 0.35 * sc.pose))
        face = colour * (a[..., None] * shade)
        img[top:] = face[top:] * (1 - b[top:, :, None]) + detail * b[top:, :, None]

    def _light(self, x: np.ndarray, light: str, amount: np.ndarray) -> np.ndarray:
        if light == "dusk":
            return x * np.asarray([0.94, 0.82, 0.7], np.float32) + np.asarray([0.05, 0.02, 0.0], np.float32)
        if light == "night":
            return x * (0.22 + 0.14 * amount) + np.asarray([0.0, 0.02, 0.08], np.float32)
        f = 0.45 + 0.25 * amount
        return x * (1 - f) + f * FOG

    def _style(self, x: np.ndarray, domain: str, scenes: list[Scene]) -> np.ndarray:
        if domain == "sketch":
            # Written out, not x @ weights: BLAS kernels sum in a CPU-dependent order.
            lum = x[..., 0] * np.float32(0.3) + x[..., 1] * np.float32(0.59) + x[..., 2] * np.float32(0.11)
            gx = np.zeros_like(lum)
            gy = np.zeros_like(lum)
            gx[:, :, 1:-1] = lum[:, :, 2:] - lum[:, :, :-2]
            gy[:, 1:-1] = lum[:, 2:] - lum[:, :-2]
            edge = np.sqrt(gx * gx + gy * gy)
            v = np.clip(1.0 - 3.2 * edge - 0.12 * (1 - lum), 0, 1)
            return v[..., None] * PAPER
        levels = np.float32(4.0)
        post = np.round(x * levels) / levels
        blur = post.copy()
        blur[:, 1:-1, 1:-1] = sum(post[:, 1 + dy:post.shape[1] - 1 + dy, 1 + dx:post.shape[2] - 1 + dx]
                                  for dy in (-1, 0, 1) for dx in (-1, 0, 1)) / np.float32(9)
        s = self.size
        brush = np.stack([self.brush[_idx(sc.texture, N_TEXTURES), :s, :s] for sc in scenes])
        return 0.5 * post + 0.5 * blur + 0.07 * brush
