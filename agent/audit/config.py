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
executor: {name: ray, num_gpus: 1}   # optional: where the classes run (default local, one after the other)
```

``executor`` says how the audit runs, not what it computes: it is kept out of the config an audit records in its
transcripts and summaries (a Ray audit's summary equals a local one's), and written apart in ``audit.json`` so that
``--resume`` continues the same way unless told otherwise.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationError, field_validator, model_validator

from sleuth.agent.config import Limits, RunConfig, RunSettings, one_line
from sleuth.agent.errors import UsageError
from sleuth.tools.backends.base import BackendError


class Budgets(BaseModel):
    model_config = ConfigDict(extra="forbid")

    per_class: Limits = Field(default_factory=lambda: Limits(images=RunConfig.model_fields["budget"].default))
    total: Limits = Field(default_factory=Limits)


class ExecutorConfig(BaseModel):
    """Where the classes run: here, one after the other (``local``), or at once on Ray workers (``ray``)."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["local", "ray"] = Field("local", description="local: one class after the other in this process; "
                                                               "ray: classes at once on Ray workers.")
    address: str | None = Field(None, description=(
        "Ray cluster to join: auto, HOST:PORT or ray://HOST:10001. Default: start a local cluster on 127.0.0.1."))
    workers: int | None = Field(None, ge=1, le=100_000, description=(
        "Classes investigated at once: Ray actors, each holding the loaded models. Default: as many as the "
        "cluster's CPUs, GPUs and memory hold, at most one per class; a local cluster gets workers x num_cpus CPUs."))
    num_cpus: float = Field(1.0, gt=0, le=1024, description="CPUs each worker reserves (and its torch threads).")
    num_gpus: float | None = Field(None, ge=0, le=64, description=(
        "GPUs each worker reserves. Default: 1 when the backends' device is cuda, else 0."))
    memory: ByteSize | None = Field(None, description="Memory each worker reserves, e.g. 8GB (default: none).")
    max_retries: int = Field(3, ge=0, le=1000, description=(
        "Times a worker that died is restarted and its class resumed from its transcript (Ray's max_restarts and "
        "max_task_retries)."))

    @model_validator(mode="after")
    def _ray_only(self) -> ExecutorConfig:
        if self.name == "local":
            given = [k for k in ("address", "workers", "num_gpus", "memory") if getattr(self, k) is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: Ray settings; they need name: ray")
        return self


class AuditConfig(RunSettings):
    classes: list[str] | Literal["all"] = Field(description="Classes to audit, in order, or 'all'.")
    budget: Budgets = Field(default_factory=Budgets)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig, exclude=True,
                                     description="Where the classes run (not part of what the audit records).")

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
