"""The ImageNet-1k label space with its WordNet hierarchy (committed data, see data/imagenet_hierarchy.json).

Classes are in the standard sorted-wnid order that torchvision, timm and Hugging Face ImageNet models use.
Parent rule: a class's parent is its *direct* WordNet hypernym (for the few synsets with several, the deepest
one). So tabby cat and tiger cat share "domestic cat", while snow leopard sits under "big cat"; the
"no top-3 prediction under the true label's parent" criterion reads it through ``LabelSpace.parents``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from sleuth.tools.backends.base import LabelSpace

DATA = Path(__file__).parent / "data" / "imagenet_hierarchy.json"
NUM_CLASSES = 1000


@dataclass(frozen=True)
class ImageNetClass:
    index: int
    wnid: str
    name: str
    """Unique readable name (open_clip's class names; torchvision's where open_clip repeats one)."""
    torchvision_name: str
    path: tuple[str, ...]
    """Hypernym wnids from the WordNet root down to the class itself."""


@cache
def _data() -> tuple[tuple[ImageNetClass, ...], dict[str, str]]:
    doc = json.loads(DATA.read_text())
    classes = tuple(ImageNetClass(c["index"], c["wnid"], c["name"], c["torchvision_name"], tuple(c["path"]))
                    for c in doc["classes"])
    return classes, dict(doc["synsets"])


def imagenet_classes() -> tuple[ImageNetClass, ...]:
    return _data()[0]


def synset_name(wnid: str) -> str:
    """Readable name of an ancestor synset (e.g. n02121808 -> "domestic cat")."""
    return _data()[1][wnid]


def imagenet_parent(cls: ImageNetClass) -> str:
    """The group name used in ``LabelSpace.parents``: the direct hypernym's readable name.

    Two different synsets can share a readable name, so the wnid is appended where that happens.
    """
    return _group_names()[cls.path[-2]]


@cache
def _group_names() -> dict[str, str]:
    wnids = {c.path[-2] for c in imagenet_classes()}
    by_name: dict[str, list[str]] = {}
    for w in wnids:
        by_name.setdefault(synset_name(w), []).append(w)
    return {w: synset_name(w) if len(by_name[synset_name(w)]) == 1 else f"{synset_name(w)} ({w})" for w in wnids}


@cache
def imagenet_label_space() -> LabelSpace:
    classes = imagenet_classes()
    return LabelSpace(labels=tuple(c.name for c in classes), parents={c.name: imagenet_parent(c) for c in classes})


def hypernyms(label: str) -> list[str]:
    """Readable hypernym path of a class, root first, the class itself excluded."""
    for c in imagenet_classes():
        if c.name == label:
            return [synset_name(w) for w in c.path[:-1]]
    raise KeyError(label)


def generic_label_space(n: int) -> LabelSpace:
    """Labels for a classifier whose classes are unknown; ImageNet-1k when it has 1000 outputs."""
    if n == NUM_CLASSES:
        return imagenet_label_space()
    return LabelSpace(labels=tuple(f"class_{i}" for i in range(n)))


def label_space_from_names(names: list[str]) -> LabelSpace:
    """A classifier's own label names; 1000 of them are taken to be ImageNet-1k in the standard order."""
    if len(names) == NUM_CLASSES:
        return imagenet_label_space()
    unique = list(dict.fromkeys(names))
    if len(unique) != len(names):
        names = [f"{n} ({i})" for i, n in enumerate(names)]
    return LabelSpace(labels=tuple(names))
