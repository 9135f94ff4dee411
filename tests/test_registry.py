"""The tool contract: modules to tools, LLM-ready schemas, readable argument errors."""

from __future__ import annotations

import json
import types
from enum import StrEnum
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from sleuth.tools.registry import Registry, ToolError, clean_schema, tool_from_module


class Shift(StrEnum):
    snow = "snow"
    night = "night"


class Window(BaseModel):
    start: int = Field(description="First seed.", ge=0)
    title: str = Field("", description="A property that happens to be called title.")


class SurveyArgs(BaseModel):
    prompt: str = Field(description="Text prompt of the images.")
    n: int = Field(100, ge=1, le=5000, description="Number of images.")
    shift: Shift = Field(description="Which shift to apply.")
    mode: Literal["sample", "counterfactual"] = Field("sample", description="How to measure.")
    window: Window | None = Field(None, description="Optional seed window.")
    windows: list[Window] = Field(default_factory=list, description="More windows.")


class SurveyResult(BaseModel):
    k: int
    n: int


def make_module(name="survey", doc="Survey a prompt under a shift.\n\nLonger text the planner does not see.",
                **overrides):
    m = types.ModuleType(f"fake_tools.{name}", doc)
    m.NAME = name
    m.Args = SurveyArgs
    m.Result = SurveyResult

    def run(args, ctx):
        if args.prompt == "budget":
            raise ToolError("image budget exhausted: 100 asked, 5 left")
        return SurveyResult(k=args.n // 4, n=args.n)

    m.run = run
    for k, v in overrides.items():
        setattr(m, k, v)
    return m


@pytest.fixture()
def registry():
    return Registry([tool_from_module(make_module()), tool_from_module(make_module("summarise"))])


def walk_keys(node):
    if isinstance(node, dict):
        for k, v in node.items():
            yield k
            yield from walk_keys(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk_keys(v)


def test_tool_from_module_reads_the_contract():
    tool = tool_from_module(make_module())
    assert tool.name == "survey"
    assert tool.description == "Survey a prompt under a shift."
    assert tool.args_model is SurveyArgs and tool.result_model is SurveyResult


def test_tool_from_module_names_what_is_missing():
    with pytest.raises(TypeError, match=r"fake_tools.survey lacks: Args .*; run\(args, ctx\)"):
        tool_from_module(make_module(Args=dict, run=None))
    with pytest.raises(TypeError, match="docstring"):
        tool_from_module(make_module(doc=None))
    with pytest.raises(TypeError, match="NAME"):
        tool_from_module(make_module(NAME=""))


def test_schema_is_inlined_untitled_and_described(registry):
    schemas = registry.schemas()
    assert [s["function"]["name"] for s in schemas] == ["survey", "summarise"]
    s = schemas[0]
    assert s["type"] == "function" and s["function"]["description"] == "Survey a prompt under a shift."
    params = s["function"]["parameters"]
    text = json.dumps(params)
    assert "$ref" not in text and "$defs" not in text
    keys = list(walk_keys(params))
    # The only "title" left is the property of that name, not a schema title.
    assert keys.count("title") == 2 and set(params["properties"]["window"]["anyOf"][0]["properties"]) == {
        "start", "title"}
    assert params["type"] == "object" and params["required"] == ["prompt", "shift"]
    props = params["properties"]
    assert all(p.get("description") for p in props.values())
    assert props["shift"]["enum"] == ["snow", "night"] and props["shift"]["description"] == "Which shift to apply."
    assert props["mode"]["enum"] == ["sample", "counterfactual"]
    assert props["n"]["minimum"] == 1 and props["n"]["maximum"] == 5000
    window = props["window"]["anyOf"][0]
    assert window["properties"]["start"] == {"description": "First seed.", "minimum": 0, "type": "integer"}
    assert {"type": "null"} in props["window"]["anyOf"]
    assert props["windows"]["items"]["required"] == ["start"]
    # The schemas are copies: changing one does not change the registry.
    params["properties"].clear()
    assert registry.schemas()[0]["function"]["parameters"]["properties"]


def test_recursive_schema_is_refused():
    class Node(BaseModel):
        child: Node | None = None

    with pytest.raises(ValueError, match="recursive"):
        clean_schema(Node.model_json_schema())


def test_parse_args_accepts_json_text_and_dicts(registry):
    a = registry.parse_args("survey", '{"prompt": "a cat", "shift": "snow", "window": {"start": 5}}')
    assert (a.prompt, a.n, a.shift, a.window.start) == ("a cat", 100, Shift.snow, 5)
    assert registry.parse_args("survey", {"prompt": "x", "shift": "night", "n": 7}).n == 7


def test_malformed_json_is_a_readable_tool_error(registry):
    with pytest.raises(ToolError) as err:
        registry.parse_args("survey", '{"prompt": "a cat", "n": ')
    msg = str(err.value)
    assert msg.startswith("arguments for survey are not valid JSON (Expecting value at line 1 column 26)")
    assert msg.endswith("Send one JSON object.")
    with pytest.raises(ToolError, match="must be a JSON object, got list"):
        registry.parse_args("survey", "[1, 2]")


def test_validation_errors_list_each_field_expected_and_given(registry):
    with pytest.raises(ToolError) as err:
        registry.parse_args("survey", {"n": 0, "shift": "fog", "windw": [], "window": {"start": -1}})
    lines = str(err.value).splitlines()
    assert lines[0] == "invalid arguments for survey:"
    assert lines[1:] == [
        "- windw: unexpected argument (did you mean 'window'?); expected arguments: prompt, n, shift, mode, window, "
        "windows",
        "- prompt: missing; expected string (Text prompt of the images.)",
        "- n: Input should be greater than or equal to 1; expected integer >= 1, <= 5000; got 0",
        "- shift: Input should be 'snow' or 'night'; expected one of \"snow\", \"night\"; got 'fog'",
        "- window.start: Input should be greater than or equal to 0; got -1",
    ]


def test_unknown_tool_names_the_closest_and_the_available(registry):
    with pytest.raises(ToolError) as err:
        registry.get("survy")
    assert str(err.value) == "unknown tool 'survy'. Did you mean 'survey'? Available tools: survey, summarise."
    with pytest.raises(ToolError, match="Available tools: survey, summarise.$"):
        registry.call("zzz", {}, None)


def test_call_runs_and_tool_errors_pass_through(registry):
    r = registry.call("survey", '{"prompt": "a cat", "shift": "snow", "n": 40}', ctx=None)
    assert isinstance(r, SurveyResult) and (r.k, r.n) == (10, 40)
    with pytest.raises(ToolError, match="budget exhausted"):
        registry.call("survey", {"prompt": "budget", "shift": "snow"}, ctx=None)


def test_duplicate_names_and_wrong_result_types_are_bugs():
    with pytest.raises(ValueError, match="two tools"):
        Registry([tool_from_module(make_module()), tool_from_module(make_module())])
    bad = Registry([tool_from_module(make_module(run=lambda args, ctx: {"k": 1}))])
    with pytest.raises(TypeError, match="not its Result model"):
        bad.call("survey", {"prompt": "x", "shift": "snow"}, None)
