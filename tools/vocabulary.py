"""The general perturbation vocabulary: caption phrases by LANCE edit type, independent of any world or model.

It comes from ``prompts/perturbations.json`` (the Dataset Interfaces shift families, LANCE's edit types, common
co-occurring objects, subject modifiers) and is loaded once per process: one object, whichever backends or world are
loaded, so nothing a world config says can reach caption perturbation through it. Each group has a *slot* that says
where its phrases go in a caption: ``prefix`` phrases replace the image-type phrase ("a pencil sketch of a ..."),
``modifier`` phrases go before the class noun ("a small ..."), ``suffix`` phrases follow the class noun phrase
("... at night").
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Literal, get_args

EditType = Literal["subject", "object", "background", "adjective", "domain"]
ALL_TYPES: tuple[EditType, ...] = ("subject", "object", "background", "adjective", "domain")
Slot = Literal["prefix", "modifier", "suffix"]


@dataclass(frozen=True)
class Group:
    """Phrases of one shift family, all of one LANCE edit type and one slot."""

    name: str
    type: EditType
    slot: Slot
    family: str
    phrases: tuple[str, ...]


@dataclass(frozen=True)
class PerturbationVocabulary:
    groups: tuple[Group, ...]

    def of_type(self, edit_type: str) -> tuple[Group, ...]:
        return tuple(g for g in self.groups if g.type == edit_type)

    def group(self, name: str) -> Group:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)

    def phrases(self, edit_type: str | None = None) -> list[str]:
        return [p for g in self.groups if edit_type in (None, g.type) for p in g.phrases]

    def __len__(self) -> int:
        return sum(len(g.phrases) for g in self.groups)


def parse_vocabulary(data: dict[str, object]) -> PerturbationVocabulary:
    """A vocabulary from its JSON form; raises ``ValueError`` (or ``TypeError``) naming the first bad group."""
    groups = data.get("groups")
    if not isinstance(groups, dict) or not groups:
        raise ValueError("perturbation vocabulary: 'groups' must be a non-empty mapping")
    out = []
    seen: set[str] = set()
    for name, g in groups.items():
        if not isinstance(g, dict):
            raise TypeError(f"perturbation vocabulary: group {name!r} must be a mapping")
        if g.get("type") not in get_args(EditType) or g.get("slot") not in get_args(Slot):
            raise ValueError(f"perturbation vocabulary: group {name!r} has type {g.get('type')!r} and slot "
                             f"{g.get('slot')!r}; types: {', '.join(get_args(EditType))}; slots: "
                             f"{', '.join(get_args(Slot))}")
        phrases = tuple(str(p).strip() for p in g.get("phrases", []))
        if not phrases or any(not p for p in phrases):
            raise ValueError(f"perturbation vocabulary: group {name!r} needs non-empty phrases")
        dup = [p for p in phrases if p in seen]
        if dup:
            raise ValueError(f"perturbation vocabulary: {dup[0]!r} appears in more than one place")
        seen.update(phrases)
        out.append(Group(name, g["type"], g["slot"], str(g.get("family", "")), phrases))
    return PerturbationVocabulary(tuple(out))


@functools.cache
def general_vocabulary() -> PerturbationVocabulary:
    """The packaged vocabulary, read once per process (the same object on every call)."""
    text = resources.files("sleuth.prompts").joinpath("perturbations.json").read_text(encoding="utf-8")
    return parse_vocabulary(json.loads(text))
