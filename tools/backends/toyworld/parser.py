"""Prompt -> scene: read a caption into scene constraints, then draw a scene from the natural priors.

Like a weak text encoder, the parser knows the world's words and nothing else: words it cannot render are reported
back as ``unrendered``. Scene draws are keyed by (seed, slot) through a counter-based hash, so the same seed gives
the same pose, position and textures whatever the caption constrains: an edit changes only what it names.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from sleuth.tools.backends.base import BackendError
from sleuth.tools.backends.toyworld.config import World

STOP_WORDS = frozenset("""
a an the of it its is are was be being this that there here with without and or in on at by to from next near
beside behind front under over above below into onto up down some one two very has have having while who which
what where background backdrop scene shown showing seen looking looks look appears photographed taken style
setting environment surrounded something thing object kind type sort side close closeup view top
""".split())

LATENTS = ("scale", "pose", "x", "y", "texture", "tex_dx", "tex_dy", "noise", "amount", "co_x", "variant", "tint")
"""Continuous latents in [0, 1): pose, size, position, texture choice and offsets, noise field, lighting amount."""
_SLOTS = ("label", "background", "colour", "co_object", "co_colour", "lighting", "domain") + LATENTS


@dataclass
class Scene:
    """Everything the renderer needs to draw one image."""

    label: str
    background: str
    colour: str
    co_object: str
    co_colour: str
    lighting: str
    domain: str
    scale: float = 0.5
    pose: float = 0.5
    x: float = 0.5
    y: float = 0.5
    texture: float = 0.0
    tex_dx: float = 0.0
    tex_dy: float = 0.0
    noise: float = 0.0
    amount: float = 0.5
    co_x: float = 0.5
    variant: float = 0.0
    tint: float = 0.5

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scene:
        names = {f.name for f in fields(cls)}
        missing = names - set(d)
        if missing:
            raise BackendError(f"not a toyworld scene: missing {', '.join(sorted(missing))}")
        return cls(**{k: d[k] for k in names})


@dataclass
class ParsedPrompt:
    scene_constraints: dict[str, list[str]] = field(default_factory=dict)
    """Allowed values per attribute named by the prompt (e.g. ``{"background": ["snow"]}``)."""
    unrendered: list[str] = field(default_factory=list)
    label: str | None = None


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower().replace("-", " "))


class Lexicon:
    """The world's words, as token tuples, longest first."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.classes: list[tuple[tuple[str, ...], str]] = []
        for c in world.classes:
            for name in [c.name, *c.synonyms]:
                self.classes.append((tuple(_tokens(name)), c.name))
        self.known: set[str] = {p for c in world.classes for p in _tokens(c.parent)}
        self.known |= {p.rstrip("s") for p in self.known} | {"insect", "animal", "creature", "fish", "structure"}
        self.values: list[tuple[tuple[str, ...], str, str]] = []
        voc = world.vocabulary
        for attr in ("background", "co_object", "lighting", "domain"):
            for v in getattr(voc, attr):
                for w in [v.name, *v.words] if v.name != "none" else []:
                    self.values.append((tuple(_tokens(w)), attr, v.name))
        self.colours: dict[str, str] = {}
        for v in voc.colour:
            for w in [v.name, *v.words]:
                self.colours[w] = v.name
        self.bg_colours: dict[str, list[str]] = {}
        for v in voc.background:
            for w in v.colour_words:
                self.bg_colours.setdefault(w, []).append(v.name)
        self.classes.sort(key=lambda t: -len(t[0]))
        self.values.sort(key=lambda t: -len(t[0]))
        self.co_words = {w for toks, attr, _ in self.values if attr == "co_object" for w in toks}
        self.class_words = {w for toks, _ in self.classes for w in toks}


def _match(tokens: list[str], i: int, phrase: tuple[str, ...]) -> bool:
    return tuple(tokens[i:i + len(phrase)]) == phrase


