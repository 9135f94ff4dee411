"""Random worlds: the default world's classes and vocabularies, with random natural priors, planted bugs and decoys.

A benchmark over one world measures a handful of bugs whose phrasing anyone may have seen; random worlds plant them
on random (class, attribute, value, confuser) choices. Each bug has one *bias* b in [0, 1] that sets how far the
training set departs from nature: the class keeps a share 1 - b of its natural p(value) (b = 1: never seen with it)
and the confuser's p(value) moves a share b of the way from nature to ``CONFUSER_P``. The failure-rate ratio the
oracle measures grows with b (same class, value and confuser); biases are drawn from target strengths spread
log-uniformly over 2-20x, through a per-attribute map calibrated on measured worlds. Decoys make an attribute whose
natural frequency differs between classes equally frequent for every class in the training set, so the classifier
should ignore it. Everything follows from the seed.
"""

from __future__ import annotations

import copy
import functools
import math
from typing import Any

import numpy as np
import yaml

from sleuth.tools.backends.toyworld.config import World, load_world

CONFUSER_P = 0.9
"""The confuser's training p(value) at bias 1."""
BIAS_RANGES = {"background": (0.08, 0.5), "co_object": (0.08, 0.5), "lighting": (0.08, 0.5), "domain": (0.08, 0.5),
               "colour": (0.6, 1.0)}
"""Bias for 2x and for 20x, by attribute. A context the class never trains with is a strong cue for a confuser seen
with it: 62x and 65x at b = 0.96 and 0.93, 20x at 0.47 (random world 0); the default world's sketch of a goldfish
is 2.4x at b = 0.14 for the class. Colour is a weak cue next to shape: 2.4x at 0.75, the default world's orange
dog 3.0x at 1 for the class."""
ATTRIBUTE_WEIGHTS = {"background": 0.3, "co_object": 0.2, "colour": 0.2, "lighting": 0.15, "domain": 0.15}
CAPTIONS = {
    "background": {"grass": "it is on the grass", "sand": "it is on the sand", "snow": "it is in the snow",
                   "water": "it is in the water", "road": "it is on the road", "indoor": "it is indoors",
                   "forest": "it is in the forest", "sky": "it is in the sky", "rock": "it is on the rocks"},
    "co_object": {"flower": "it is on a flower", "net": "it is in a net", "person": "there is a person next to it",
                  "ball": "there is a ball next to it"},
    "lighting": {"dusk": "it is at dusk", "night": "it is at night", "fog": "it is in the fog"},
    "domain": {"sketch": "a pencil sketch", "painting": "a painting"},
}
"""Caption phrases naming a value, in the captioner's style (colours: 'the <class> is <colour>')."""
PLAIN = {"co_object": "none", "lighting": "day", "domain": "photo"}
"""Values that are the absence of a condition: no bug is planted on them."""
MAX_NATURAL = 0.3
"""A bug's value must be rare enough in its class's nature that the class prompt mostly shows something else."""


def _vary(base: dict[str, float], names: list[str], rng: np.random.Generator, concentration: float,
          floor: float = 0.0) -> dict[str, float]:
    """A Dirichlet draw around ``base`` (over ``names``), rounded, zeros dropped."""
    total = sum(base.get(v, 0.0) for v in names)
    alpha = [concentration * base.get(v, 0.0) / total + floor for v in names]
    alpha = [a if a > 0 else 1e-3 for a in alpha]
    draw = rng.dirichlet(alpha)
    out = {v: round(float(p), 3) for v, p in zip(names, draw) if p >= 0.005}
    return out or {names[int(np.argmax(draw))]: 1.0}


def _natural(data: dict[str, Any], label: str, attribute: str) -> dict[str, float]:
    spec = next(c for c in data["classes"] if c["name"] == label)
    dist = spec.get("priors", {}).get(attribute) or data["default_priors"][attribute]
    total = sum(dist.values())
    return {v: p / total for v, p in dist.items()}


def bias_for_strength(strength: float, attribute: str) -> float:
    """The bias whose bugs on ``attribute`` land near ``strength`` (ratio): log-linear from 2x to 20x."""
    lo, hi = BIAS_RANGES[attribute]
    t = (math.log(strength) - math.log(2.0)) / (math.log(20.0) - math.log(2.0))
    return lo + (hi - lo) * min(max(t, 0.0), 1.0)


def _caption(attribute: str, value: str, label: str) -> str:
    return f"the {label} is {value}" if attribute == "colour" else CAPTIONS[attribute][value]


@functools.cache
def _default_data() -> dict[str, Any]:
    return load_world().model_dump(mode="json", by_alias=True)


