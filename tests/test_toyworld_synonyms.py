"""toyworld's parser reads the general vocabulary as a weak text encoder would: synonyms of what it can draw map onto
the scene, everything else is reported unrendered."""

from __future__ import annotations

import pytest

from sleuth.tools.backends.toyworld import load_world
from sleuth.tools.backends.toyworld.parser import Lexicon, parse
from sleuth.tools.vocabulary import general_vocabulary

WORLD = load_world()
LEX = Lexicon(WORLD)
PHRASES = set(general_vocabulary().phrases())


def caption(phrase: str) -> str:
    """The phrase in a caption the way perturb_caption places it (style phrases lead, colours precede the noun)."""
    group = next(g for g in general_vocabulary().groups if phrase in g.phrases)
    if group.slot == "prefix":
        return f"{phrase} a cat"
    if group.slot == "modifier":
        return f"a realistic photograph of a {phrase} cat"
    return f"a realistic photograph of a cat {phrase}."


@pytest.mark.parametrize(("phrase", "attribute", "value"), [
    ("in a kitchen", "background", "indoor"),
    ("in a city street", "background", "road"),
    ("on a frozen lake", "background", "snow"),  # the longer phrase wins over "lake" (water)
    ("in a field of wheat", "background", "grass"),
    ("on a rocky shore", "background", "rock"),
    ("against a plain white background", "background", "snow"),  # the world's own colour words for backgrounds
    ("at sunset", "lighting", "dusk"),
    ("in golden hour light", "lighting", "dusk"),  # not the colour golden
    ("under a full moon", "lighting", "night"),
    ("in the haze", "lighting", "fog"),
    ("a charcoal drawing of", "domain", "sketch"),
    ("a child's drawing of", "domain", "sketch"),
    ("an oil painting of", "domain", "painting"),
    ("in a fishing net", "co_object", "net"),
    ("next to a potted plant", "co_object", "flower"),
    ("with a child", "co_object", "person"),
    ("golden", "colour", "yellow"),
    ("silver", "colour", "grey"),
])
def test_a_phrase_toyworld_can_draw_parses_to_its_scene(phrase: str, attribute: str, value: str) -> None:
    assert phrase in PHRASES
    parsed = parse(caption(phrase), WORLD, LEX)
    assert parsed.scene_constraints[attribute] == [value]
    assert parsed.label == "cat"
    assert parsed.unrendered == (["plain"] if "plain" in phrase else [])


@pytest.mark.parametrize(("phrase", "unrendered"), [
    ("made of wood", ["made", "wood"]),
    ("in a stadium", ["stadium"]),
    ("next to a bicycle", ["bicycle"]),
    ("pink", ["pink"]),
    ("sleeping", ["sleeping"]),
    ("against a black background", ["black"]),  # no background of that colour: not drawn, and the cat stays as it is
    ("a mosaic of", ["mosaic"]),
])
def test_a_phrase_it_cannot_draw_is_reported_unrendered(phrase: str, unrendered: list[str]) -> None:
    assert phrase in PHRASES
    parsed = parse(caption(phrase), WORLD, LEX)
    assert parsed.unrendered == unrendered
    assert set(parsed.scene_constraints) <= {"domain"} and parsed.label == "cat"


def test_a_second_class_is_not_drawn() -> None:
    parsed = parse("a realistic photograph of a cat next to a dog", WORLD, LEX)
    assert parsed.label == "cat" and parsed.unrendered == ["dog"]


def test_every_value_a_bug_can_be_planted_on_is_reachable_from_the_general_vocabulary() -> None:
    # Random worlds plant bugs on any value of these vocabularies; the general vocabulary, written without them,
    # reaches each through the parser's synonyms.
    reached: dict[str, set[str]] = {}
    for phrase in PHRASES:
        for attr, values in parse(caption(phrase), WORLD, LEX).scene_constraints.items():
            reached.setdefault(attr, set()).update(values)
    voc = WORLD.vocabulary
    for attr in ("background", "colour", "co_object", "lighting", "domain"):
        assert set(voc.names(attr)) - {"none", "day", "photo"} <= reached[attr], attr
