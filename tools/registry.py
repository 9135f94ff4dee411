"""The tool contract: a tool is a module with ``NAME``, ``Args``, ``Result``, ``run(args, ctx)`` and a docstring.

Optional, each about a ``Result``: ``summary(result) -> str`` (one line for a language model's context),
``render(result) -> list[Line]`` (styled lines for a terminal; see ``sleuth.tools.text``), ``replayable(result) ->
bool`` (False: the call cannot be run again offline, e.g. its output came from a language model) and
``conclusions(recorded, replayed)`` (the conclusions a re-run no longer reproduces).

The registry turns those modules into the schemas an LLM sees (OpenAI / litellm tool format), validates the
arguments a planner sends, runs the call, and reads recorded results back into the tool's ``Result`` (the one place a
transcript's JSON becomes typed again). ``ToolError`` is the caller's fault and goes back to the planner as text it
can act on; any other exception from a tool is a bug and stops the run.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ValidationError


class ToolError(Exception):
    """A problem the caller can fix (bad arguments, unknown class, exhausted budget); shown to the planner."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    args_model: type[BaseModel]
    result_model: type[BaseModel]
    run: Callable[[Any, Any], BaseModel]
    summary: Callable[[Any], str] | None = None
    render: Callable[[Any], list[Any]] | None = None
    replayable: Callable[[Any], bool] | None = None
    conclusions: Callable[[Any, Any], list[tuple[str, Any, Any]]] | None = None
    """``conclusions(recorded, replayed)``: the conclusions a re-run no longer reproduces, as (name, recorded,
    re-run); verification calls a difference in them *different*, any other difference at most *drifted*."""


def _is_model(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, BaseModel)


def tool_from_module(module: ModuleType) -> Tool:
    """Check a tool module against the contract and wrap it."""
    where = getattr(module, "__name__", repr(module))
    missing = []
    if not isinstance(getattr(module, "NAME", None), str) or not module.NAME:
        missing.append("NAME (a non-empty str)")
    if not _is_model(getattr(module, "Args", None)):
        missing.append("Args (a pydantic BaseModel subclass)")
    if not _is_model(getattr(module, "Result", None)):
        missing.append("Result (a pydantic BaseModel subclass)")
    if not callable(getattr(module, "run", None)):
        missing.append("run(args, ctx)")
    if not (module.__doc__ or "").strip():
        missing.append("a module docstring (its first paragraph is the description the planner sees)")
    if missing:
        raise TypeError(f"tool module {where} lacks: {'; '.join(missing)}")
    first = inspect.cleandoc(module.__doc__ or "").split("\n\n")[0]
    return Tool(name=module.NAME, description=" ".join(first.split()), args_model=module.Args,
                result_model=module.Result, run=module.run, summary=getattr(module, "summary", None),
                render=getattr(module, "render", None), replayable=getattr(module, "replayable", None),
                conclusions=getattr(module, "conclusions", None))


# -- schemas ---------------------------------------------------------------------------------------------

_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "contains")


def clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Inline ``$defs`` references and drop ``title`` keywords: many LLM tool APIs handle neither well."""
    defs = schema.get("$defs", {})

    def walk(node: Any, stack: tuple[str, ...]) -> Any:
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[-1]
            if name in stack:
                raise ValueError(f"recursive schema ({' -> '.join((*stack, name))}) cannot be inlined")
            if name not in defs:
                raise ValueError(f"schema reference {ref!r} has no definition")
            out.update(walk(defs[name], (*stack, name)))
        for key, value in node.items():
            if key in ("$ref", "$defs", "title"):
                continue
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {k: walk(v, stack) for k, v in value.items()}
            elif key in _SCHEMA_LISTS and isinstance(value, list):
                out[key] = [walk(v, stack) for v in value]
            elif key in _SCHEMA_ONE:
                out[key] = walk(value, stack)
            else:
                out[key] = value  # defaults, enums, descriptions: data, not schemas
        return out

    return walk(schema, ())


def _expected(prop: dict[str, Any]) -> str:
    """A short phrase for what a property schema accepts, e.g. ``integer >= 1`` or ``one of 'a', 'b'``."""
    if "enum" in prop:
        return "one of " + ", ".join(json.dumps(v) for v in prop["enum"])
    if "const" in prop:
        return f"exactly {json.dumps(prop['const'])}"
    if "anyOf" in prop:
        return " or ".join(_expected(p) for p in prop["anyOf"])
    kind = prop.get("type", "any value")
    if kind == "array" and isinstance(prop.get("items"), dict):
        kind = f"array of {_expected(prop['items'])}"
    bounds = [f"{op} {prop[k]}" for k, op in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
                                              ("exclusiveMaximum", "<")) if k in prop]
    return " ".join([str(kind), ", ".join(bounds)]).strip()


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Registry:
    """The tools a planner may call, by name."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        self._tools: dict[str, Tool] = {}
        self._parameters: dict[str, dict[str, Any]] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self._tools[tool.name] = tool

    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            near = difflib.get_close_matches(str(name), self.names(), n=1, cutoff=0.5)
            hint = f" Did you mean {near[0]!r}?" if near else ""
            raise ToolError(f"unknown tool {name!r}.{hint} Available tools: {', '.join(self.names())}.") from None

    def parameters(self, name: str) -> dict[str, Any]:
        """The cleaned JSON schema of a tool's arguments."""
        if name not in self._parameters:
            self._parameters[name] = clean_schema(self.get(name).args_model.model_json_schema())
        return self._parameters[name]

    def schemas(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": copy.deepcopy(self.parameters(t.name))}}
                for t in self._tools.values()]

    def parse_args(self, name: str, raw: str | dict[str, Any]) -> BaseModel:
        """Validate raw arguments (a JSON string or a dict); every problem comes back in one ``ToolError``."""
        tool = self.get(name)
        if isinstance(raw, str):
            if not raw.strip():
                raw = "{}"  # some models send an empty string for a call without arguments
            try:
                data = json.loads(raw)
            except json.JSONDecodeError as e:
                raise ToolError(f"arguments for {name} are not valid JSON ({e.msg} at line {e.lineno} column "
                                f"{e.colno}): {_short(raw, 200)}. Send one JSON object.") from None
        else:
            data = raw
        if not isinstance(data, dict):
            raise ToolError(f"arguments for {name} must be a JSON object, got {type(data).__name__}: {_short(data)}")
        props = self.parameters(name).get("properties", {})
        problems = self._unknown_fields(tool.args_model, data, props)
        try:
            args = tool.args_model.model_validate(data)
        except ValidationError as e:
            problems += [self._describe(err, props) for err in e.errors()]
        if problems:
            raise ToolError(f"invalid arguments for {name}:\n" + "\n".join(f"- {p}" for p in problems))
        return args

    @staticmethod
    def _unknown_fields(model: type[BaseModel], data: dict[str, Any], props: dict[str, Any]) -> list[str]:
        # pydantic ignores unknown keys by default; a misspelt argument would then silently take its default.
        if model.model_config.get("extra") == "allow":
            return []
        known = set(props) | set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}
        out = []
        for key in data:
            if key not in known:
                near = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                out.append(f"{key}: unexpected argument{hint}; expected arguments: {', '.join(props)}")
        return out

    @staticmethod
    def _describe(err: Any, props: dict[str, Any]) -> str:
        loc = ".".join(str(p) for p in err["loc"]) or "arguments"
        # Only a top-level field has its own schema at hand; nested errors rely on pydantic's message.
        prop = props.get(str(err["loc"][0])) if len(err["loc"]) == 1 else None
        expected = f"; expected {_expected(prop)}" if prop else ""
        if err["type"] == "missing":
            desc = f" ({prop['description']})" if prop and prop.get("description") else ""
            return f"{loc}: missing{expected}{desc}"
        return f"{loc}: {err['msg']}{expected}; got {_short(err.get('input'))}"

    def result(self, name: str, data: dict[str, Any] | None) -> BaseModel | None:
        """A recorded result read back into the tool's ``Result``; None for an unknown tool or a result that no
        longer fits it (a transcript of an older version)."""
        if data is None or name not in self._tools:
            return None
        try:
            return self._tools[name].result_model.model_validate(data)
        except ValidationError:
            return None

    def call(self, name: str, raw: str | dict[str, Any], ctx: Any) -> BaseModel:
        """Validate and run one call. ``ToolError`` is for the planner; anything else propagates as a bug."""
        tool = self.get(name)
        args = self.parse_args(name, raw)
        result = tool.run(args, ctx)
        if not isinstance(result, tool.result_model):
            raise TypeError(f"tool {name} returned {type(result).__name__}, not its Result model")
        return result
