"""The audit config: which backends, which classes, what budgets, which planner. YAML, TOML or JSON.

Backends are a ``BackendSpecs`` (the settings the backend flags hold: ``generator``, ``classifier``, ``captioner``,
``embedder``, ``editor`` specs, ``world``, ``device``, ...); the planner is a ``PlannerConfig`` (``name``,
``baseline_n``, ``max_turns``, ``llm: {model: ..., api_base: ...}``; ``llm: MODEL`` and the flags' names such as
``api_base`` or ``llm_timeout`` are read too). They are the models the command line fills, so a config and a command
line never disagree about what a setting means or what its default is.

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

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sleuth.agent.config import Limits, RunConfig, RunSettings, one_line
from sleuth.agent.errors import UsageError
from sleuth.tools.backends.base import BackendError


class Budgets(BaseModel):
    model_config = ConfigDict(extra="forbid")

    per_class: Limits = Field(default_factory=lambda: Limits(images=RunConfig.model_fields["budget"].default))
    total: Limits = Field(default_factory=Limits)


class AuditConfig(RunSettings):
    classes: list[str] | Literal["all"] = Field(description="Classes to audit, in order, or 'all'.")
    budget: Budgets = Field(default_factory=Budgets)

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
        return self.budget.per_class.images or RunConfig.model_fields["budget"].default


def parse_config(data: Any, source: str = "config") -> AuditConfig:
    if not isinstance(data, dict):
        raise UsageError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
    try:
        config = AuditConfig.model_validate(data)
    except ValidationError as e:
        raise UsageError(one_line(e, source)) from None
    # Malformed specs fail here, before any model loads.
    try:
        config.backends.parsed()
    except BackendError as e:
        raise UsageError(f"{source}: backends: {e}") from None
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
