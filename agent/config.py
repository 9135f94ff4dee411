"""One config model for what a run does: the class, budgets, statistics settings, backends and planner.

Command-line flags and audit files (YAML, TOML, JSON) both fill these models, and every default is defined here
once. A run records its ``RunConfig`` in ``run_started``; ``RunConfig.recorded`` also reads the older flat shape
(``baseline_n`` beside ``class``, ``planner`` as a name, ``world`` at the top).
"""

from __future__ import annotations

import difflib
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sleuth.agent.llm.client import LLMConfig
from sleuth.tools.backends.specs import BackendSpecs
from sleuth.tools.defaults import ALPHA, BASELINE_N, BUDGET, CONFIRMATION_DRAWS, MAX_CONFIRMATIONS
from sleuth.tools.designs import ConfirmationDesign

MAX_IMAGES = 1_000_000
Criterion = Literal["top1", "topk", "parent"]

# Planner settings an audit file (or an older recorded config) may give as flat command-line dests.
_LLM_KEYS = {"llm": "model", "api_base": "api_base", "api_key_env": "api_key_env", "llm_timeout": "timeout_s",
             "llm_retries": "retries", "tool_choice": "tool_choice",
             "call_format": "call_format"}
_PLANNER_KEYS = {"planner_sees_images": "sees_images", "llm_context": "context_tokens"}


