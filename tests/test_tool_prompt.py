"""The LLM's tool guide (prompts/tools.md) names every argument of every tool, optional ones marked."""

from __future__ import annotations

import importlib
import re

import pytest

from sleuth.agent.planners.llm import system_prompt
from sleuth.tools import investigation_tools as default_registry

SIGNATURE = re.compile(r"^- (\w+)\(([^)]*)\)", re.M)


def signatures() -> dict[str, list[str]]:
    text = system_prompt(label="cat", class_prompt="a photo of a cat", labels=["cat", "dog"], budget=1000,
                         alpha=0.05, mode="investigate", confirmations=13)
    return {name: [a.strip() for a in args.split(",") if a.strip()] for name, args in SIGNATURE.findall(text)}


TOOLS = ("caption_failures", "edit_image", "finish", "generate_and_classify", "measure_rate", "perturb_caption",
         "record_finding")


def test_every_tool_is_in_the_guide():
    assert set(signatures()) == set(default_registry().names()) == set(TOOLS)


@pytest.mark.parametrize("name", TOOLS)
def test_the_guide_lists_each_argument_as_the_schema_defines_it(name):
    args = importlib.import_module(f"sleuth.tools.{name}").Args
    expected = [f + ("" if field.is_required() else "?") for f, field in args.model_fields.items()]
    assert signatures()[name] == expected


def test_the_guide_states_the_declared_confirmation_attempts():
    text = system_prompt(label="cat", class_prompt="a photo of a cat", labels=["cat"], budget=1000, alpha=0.05,
                         mode="investigate", confirmations=13)
    assert "13 confirmation attempts" in text and "alpha/13" in text and "$" not in text
