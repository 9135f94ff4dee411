"""Nothing a planner reads names a planted bug of a packaged world.

A planner that is shown "cat ... in the snow" as an example copies it into its first call (a real model did), and the
benchmark then measures the prompt, not discovery. The phrases come from the worlds' configs: a bug's class (with
its synonyms) together with its attribute value (with the world's words and the parser's synonyms for it). Scanned:
the prompts (system, tools, perturbation prompt and vocabulary), every tool's description, JSON schema, result schema
and docstring, the planners' and the LLM plumbing's text templates, and the scripted-model fixture.
"""

from __future__ import annotations

import ast
import json
import re
from importlib import resources
from pathlib import Path

import pytest

from sleuth.tools import (
    caption_failures,
    edit_image,
    finish,
    generate_and_classify,
    investigation_tools,
    measure_rate,
    perturb_caption,
    record_finding,
)
from sleuth.tools.backends.toyworld import load_world
from sleuth.tools.backends.toyworld.config import World
from sleuth.tools.backends.toyworld.synonyms import SYNONYMS

ROOT = Path(__file__).resolve().parent.parent
TOOL_MODULES = (generate_and_classify, caption_failures, perturb_caption, edit_image, measure_rate, record_finding,
                finish)
Phrase = tuple[str, ...]


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def packaged_worlds() -> list[World]:
    folder = resources.files("sleuth.tools.backends.toyworld").joinpath("worlds")
    return [load_world(f.name.removesuffix(".yaml")) for f in folder.iterdir() if f.name.endswith(".yaml")]


def bug_phrases(world: World) -> list[tuple[str, list[Phrase], list[Phrase]]]:
    """Per planted bug: its name, the phrases naming its class, the phrases naming its attribute value."""
    out = []
    for bug in world.bugs:
        spec = world.spec(bug.class_)
        classes = [tuple(_tokens(t)) for t in [spec.name, *spec.synonyms]]
        values: list[Phrase] = []
        for attr, value in bug.attributes.items():
            key = "colour" if attr == "co_colour" else attr
            v = next(x for x in getattr(world.vocabulary, key) if x.name == value)
            values += [tuple(_tokens(t)) for t in [v.name, *v.words, *v.colour_words, *SYNONYMS[key].get(value, ())]]
        out.append((bug.name, classes, values))
    return out


WINDOW = 12
"""Tokens apart that still read as one example: 'a photo of a cat. it is on a frozen lake.' spans two sentences."""


def _starts(tokens: list[str], phrases: list[Phrase]) -> list[int]:
    return [i for i in range(len(tokens)) for p in phrases if tuple(tokens[i:i + len(p)]) == p]


def leaks(text: str, phrases: list[tuple[str, list[Phrase], list[Phrase]]]) -> list[str]:
    """Passages of ``text`` that name a bug's class and its value within ``WINDOW`` tokens of each other."""
    tokens = _tokens(text)
    found = []
    for name, classes, values in phrases:
        at = _starts(tokens, values)
        for i in _starts(tokens, classes):
            near = [j for j in at if abs(i - j) <= WINDOW]
            if near:
                lo, hi = min(i, *near), max(i, *near)
                found.append(f"{name}: {' '.join(tokens[max(lo - 3, 0):hi + 4])!r}")
    return found


def _strings(path: Path) -> str:
    """Every string literal of a Python source file (f-strings' literal parts included), one per line."""
    tree = ast.parse(path.read_text())
    return "\n".join(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def planner_visible_texts() -> dict[str, str]:
    texts: dict[str, str] = {}
    prompts = resources.files("sleuth.prompts")
    for f in prompts.iterdir():
        if f.name.endswith((".md", ".json")):
            texts[f"prompts/{f.name}"] = f.read_text()
    texts["tool schemas"] = json.dumps(investigation_tools().schemas())
    for m in TOOL_MODULES:
        texts[f"{m.__name__} docstring"] = m.__doc__ or ""
        texts[f"{m.__name__} result schema"] = json.dumps(m.Result.model_json_schema())
    for folder in ("agent/planners", "agent/llm"):
        for path in sorted((ROOT / folder).glob("*.py")):
            texts[str(path.relative_to(ROOT))] = _strings(path)
    texts["tests/llm_stub.py"] = _strings(ROOT / "tests" / "llm_stub.py")
    return texts


def test_the_scan_finds_a_planted_bug_where_one_is_named() -> None:
    default = bug_phrases(load_world())
    assert leaks("e.g. 'a realistic photograph of a kitten. it is on a frozen lake.'", default)
    assert leaks("an orange puppy", default) and leaks("a charcoal drawing of a koi", default)
    assert not leaks("a cat. it is on a beach. a realistic photograph of a fly in a kitchen. the snow", default)


@pytest.mark.parametrize("world", packaged_worlds(), ids=lambda w: w.name)
def test_no_prompt_schema_or_template_names_a_planted_bug(world: World) -> None:
    phrases = bug_phrases(world)
    found = {where: hits for where, text in planner_visible_texts().items() if (hits := leaks(text, phrases))}
    assert not found, found