def parse(prompt: str, world: World, lexicon: Lexicon | None = None) -> ParsedPrompt:
    """Read a caption into scene constraints, the class it names, and the words it cannot render."""
    lex = lexicon or Lexicon(world)
    constraints: dict[str, list[str]] = {}
    unrendered: list[str] = []
    label: str | None = None

    def constrain(attr: str, allowed: list[str]) -> None:
        have = constraints.get(attr)
        both = [v for v in have if v in allowed] if have else []
        # Two mentions narrow each other; if they contradict, the later one wins (as a reader would take it).
        constraints[attr] = both or list(dict.fromkeys(allowed))

    for sentence in re.split(r"[.;!?\n]+", prompt):
        tokens = _tokens(sentence)
        is_background = "background" in tokens or "backdrop" in tokens
        i = 0
        while i < len(tokens):
            hit = next(((p, c) for p, c in lex.classes if _match(tokens, i, p)), None)
            if hit is not None:
                label = label or hit[1]
                i += len(hit[0])
                continue
            vhit = next(((p, a, v) for p, a, v in lex.values if _match(tokens, i, p)), None)
            if vhit is not None:
                p, attr, value = vhit
                if not (attr == "domain" and value == "photo" and "domain" in constraints):
                    constrain(attr, [value])
                i += len(p)
                continue
            tok = tokens[i]
            if tok in lex.colours or tok in lex.bg_colours:
                nxt = next((t for t in tokens[i + 1:] if t not in STOP_WORDS and t not in lex.colours), "")
                if nxt in lex.co_words and tok in lex.colours:
                    constrain("co_colour", [lex.colours[tok]])
                elif is_background and tok in lex.bg_colours and nxt not in lex.class_words:
                    constrain("background", lex.bg_colours[tok])
                elif tok in lex.colours:
                    constrain("colour", [lex.colours[tok]])
                i += 1
                continue
            if tok not in STOP_WORDS and tok not in lex.known and tok not in unrendered:
                unrendered.append(tok)
            i += 1
    return ParsedPrompt(constraints, unrendered, label)


# -- drawing scenes ------------------------------------------------------------------------------------------


def uniforms(seeds: np.ndarray, salt: int, n_slots: int = len(_SLOTS)) -> np.ndarray:
    """Counter-based uniforms in [0, 1): ``(len(seeds), n_slots)``, a pure function of (salt, seed, slot)."""
    s = np.asarray(seeds, dtype=np.uint64)[:, None]
    slot = np.arange(n_slots, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        z = s * np.uint64(0x9E3779B97F4A7C15) + slot * np.uint64(0xD1B54A32D192ED03) + np.uint64(salt * 7919 + 1)
        for mult, shift in ((0xBF58476D1CE4E5B9, 30), (0x94D049BB133111EB, 27)):
            z = (z ^ (z >> np.uint64(shift))) * np.uint64(mult)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def pick(u: np.ndarray, probs: list[float], values: list[str], allowed: list[str] | None) -> np.ndarray:
    p = np.asarray(probs, dtype=np.float64)
    if allowed:
        mask = np.array([v in allowed for v in values])
        p = np.where(mask, p, 0.0)
        if p.sum() <= 0:  # the caption asks for something nature never shows: render it anyway
            p = mask.astype(np.float64)
    cdf = np.cumsum(p / p.sum())
    return np.minimum(np.searchsorted(cdf, u, side="right"), len(values) - 1)


def _probs(world: World, label: str, attr: str, distribution: str) -> list[float]:
    if distribution == "training":
        return world.training(label, attr)
    p = world.natural(label, attr)
    if distribution == "broad":  # every value shows up with every class: what an attribute reader trains on
        return [0.5 * q + 0.5 / len(p) for q in p]
    return p


def sample_scenes(parsed: ParsedPrompt, seeds: list[int] | np.ndarray, world: World,
                  distribution: str = "natural", salt: int | None = None) -> list[Scene]:
    """One scene per seed: the prompt's constraints, the rest from ``distribution``.

    ``distribution`` is 'natural' (the world's priors), 'training' (the classifier's training set: priors with the
    planted departures) or 'broad' (priors mixed with uniform, for the attribute network).
    """
    u = uniforms(np.asarray(seeds), world.seed if salt is None else salt)
    labels = world.labels.labels
    if parsed.label is not None:
        lab_idx = np.full(len(u), labels.index(parsed.label))
    else:
        lab_idx = np.minimum((u[:, 0] * len(labels)).astype(int), len(labels) - 1)
    columns: dict[str, np.ndarray] = {}
    for j, attr in enumerate(("background", "colour", "co_object", "co_colour", "lighting", "domain"), start=1):
        values = world.vocabulary.names(attr)
        col = np.empty(len(u), dtype=object)
        for li in np.unique(lab_idx):
            rows = lab_idx == li
            probs = _probs(world, labels[li], attr, distribution)
            col[rows] = np.asarray(values, dtype=object)[pick(u[rows, j], probs, values,
                                                               parsed.scene_constraints.get(attr))]
        columns[attr] = col
    base = 7
    attrs = ("background", "colour", "co_object", "co_colour", "lighting", "domain")
    return [Scene(labels[lab_idx[i]], **{a: str(columns[a][i]) for a in attrs},  # type: ignore[arg-type]
                  **{name: float(u[i, base + k]) for k, name in enumerate(LATENTS)})  # type: ignore[arg-type]
            for i in range(len(u))]


def sample_scene(constraints: dict[str, list[str]] | ParsedPrompt, seed: int, world: World,
                 label: str | None = None) -> Scene:
    """One scene: ``constraints`` (or a parsed prompt) fixed, the rest drawn from the natural priors."""
    parsed = constraints if isinstance(constraints, ParsedPrompt) else ParsedPrompt(dict(constraints), [], label)
    return sample_scenes(parsed, [seed], world)[0]
