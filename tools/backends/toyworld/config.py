"""World configs: classes, attribute vocabularies, natural priors and the training set's planted departures.

A world says what it looks like (``priors``: p(attribute | class)) and how the classifier's *training set* departs
from that (``bugs`` plant shortcuts; ``decoys`` decorrelate attributes from the labels). Configs load from YAML or
JSON; a malformed one is a one-line ``BackendError`` naming the field.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sleuth.tools.backends.base import BackendError, LabelSpace

ATTRIBUTES = ("background", "colour", "co_object", "co_colour", "lighting", "domain")
"""Scene attributes a caption can name; ``co_colour`` draws from the ``colour`` vocabulary."""
SHAPES = ("cat", "snow_leopard", "dog", "fox", "fly", "bee", "crayfish", "crab", "goldfish", "shark",
          "chainlink_fence", "brick_wall")
RENDER_VERSION = 1
"""Part of every config hash: a renderer change invalidates cached weights."""

Distribution = dict[str, float]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Value(_Strict):
    name: str
    words: list[str] = Field(default_factory=list, description="Caption words or phrases that name this value.")
    colour_words: list[str] = Field(default_factory=list,
                                    description="Backgrounds only: colours that describe it "
                                                "('the background is white').")
    rgb: tuple[int, int, int] | None = Field(None, description="Colours only: the base colour.")


class Vocabularies(_Strict):
    background: list[Value]
    colour: list[Value]
    co_object: list[Value] = Field(description="Co-occurring objects; the first one must be 'none'.")
    lighting: list[Value]
    domain: list[Value]

    @model_validator(mode="after")
    def _check(self) -> Vocabularies:
        if not self.co_object or self.co_object[0].name != "none":
            raise ValueError("co_object: the first value must be 'none'")
        for i, c in enumerate(self.colour):
            if c.rgb is None:
                raise ValueError(f"colour[{i}].rgb: every colour needs an rgb triple")
        return self

    def names(self, attribute: str) -> list[str]:
        key = "colour" if attribute == "co_colour" else attribute
        return [v.name for v in getattr(self, key)]


class ClassSpec(_Strict):
    name: str
    parent: str = Field(description="Parent group (the hierarchy used by the 'parent' criterion).")
    shape: Literal[SHAPES]  # type: ignore[valid-type]
    synonyms: list[str] = Field(default_factory=list)
    size: tuple[float, float] = Field((0.4, 0.6), description="Object size range, as a fraction of the image.")
    detail_rgb: tuple[int, int, int] = Field((30, 30, 30), description="Colour of spots, stripes, eyes.")
    priors: dict[str, Distribution] = Field(default_factory=dict,
                                            description="Natural p(value | class) per attribute; overrides defaults.")


class Departure(_Strict):
    """How the training set's p(attribute | class) departs from nature: the named values get these probabilities,
    the other values keep their natural proportions in what is left."""

    class_: str = Field(alias="class")
    attribute: str
    train: Distribution


class Bug(_Strict):
    name: str
    class_: str = Field(alias="class")
    confuser: str = Field(description="The class the shortcut points to.")
    attributes: dict[str, str] = Field(description="Scene attributes that trigger it.")
    caption: str = Field(description="Caption words that name it, e.g. 'it is in the snow'.")
    strength: Literal["strong", "subtle"]
    departures: list[Departure]


class Decoy(_Strict):
    name: str
    class_: str = Field(alias="class", description="Class the decoy is measured on.")
    attribute: str
    value: str
    caption: str
    train_prob: float = Field(ge=0, le=1, description="p(value) for every class in the training set.")


class Training(_Strict):
    seed: int = 0
    n_per_class: int = Field(1500, gt=0)
    epochs: int = Field(6, gt=0)
    batch_size: int = Field(128, gt=0)
    lr: float = Field(3e-3, gt=0)
    input_size: int = Field(32, description="The networks see images area-resized to this size.")


class World(_Strict):
    name: str
    seed: int = Field(0, description="Salt of every scene draw and texture.")
    size: int = Field(64, ge=32, le=128)
    noise: float = Field(0.03, ge=0, le=0.3, description="Pixel noise standard deviation (0..1 scale).")
    vocabulary: Vocabularies
    default_priors: dict[str, Distribution]
    classes: list[ClassSpec] = Field(min_length=2)
    bugs: list[Bug] = Field(default_factory=list)
    decoys: list[Decoy] = Field(default_factory=list)
    balanced_training: bool = Field(False, description=(
        "Calibration worlds: the training set draws background, co-occurring object, lighting and domain from "
        "the class-averaged natural prior, so no context attribute predicts the class (object colours stay)."))
    classifier_training: Training = Field(default_factory=Training)
    captioner_training: Training = Field(default_factory=lambda: Training(seed=1, n_per_class=800, epochs=5))
    captioner_from: str | None = Field(None, description=(
        "A packaged world whose attribute network this world uses instead of training its own (an off-the-shelf "
        "captioner, as a real audit has): it must share this world's vocabulary, image size and captioner input."))

    @model_validator(mode="after")
    def _check(self) -> World:
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError("classes: class names must be unique")
        for attr in ATTRIBUTES:
            if attr not in self.default_priors:
                raise ValueError(f"default_priors: missing attribute {attr!r}")
            self._check_dist(f"default_priors.{attr}", attr, self.default_priors[attr])
        for i, c in enumerate(self.classes):
            for attr, dist in c.priors.items():
                self._check_dist(f"classes[{i}].priors.{attr}", attr, dist)
        for i, b in enumerate(self.bugs):
            for cls in (b.class_, b.confuser):
                if cls not in names:
                    raise ValueError(f"bugs[{i}]: unknown class {cls!r}")
            for attr, v in b.attributes.items():
                self._check_dist(f"bugs[{i}].attributes", attr, {v: 1.0})
            for j, d in enumerate(b.departures):
                if d.class_ not in names:
                    raise ValueError(f"bugs[{i}].departures[{j}].class: unknown class {d.class_!r}")
                self._check_dist(f"bugs[{i}].departures[{j}].train", d.attribute, d.train, total=False)
        if self.captioner_from is not None and not _is_packaged(self.captioner_from):
            raise ValueError(f"captioner_from: {self.captioner_from!r} is not a packaged world")
        for i, decoy in enumerate(self.decoys):
            if decoy.class_ not in names:
                raise ValueError(f"decoys[{i}].class: unknown class {decoy.class_!r}")
            self._check_dist(f"decoys[{i}]", decoy.attribute, {decoy.value: 1.0})
        return self

    def _check_dist(self, where: str, attr: str, dist: Distribution, total: bool = True) -> None:
        if attr not in ATTRIBUTES:
            raise ValueError(f"{where}: unknown attribute {attr!r} (known: {', '.join(ATTRIBUTES)})")
        known = self.vocabulary.names(attr)
        for v, p in dist.items():
            if v not in known:
                raise ValueError(f"{where}: unknown {attr} {v!r} (known: {', '.join(known)})")
            if p < 0:
                raise ValueError(f"{where}.{v}: probability must be >= 0, got {p}")
        if total and sum(dist.values()) <= 0:
            raise ValueError(f"{where}: probabilities sum to zero")
        if not total and sum(dist.values()) > 1 + 1e-9:
            raise ValueError(f"{where}: probabilities sum to more than 1")

    # -- derived --------------------------------------------------------------------------------------

    @property
    def labels(self) -> LabelSpace:
        return LabelSpace(tuple(c.name for c in self.classes), {c.name: c.parent for c in self.classes})

    def spec(self, label: str) -> ClassSpec:
        for c in self.classes:
            if c.name == label:
                return c
        raise BackendError(self.labels.unknown_message(label))

    def colour_rgb(self, name: str) -> tuple[int, int, int]:
        for c in self.vocabulary.colour:
            if c.name == name:
                assert c.rgb is not None
                return c.rgb
        raise BackendError(f"unknown colour {name!r}")

    def natural(self, label: str, attribute: str) -> list[float]:
        """Natural p(value | class) over the attribute's vocabulary, in vocabulary order."""
        dist = self.spec(label).priors.get(attribute, self.default_priors[attribute])
        return _normalised(dist, self.vocabulary.names(attribute))

    def training(self, label: str, attribute: str) -> list[float]:
        """The training set's p(value | class): nature, then the bugs' departures, then the decoys (last, so that
        a decoy value has exactly the same training probability for every class)."""
        values = self.vocabulary.names(attribute)
        p = self.natural(label, attribute)
        if self.balanced_training and attribute != "colour":
            p = [sum(col) / len(self.classes) for col in zip(*(self.natural(c.name, attribute) for c in self.classes))]
        for b in self.bugs:
            for dep in b.departures:
                if dep.class_ == label and dep.attribute == attribute:
                    p = _depart(p, values, dep.train)
        decoys = {d.value: d.train_prob for d in self.decoys if d.attribute == attribute}
        if decoys:
            p = _depart(p, values, decoys)
        return p

    def config_hash(self) -> str:
        world = self.model_dump(mode="json", by_alias=True)
        if world.get("captioner_from") is None:  # added later: worlds that train their own keep their hash
            world.pop("captioner_from", None)
        blob = json.dumps({"render": RENDER_VERSION, "world": world}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _normalised(dist: Distribution, values: list[str]) -> list[float]:
    total = sum(dist.get(v, 0.0) for v in values)
    return [dist.get(v, 0.0) / total for v in values]


def _depart(p: list[float], values: list[str], fixed: Distribution) -> list[float]:
    rest = [0.0 if v in fixed else q for v, q in zip(values, p)]
    left = max(0.0, 1.0 - sum(fixed.values()))
    scale = left / sum(rest) if sum(rest) > 0 else 0.0
    out = [fixed[v] if v in fixed else q * scale for v, q in zip(values, rest)]
    total = sum(out)
    return [q / total for q in out]


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _is_packaged(name: str) -> bool:
    return resources.files("sleuth.tools.backends.toyworld").joinpath(f"worlds/{name}.yaml").is_file()


def load_world(path: str | Path | None = None) -> World:
    """Load a world config (YAML or JSON); ``None`` is the packaged default world."""
    if path is None:
        text = resources.files("sleuth.tools.backends.toyworld").joinpath("worlds/default.yaml").read_text()
        where = "default"
    else:
        p = Path(path)
        if not p.is_file():
            packaged = resources.files("sleuth.tools.backends.toyworld").joinpath(f"worlds/{p.name}.yaml")
            if p.parent == Path(".") and packaged.is_file():
                p = Path(str(packaged))
            else:
                names = sorted(f.name.removesuffix(".yaml") for f in
                               resources.files("sleuth.tools.backends.toyworld").joinpath("worlds").iterdir()
                               if f.name.endswith(".yaml"))
                raise BackendError(f"world config {path}: no such file, and not a packaged world "
                                   f"({', '.join(names)})")
        text, where = p.read_text(), str(path)
    try:
        data = json.loads(text) if where.endswith(".json") else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BackendError(f"world config {where}: not valid YAML/JSON: {first}") from None
    if not isinstance(data, dict):
        raise BackendError(f"world config {where}: expected a mapping at the top level")
    try:
        return World.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = _loc(tuple(err["loc"]))
        msg = err["msg"].removeprefix("Value error, ")
        raise BackendError(f"world config {where}: field {f'{field}: ' if field else ''}{msg}") from None
