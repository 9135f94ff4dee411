"""The audit config: which backends, which classes, what budgets, which planner. YAML, TOML or JSON.

Backends are a ``BackendSpecs`` (the settings the backend flags hold: ``generator``, ``classifier``, ``captioner``,
``embedder``, ``editor`` specs, ``world``, ``device``, ...). Planner settings are the planner flags by their dest name
(``name`` is ``--planner``; ``llm``, ``api_base``, ...), parsed by the same parser as the command line, so a config
and a command line never disagree about what a setting means.

```yaml
backends: {world: default}   # or e.g. {classifier: "torchvision:resnet50", generator: "diffusers:..."}
classes: [fly, cat]          # or: all
planner: {name: protocol, baseline_n: 200}
budget:
  per_class: {images: 3000, seconds: 900}
  total: {images: 5000, seconds: 3600, cost_usd: 2.0}
seed: 0
criterion: top1
alpha: 0.05
```
"""

from __future__ import annotations

import argparse
import difflib
import json
import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sleuth.agent.cli import UsageError
from sleuth.tools.backends.base import BackendError
from sleuth.tools.backends.specs import BackendSpecs

MAX_IMAGES = 1_000_000


class Limits(BaseModel):
    """Most a class (or the whole audit) may spend; an unset limit does not bind."""

    model_config = ConfigDict(extra="forbid")

    images: int | None = Field(None, ge=1, le=MAX_IMAGES, description="Generated images.")
    seconds: float | None = Field(None, gt=0, description="Wall time, checked between planner turns.")
    cost_usd: float | None = Field(None, ge=0, description="LLM planner cost, as recorded in its turns.")


class Budgets(BaseModel):
    model_config = ConfigDict(extra="forbid")

    per_class: Limits = Field(default_factory=lambda: Limits(images=20_000))
    total: Limits = Field(default_factory=Limits)


class PlannerSettings(BaseModel):
    """``name`` is the ``--planner`` choice; other keys are planner flags by their dest name."""

    model_config = ConfigDict(extra="allow")

    name: str | None = Field(None, description="protocol, llm, ...; default: llm when an llm model is set.")
    baseline_n: int = Field(1000, ge=50, le=20_000, description="Images for each class baseline.")
    max_turns: int = Field(100, ge=1, le=10_000, description="Most planner turns per class.")


class AuditConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backends: BackendSpecs = Field(default_factory=BackendSpecs, description="Which models (default: toyworld).")
    classes: list[str] | Literal["all"] = Field(description="Classes to audit, in order, or 'all'.")
    planner: PlannerSettings = Field(default_factory=PlannerSettings)
    budget: Budgets = Field(default_factory=Budgets)
    seed: int = Field(0, ge=0, le=65535, description="Investigation seed of every class.")
    criterion: Literal["top1", "topk", "parent"] = "top1"
    alpha: float = Field(0.05, gt=0, lt=0.5)

    @field_validator("planner", mode="before")
    @classmethod
    def _planner_name(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v

    @field_validator("classes")
    @classmethod
    def _classes(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, list):
            if not v:
                raise ValueError("name at least one class, or 'all'")
            dupes = sorted({c for c in v if v.count(c) > 1})
            if dupes:
                raise ValueError(f"classes listed twice: {', '.join(dupes)}")
        return v

    @property
    def per_class_images(self) -> int:
        return self.budget.per_class.images or 20_000


def _one_line(e: ValidationError, source: str) -> str:
    parts = []
    for err in e.errors()[:4]:
        loc = ".".join(str(p) for p in err["loc"]) or "config"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown setting"
        parts.append(f"{loc}: {msg}")
    more = f" (+{len(e.errors()) - 4} more)" if len(e.errors()) > 4 else ""
    return f"{source}: " + "; ".join(parts) + more


def parse_config(data: Any, source: str = "config") -> AuditConfig:
    if not isinstance(data, dict):
        raise UsageError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
    try:
        config = AuditConfig.model_validate(data)
    except ValidationError as e:
        raise UsageError(_one_line(e, source)) from None
    # Malformed specs and planner settings fail here, before any model loads.
    try:
        config.backends.parsed()
    except BackendError as e:
        raise UsageError(f"{source}: backends: {e}") from None
    planner_namespace(config)
    return config


def load_config(path: str | Path) -> AuditConfig:
    """Read and validate an audit config; every problem is one line naming the file and the setting."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    suffix = p.suffix.lower()
    try:
        if suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, yaml.YAMLError) as e:
        kind = {".toml": "TOML", ".json": "JSON"}.get(suffix, "YAML")
        detail = " ".join(str(e).split())[:160]
        raise UsageError(f"{path} is not valid {kind}: {detail}") from None
    return parse_config(data, str(path))


# -- settings as command-line namespaces ------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def __init__(self, section: str) -> None:
        super().__init__(add_help=False, exit_on_error=False)
        self.section = section

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.section}: {message}")


def _argv(parser: argparse.ArgumentParser, settings: dict[str, Any], section: str) -> list[str]:
    """Command-line words for ``settings`` (keys are flag dests), so the flag parser checks and converts them."""
    by_dest = {a.dest: a for a in parser._actions if a.option_strings}
    argv: list[str] = []
    for key, value in settings.items():
        action = by_dest.get(key)
        if action is None:
            near = difflib.get_close_matches(key, sorted(by_dest), n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise UsageError(f"{section}.{key}: unknown setting{hint}; known: {', '.join(sorted(by_dest))}")
        flag = action.option_strings[-1]
        if action.nargs == 0:  # a switch: true turns it on
            if value is True:
                argv.append(flag)
            elif value not in (False, None):
                raise UsageError(f"{section}.{key}: expected true or false, got {value!r}")
        elif value is None:
            continue
        elif isinstance(value, list):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


def planner_namespace(config: AuditConfig) -> argparse.Namespace:
    """The planner flags a config names (``name`` is ``--planner``), parsed as the command line would."""
    from sleuth.agent.planner_args import add_planner_arguments, check_planner_args

    p = _Parser("planner")
    add_planner_arguments(p)
    extra = dict(config.planner.model_extra or {})
    settings = {"planner": config.planner.name, **extra} if config.planner.name else extra
    try:
        ns = p.parse_args(_argv(p, settings, "planner"))
    except argparse.ArgumentError as e:
        raise UsageError(f"planner: {e}") from None
    ns.baseline_n = config.planner.baseline_n
    ns.alpha = config.alpha
    check_planner_args(ns)
    return ns