def random_world_data(seed: int, n_bugs: int = 5, n_decoys: int = 3) -> dict[str, Any]:
    """The config (as data) of random world ``seed``."""
    rng = np.random.default_rng([seed, 20240611])
    base = copy.deepcopy(_default_data())
    vocab = base["vocabulary"]
    names = {a: [v["name"] for v in vocab[a if a != "co_colour" else "colour"]] for a in
             ("background", "colour", "co_object", "co_colour", "lighting", "domain")}
    data: dict[str, Any] = {
        "name": f"random-{seed}", "seed": int(seed), "size": base["size"], "noise": base["noise"],
        "vocabulary": vocab,
        "default_priors": {a: _vary(p, names[a], rng, 60.0) for a, p in base["default_priors"].items()},
        "classifier_training": base["classifier_training"], "captioner_training": base["captioner_training"],
        "captioner_from": "default",  # an off-the-shelf captioner: only the classifier trains per world
    }
    classes = []
    for c in base["classes"]:
        priors = {a: _vary(p, names[a], rng, 6.0, floor=0.02 if a == "background" else 0.0)
                  for a, p in c["priors"].items() if a in ("background", "colour")}
        none = float(rng.uniform(0.6, 0.97))
        others = rng.dirichlet([0.7] * (len(names["co_object"]) - 1))
        priors["co_object"] = {"none": round(none, 3), **{v: round(float((1 - none) * p), 3)
                                                          for v, p in zip(names["co_object"][1:], others)}}
        classes.append({**c, "priors": priors})
    data["classes"] = classes
    labels = [c["name"] for c in classes]
    parents = {c["name"]: c["parent"] for c in classes}

    bugs: list[dict[str, Any]] = []
    used: set[str] = set()
    attributes = list(ATTRIBUTE_WEIGHTS)
    weights = np.asarray(list(ATTRIBUTE_WEIGHTS.values()))
    tries = 0
    while len(bugs) < n_bugs and tries < 1000:
        tries += 1
        label = labels[int(rng.integers(len(labels)))]
        attribute = attributes[int(rng.choice(len(attributes), p=weights / weights.sum()))]
        nat = _natural(data, label, attribute)
        values = [v for v in names[attribute] if v != PLAIN.get(attribute) and nat.get(v, 0.0) <= MAX_NATURAL]
        free = [x for x in labels if x != label and x not in used]
        if label in used or not values or not free:
            continue
        value = values[int(rng.integers(len(values)))]
        kin = [x for x in free if parents[x] == parents[label]]
        confuser = kin[0] if kin and rng.random() < 0.5 else free[int(rng.integers(len(free)))]
        strength = float(math.exp(rng.uniform(math.log(2.0), math.log(20.0))))
        b = round(bias_for_strength(strength, attribute), 3)
        p_class = nat.get(value, 0.0) * (1 - b)
        p_conf = _natural(data, confuser, attribute).get(value, 0.0)
        p_conf += b * (CONFUSER_P - p_conf)
        used |= {label, confuser}
        caption = _caption(attribute, value, label)
        bugs.append({
            "name": f"{label}: {attribute} {value} -> {confuser} (bias {b:g})", "class": label, "confuser": confuser,
            "attributes": {attribute: value}, "caption": caption, "strength": "strong" if strength >= 6 else "subtle",
            "departures": [{"class": label, "attribute": attribute, "train": {value: round(p_class, 4)}},
                           {"class": confuser, "attribute": attribute, "train": {value: round(p_conf, 4)}}],
        })
    data["bugs"] = bugs

    planted = {(a, v) for b in bugs for a, v in b["attributes"].items()}
    decoys: list[dict[str, Any]] = []
    tries = 0
    while len(decoys) < n_decoys and tries < 1000:
        tries += 1
        attribute = ("co_object", "background")[int(rng.integers(2))]
        choices = [v for v in names[attribute] if v != PLAIN.get(attribute)]
        value = choices[int(rng.integers(len(choices)))]
        label = labels[int(rng.integers(len(labels)))]
        across = [_natural(data, x, attribute).get(value, 0.0) for x in labels]
        mine = across[labels.index(label)]
        taken = {(d["attribute"], d["value"]) for d in decoys}
        # A decoy is informative where nature ties the value to the class (clearly more common for it than on
        # average); every class then trains with it as often as this class sees it in nature, so the class loses no
        # training images of the value and the value tells nothing about the class.
        if (attribute, value) in planted | taken or mine < 0.08 or mine < 2 * float(np.mean(across)):
            continue
        decoy = {"name": f"{value} with a {label}", "class": label, "attribute": attribute, "value": value,
                 "caption": _caption(attribute, value, label), "train_prob": round(min(mine, 0.3), 3)}
        touches = any(attribute in b["attributes"] for b in bugs)
        if not touches or _keeps_bugs({**data, "decoys": [*decoys, decoy]}):
            decoys.append(decoy)
    data["decoys"] = decoys
    return data


def _keeps_bugs(data: dict[str, Any]) -> bool:
    """A decoy sets p(value) for every class and so rescales the attribute's other values: keep it only if every bug
    still trains its class with its value no more often than nature and its confuser nearly as often as planted."""
    world = World.model_validate(data)
    for b in world.bugs:
        (attribute, value), = b.attributes.items()
        i = world.vocabulary.names(attribute).index(value)
        planted = next(d.train[value] for d in b.departures if d.class_ == b.confuser)
        if world.training(b.class_, attribute)[i] > world.natural(b.class_, attribute)[i] + 1e-9 or \
                world.training(b.confuser, attribute)[i] < 0.9 * planted:
            return False
    return True


def random_world(seed: int, n_bugs: int = 5, n_decoys: int = 3) -> World:
    """Random world ``seed``, validated."""
    return World.model_validate(random_world_data(seed, n_bugs, n_decoys))


def random_world_yaml(seed: int, n_bugs: int = 5, n_decoys: int = 3) -> str:
    head = (f"# toyworld random world {seed}: the default world's classes and vocabularies with random natural "
            "priors,\n"
            f"# {n_bugs} planted bugs and {n_decoys} decoys (`sleuth world random --seed {seed}`).\n")
    return head + yaml.safe_dump(random_world_data(seed, n_bugs, n_decoys), sort_keys=False, width=120)