class PlannerConfig(BaseModel):
    """Which planner plans, and how."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("protocol", description="A planner of sleuth.agent.planners.PLANNERS: protocol, wiles, "
                                              "random, llm.")
    baseline_n: int | None = Field(None, ge=50, le=20_000, description=(
        "Images of the class baseline the planner asks for (default: the planner's own, 300 for protocol and "
        f"{BASELINE_N} for the others)."))
    max_turns: int | None = Field(None, ge=1, le=10_000, description=(
        "Most planner turns in one run (default: the planner's own, 1000 for protocol and 100 for the others)."))
    max_seconds: float | None = Field(None, gt=0, le=7 * 86_400, description=(
        "Most wall-clock seconds of planning and tool calls in one run; the run ends after the turn that crosses "
        "it (status time_limit), findings kept."))
    llm: LLMConfig | None = Field(None, description="The language model of the llm planner (or of the protocol "
                                                    "planner's proposer).")
    proposer: Literal["vocabulary", "llm"] = Field("vocabulary", description=(
        "Who proposes the protocol planner's candidates besides the failure captions: the general vocabulary, or "
        "the vocabulary and a language model (one request per class, given the failure captions; needs llm)."))
    sees_images: bool = Field(False, description="Show a vision model thumbnails of the latest results' images.")
    context_tokens: int = Field(24_000, ge=2_000, le=2_000_000,
                                description="Rough token budget of each LLM request; older results are summarised.")

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        """``llm: MODEL`` and the other flag-named keys, as audit files and older transcripts write them; a
        recorded name ``llm:MODEL`` carries the model."""
        if isinstance(data, str):
            data = {"name": data}
        if not isinstance(data, dict):
            return data
        data = dict(data)
        llm = data.get("llm")
        llm = {"model": llm} if isinstance(llm, str) else dict(llm) if isinstance(llm, dict) else {}
        for key, to in _LLM_KEYS.items():
            if key != "llm" and key in data:
                llm[to] = data.pop(key)
        for key, to in _PLANNER_KEYS.items():
            if key in data:
                data[to] = data.pop(key)
        name = data.get("name")
        if isinstance(name, str) and name.startswith("llm:"):
            data["name"] = "llm"
            llm.setdefault("model", name[4:])
        elif isinstance(name, str) and name.startswith("protocol+llm:"):
            data["name"] = "protocol"
            data["proposer"] = "llm"
            llm.setdefault("model", name.removeprefix("protocol+llm:"))
        if llm:
            data["llm"] = llm
            data.setdefault("name", "protocol" if data.get("proposer") == "llm" else "llm")
        return data

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        from sleuth.agent.planners import PLANNERS

        if name not in PLANNERS:
            raise ValueError(f"unknown planner {name!r} (known: {', '.join(PLANNERS)})")
        return name

    @model_validator(mode="after")
    def _needs_model(self) -> PlannerConfig:
        if self.name == "llm" and self.llm is None:
            raise ValueError("the llm planner needs a model (--llm MODEL, or planner.llm.model)")
        if self.proposer == "llm":
            if self.name != "protocol":
                raise ValueError(f"the llm proposer adds candidates to the protocol planner, not to {self.name!r}")
            if self.llm is None:
                raise ValueError("the llm proposer needs a model (--llm MODEL, or planner.llm.model)")
        elif self.name != "llm" and self.llm is not None:
            raise ValueError(f"a language model is set but the planner is {self.name!r}; choose the llm planner, or "
                             "the llm proposer (--proposer llm)")
        return self


def one_line(e: ValidationError, source: str = "", *, flags: dict[str, str] | None = None) -> str:
    """A validation error as one line: each problem named by its setting (or the flag that sets it), with a
    did-you-mean for an unknown setting."""
    parts = []
    for err in e.errors()[:4]:
        loc = ".".join(str(p) for p in err["loc"] if not isinstance(p, int)) or "config"
        name = (flags or {}).get(loc, loc)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            known = _known_settings(loc)
            near = difflib.get_close_matches(loc.rsplit(".", 1)[-1], known, n=1, cutoff=0.6)
            msg = "unknown setting" + (f" (did you mean {near[0]!r}?)" if near else "")
        got = err.get("input")
        shown = f"; got {got!r}" if err["type"] not in ("extra_forbidden", "missing", "value_error") and \
            not isinstance(got, dict | list) else ""
        parts.append(f"{name}: {msg}{shown}")
    more = f" (+{len(e.errors()) - 4} more)" if len(e.errors()) > 4 else ""
    return (f"{source}: " if source else "") + "; ".join(parts) + more


def _known_settings(loc: str) -> list[str]:
    """Setting names beside an unknown one, for the did-you-mean."""
    parent = loc.rsplit(".", 1)[0] if "." in loc else ""
    models: dict[str, type[BaseModel]] = {"planner": PlannerConfig, "planner.llm": LLMConfig, "backends": BackendSpecs}
    if parent == "":
        return list(AuditSettingsNames)
    if parent not in models:
        return []
    names = list(models[parent].model_fields)
    if parent == "planner":
        names += list(_LLM_KEYS) + list(_PLANNER_KEYS)
    return names


def _legacy_planner(data: dict[str, Any]) -> dict[str, Any]:
    """A recorded planner section of the older flat shape (settings beside ``class``), as ``PlannerConfig`` reads it."""
    planner = data.get("planner")
    out: dict[str, Any] = {"name": planner} if isinstance(planner, str) else dict(planner or {})
    for key in ("llm", "api_base", "api_key_env", "planner_sees_images", "baseline_n"):
        if data.get(key) is not None:
            out[key] = data[key]
    return out


class RunSettings(BaseModel):
    """What every investigation of a run or an audit shares."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    seed: int = Field(0, ge=0, le=65535, description="Investigation seed: selects the blocks of fresh image seeds.")
    confirmation_draw: int | None = Field(None, ge=0, lt=CONFIRMATION_DRAWS, description=(
        "Which block of the seed's confirmation seeds the run confirms on (default: the first no earlier run of "
        "the class with this seed and these backends claimed in this prediction cache, so a re-audit confirms on "
        "fresh images; recorded, so forks, resumes and replays keep it)."))
    criterion: Criterion = Field("top1", description="Failure criterion: top-1 wrong, label not in the top 3, or no "
                                                     "top-3 label under the true label's parent (Wiles et al.).")
    alpha: float = Field(ALPHA, gt=0, lt=0.5, description="Family-wise error level of the findings.")
    backends: BackendSpecs = Field(default_factory=BackendSpecs, description="Which models (default: toyworld).")
    planner: PlannerConfig = Field(default_factory=PlannerConfig)
    confirmations: int | None = Field(None, ge=1, le=100, description=(
        "Declared confirmation attempts: each is tested at alpha / this (default: the planner's own; protocol "
        "declares 40 whatever the budget, the LLM planner one per 125 images from 10 to 80, the others 10)."))
    confirmation_designs: list[ConfirmationDesign] | None = Field(None, description=(
        "Declared confirmation sizes, each with its share of the attempts (their sum is the family; default: the "
        "planner's own; without any, the first confirmation's sizes serve every attempt)."))
    confirmation_sizes: Literal["fixed", "legacy"] = Field("fixed", description=(
        "'fixed': a confirmation's sizes are fixed before the confirmation baseline is drawn; 'legacy': runs "
        "recorded before that rule, replayed as they ran."))

    @field_validator("planner", mode="before")
    @classmethod
    def _planner_name(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v


class Limits(BaseModel):
    """Most a class (or a whole audit) may spend; an unset limit does not bind."""

    model_config = ConfigDict(extra="forbid")

    images: int | None = Field(None, ge=1, le=MAX_IMAGES, description="Generated images.")
    seconds: float | None = Field(None, gt=0, description="Wall time, checked between planner turns.")
    cost_usd: float | None = Field(None, ge=0, description="LLM planner cost, as recorded in its turns.")


class RunConfig(RunSettings):
    """One investigation of one class."""

    label: str = Field(alias="class", description="The class under audit.")
    budget: int = Field(BUDGET, ge=1, le=MAX_IMAGES, description="Most images the investigation may generate.")
    audit: str | None = Field(None, description="The audit (run directory name) this investigation belongs to.")
    limits: dict[str, Limits] | None = Field(None, description="The audit's per-class and total limits.")

    @classmethod
    def recorded(cls, config: dict[str, Any]) -> RunConfig:
        """The config a ``run_started`` event recorded, in this shape or the older flat one."""
        data = dict(config)
        if "baseline_n" in data or isinstance(data.get("planner"), str) or "llm" in data:
            data["planner"] = _legacy_planner(data)
            for key in ("baseline_n", "llm", "api_base", "api_key_env", "planner_sees_images"):
                data.pop(key, None)
        if "world" in data:
            world = data.pop("world")
            backends = dict(data.get("backends") or {})
            if world is not None:
                backends.setdefault("world", world)
            data["backends"] = backends
        data.pop("bench", None)
        data.setdefault("confirmations", MAX_CONFIRMATIONS)  # recorded before the family could be declared
        data.setdefault("confirmation_sizes", "legacy")  # recorded before sizes were fixed ahead of the baseline
        data.setdefault("confirmation_draw", 0)  # recorded before re-audits drew fresh confirmation seeds
        return cls.model_validate(data)

    def record(self) -> dict[str, Any]:
        """The config as ``run_started`` records it (strict JSON, the class under its own name, no credentials in
        a server URL)."""
        out = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        llm = out["planner"].get("llm")
        if llm and llm.get("api_base"):
            llm["api_base"] = public_url(llm["api_base"])
        return out


def public_url(url: str) -> str:
    """``url`` without any user:password part (it would otherwise be written to the transcript)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


AuditSettingsNames = ("seed", "confirmation_draw", "criterion", "alpha", "confirmations", "backends", "planner",
                      "classes", "budget", "executor")
"""Top-level settings of an audit file."""
