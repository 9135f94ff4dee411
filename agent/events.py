"""Transcript events: one pydantic model per kind, a discriminated union, a schema version and upgrades.

A transcript is a JSONL file of these events. Writers fill the envelope (``seq``, ``ts``, ``prev_hash``, ``hash``);
callers construct events with the payload fields only. Events written by an older schema are upgraded when read,
through numbered functions in ``UPGRADES`` (``UPGRADES[n]`` turns a version-``n`` event into version ``n + 1``), so
old transcripts stay readable without rewriting them (rewriting would break their hash chain).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

SCHEMA_VERSION = 1

UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}
"""``UPGRADES[n]`` maps an event dict of schema version ``n`` to version ``n + 1`` (append only, never edit)."""

Status = Literal["completed", "interrupted", "error", "max_turns", "budget_spent", "time_limit"]


def json_safe(obj: Any) -> Any:
    """``obj`` with non-finite floats as the strings "Infinity", "-Infinity" and "NaN": lines stay strict JSON
    (an infinite rate ratio is legitimate: a baseline with no failures), and pydantic reads the strings back as
    floats."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def canonical_json(obj: Any) -> str:
    """The one serialisation used for hashing and for transcript lines."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def event_hash(obj: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of an event dict, without its own ``hash`` field."""
    body = {k: v for k, v in obj.items() if k != "hash"}
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """Bring an event dict of any older schema version to ``SCHEMA_VERSION``; newer versions are refused."""
    # Module globals are read at call time so the mechanism can be exercised with a patched version and table.
    current = SCHEMA_VERSION
    v = data.get("v", current)
    if not isinstance(v, int):
        raise ValueError(f"schema version must be an integer, got {v!r}")
    if v > current:
        raise ValueError(f"event has schema v{v}, newer than this sleuth reads (v{current}); upgrade sleuth")
    while v < current:
        step = UPGRADES.get(v)
        if step is None:
            raise ValueError(f"no upgrade from schema v{v} to v{v + 1}")
        data = step(dict(data))
        v += 1
        data["v"] = v
    return data


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ToolCall(BaseModel):
    id: str
    name: str
    arguments: dict[str, Any] | str = Field(
        default_factory=dict, description="Parsed arguments, or the raw text when the model sent invalid JSON."
    )


class _Event(BaseModel):
    # "strings" keeps non-finite floats as floats in model_dump(mode="json") (the default turns them into null);
    # the writer then spells them as strings with json_safe.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    v: int = SCHEMA_VERSION
    seq: int = Field(default=0, description="0-based line number in the transcript; set by the writer.")
    ts: str = Field(default="", description="ISO-8601 UTC time of writing; set by the writer.")
    prev_hash: str = Field(default="", description="hash of the previous event; empty for the first.")
    hash: str = Field(default="", description="sha256 of this event's canonical JSON without this field.")

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        return upgrade(data) if isinstance(data, dict) else data


class RunStarted(_Event):
    kind: Literal["run_started"] = "run_started"
    run_id: str
    command: str
    config: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)
    seeds: dict[str, Any] = Field(default_factory=dict)
    planner: str
    backends: dict[str, str] = Field(default_factory=dict)
    class_prompt: str | None = Field(None, description="How the generator is asked for a plain image of the class.")


class Turn(BaseModel):
    """What a planner decides in one turn: reasoning, tool calls, or a final answer."""

    reasoning: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    final: str | None = None
    model: str | None = None
    usage: Usage | None = None
    cost_usd: float | None = None
    latency_s: float | None = Field(None, description="Seconds the planner took to decide (model requests included).")
    requests: int | None = Field(None, description="Model requests sent for this turn, retries included.")


class PlannerTurn(_Event, Turn):
    kind: Literal["planner_turn"] = "planner_turn"


class ToolCalled(_Event):
    kind: Literal["tool_called"] = "tool_called"
    call_id: str
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ToolReturned(_Event):
    kind: Literal["tool_returned"] = "tool_returned"
    call_id: str
    name: str
    ok: bool
    result: dict[str, Any] | None = None
    error: str | None = None
    duration_s: float = 0.0
    artifacts: list[str] = Field(default_factory=list, description="Artifact refs the result mentions.")
    images_used: int = Field(0, description="Images the call generated (charged to the image budget).")
    images_left: int | None = Field(None, description="Images left in the budget after the call.")
    usage: Usage | None = Field(None, description="Tokens of the language model the tool itself asked (e.g. "
                                                  "perturb_caption's rewrites); None when it asked none.")
    cost_usd: float | None = Field(None, description="What those requests cost, when the provider prices them.")


class UserMessage(_Event):
    kind: Literal["user_message"] = "user_message"
    text: str


class Finding(_Event):
    kind: Literal["finding"] = "finding"
    finding: dict[str, Any]
    finding_id: str


class ModePlaced(_Event):
    """A finding placed in a failure mode when it was recorded: a mode of its own, or another phrasing of an earlier
    finding's cause (agent/modes.py). Written by the loop after the call that recorded the finding."""

    kind: Literal["mode"] = "mode"
    mode_id: str
    finding_id: str
    reason: str = Field(description="Why the finding is in this mode, from what the run measured.")
    idea: str | None = Field(None, description="What the mode's founding finding's failures show (a sentence).")
    labels: list[str] = Field(default_factory=list, description="The wrong labels the mode's founder fails as.")


class RunFinished(_Event):
    kind: Literal["run_finished"] = "run_finished"
    status: Status
    answer: str | None = None
    n_findings: int = 0


class ErrorEvent(_Event):
    kind: Literal["error"] = "error"
    message: str
    where: str = ""
    traceback: str | None = None


Event = Annotated[
    RunStarted | PlannerTurn | ToolCalled | ToolReturned | UserMessage | Finding | ModePlaced | RunFinished
    | ErrorEvent,
    Field(discriminator="kind"),
]

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def parse_event(data: dict[str, Any]) -> Event:
    """Validate one event dict (upgrading older schema versions first, so upgrades may even rename kinds)."""
    return EVENT_ADAPTER.validate_python(upgrade(data))
