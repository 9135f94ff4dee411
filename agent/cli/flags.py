"""Command-line flags of every command that runs an investigation, read into the one config model (``RunConfig``).

Flags carry no defaults of their own: an unset flag leaves the model's default (``agent.config``), and the help text
quotes it from there. ``run_config(args)`` validates the lot; any problem is one line naming the flag. The API key is
read from the provider's usual environment variable (or the one ``--api-key-env`` names), never from the command line,
where it would land in shell history and process listings.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from sleuth.agent.config import PlannerConfig, RunConfig, one_line
from sleuth.agent.errors import UsageError
from sleuth.agent.llm.client import LLMConfig
from sleuth.agent.planners import PLANNERS
from sleuth.tools.backends.base import BackendError, Backends
from sleuth.tools.backends.specs import SLOTS, BackendSpecs

Progress = Callable[[str, int, int], None]

SPEC_HELP = {
    "generator": "Image generator: toyworld (default) or diffusers:PATH_OR_HUB_ID[,steps=N,guidance=X,height=H,"
                 "width=W,batch=B,negative=TEXT]; diffusers:toyworld-sd is the packaged toyworld diffusion model.",
    "classifier": "Classifier under audit: toyworld[:WEIGHTS] (default; WEIGHTS: e.g. what `sleuth mitigate` "
                  "wrote), efficientnet-lite0, torchvision:ARCH[:WEIGHTS], "
                  "timm:NAME[:CKPT], open_clip:MODEL[:WEIGHTS], hf:PATH_OR_HUB_ID, callable:module:function.",
    "captioner": "Failure captioner: toyworld (default) or blip:PATH_OR_HUB_ID[,beams=N,samples=N].",
    "embedder": "Image embedder for clustering failures: toyworld (default), toyworld-clip (packaged), "
                "open_clip:MODEL:WEIGHTS, open_clip:FOLDER or clip:PATH_OR_HUB_ID (a transformers CLIPModel).",
    "editor": "Counterfactual editor: toyworld (default) or sd-edit:PATH_OR_HUB_ID (sd-edit:toyworld-sd: packaged).",
}

# Where each config field is set on the command line, for error messages.
FLAG_OF = {"class": "--class", "label": "--class", "budget": "--budget", "seed": "--seed", "alpha": "--alpha",
           "confirmations": "--confirmations",
           "criterion": "--criterion", "planner.baseline_n": "--baseline-n", "planner.max_turns": "--max-turns",
           "planner.max_seconds": "--max-seconds",
           "planner.name": "--planner", "planner.llm.timeout_s": "--llm-timeout",
           "planner.llm.retries": "--llm-retries", "planner.llm.api_base": "--api-base",
           "planner.llm.tool_choice": "--tool-choice", "planner.llm.call_format": "--call-format",
           "planner.context_tokens": "--llm-context", "planner": "--planner"}


def default(model: type[BaseModel], name: str) -> Any:
    return model.model_fields[name].default


def add_run_arguments(p: argparse.ArgumentParser, *, max_turns: bool = True) -> None:
    """The class, budgets and statistics settings of one investigation."""
    p.add_argument("--class", dest="label", required=True, help="Class to audit, e.g. cat.")
    p.add_argument("--budget", type=int, help=f"Most images to generate (default {default(RunConfig, 'budget')}).")
    p.add_argument("--baseline-n", type=int,
                   help="Images of the class baseline (default: the planner's own, 300 for protocol and 1000 for "
                        "the others).")
    p.add_argument("--seed", type=int, help="Investigation seed: selects the blocks of fresh image seeds "
                                            f"(default {default(RunConfig, 'seed')}).")
    p.add_argument("--criterion", choices=["top1", "topk", "parent"],
                   help="Failure criterion: top-1 wrong, label not in top-3, or no top-3 label under the true "
                        f"label's parent (Wiles et al.). Default {default(RunConfig, 'criterion')}.")
    p.add_argument("--alpha", type=float, help=f"Family-wise error level (default {default(RunConfig, 'alpha')}).")
    p.add_argument("--confirmations", type=int, metavar="M",
                   help="Declared confirmation attempts, each tested at alpha/M (default: the planner's own; "
                        "protocol declares one per 500 images of the budget, from 10 to 40; the others 10).")
    if max_turns:
        p.add_argument("--max-turns", type=int,
                       help="Most planner turns (default: the planner's own, 1000 for protocol and 100 for the "
                            "others).")
        p.add_argument("--max-seconds", type=float,
                       help="Most wall-clock seconds for the run: it stops after the turn that crosses it, with "
                            "status time_limit and its findings kept (default: no limit).")
    p.add_argument("--runs", default="runs", help="Folder for run directories (default ./runs).")


def add_planner_arguments(p: argparse.ArgumentParser, *, extra: tuple[str, ...] = ()) -> None:
    """Which planner plans; ``extra`` are planner names only this command offers (e.g. replay for forks)."""
    choices = (*PLANNERS, *extra)
    p.add_argument("--planner", choices=choices,
                   help="; ".join(f"{n}: {PLANNERS[n].help}" if n in PLANNERS else n for n in choices)
                   + ". Default: protocol, or llm when --llm is given.")
    g = p.add_argument_group("LLM planner")
    g.add_argument("--llm", metavar="MODEL",
                   help="Plan with this litellm model, e.g. gpt-4o-mini, anthropic/claude-sonnet-4-5, "
                        "ollama_chat/qwen2.5, or openai/NAME with --api-base for an OpenAI-compatible server.")
    g.add_argument("--api-base", metavar="URL",
                   help="Base URL of an OpenAI-compatible server (llama.cpp, vLLM, Ollama), e.g. "
                        "http://127.0.0.1:8080/v1.")
    g.add_argument("--api-key-env", metavar="VAR",
                   help="Environment variable that holds the API key (default: the provider's own, e.g. "
                        "OPENAI_API_KEY). Keys are never written to transcripts or logs.")
    g.add_argument("--planner-sees-images", action="store_true",
                   help="Show a vision-capable model thumbnails of the images in the latest results.")
    g.add_argument("--llm-timeout", type=float, metavar="S",
                   help=f"Seconds before one LLM request times out (default {default(LLMConfig, 'timeout_s'):g}).")
    g.add_argument("--tool-choice", choices=["auto", "required"],
                   help="Send this tool_choice with every investigation request: 'required' makes a server that "
                        "supports it (llama.cpp's llama-server, vLLM, OpenAI) constrain each reply to a tool call, a "
                        "forced-call mode for small local models (default: not sent; the server's own, auto).")
    g.add_argument("--call-format", choices=["tools", "json"],
                   help="'json': a forced-call mode for small local models that write calls in their own format: "
                        "the tools are described in the system prompt and a response_format grammar makes every "
                        "reply one JSON call (default 'tools': the server's tool calling).")
    g.add_argument("--llm-retries", type=int, metavar="N",
                   help="Retries of a rate-limited, timed-out or failed LLM request, with backoff "
                        f"(default {default(LLMConfig, 'retries')}).")
    g.add_argument("--llm-context", type=int, metavar="TOKENS",
                   help="Rough token budget of each LLM request; older results are summarised to fit "
                        f"(default {default(PlannerConfig, 'context_tokens')}).")


def add_backend_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models", "Which models to audit and generate with (docs/real_models.md). Weights are "
                                       "read from local paths or the Hugging Face cache, never downloaded.")
    g.add_argument("--world", help="toyworld config: a YAML/JSON file or a packaged world name (default, nobugs). "
                                   "Default: the embedded default world.")
    for slot in SLOTS:
        g.add_argument(f"--{slot}", metavar="SPEC", help=SPEC_HELP[slot])
    g.add_argument("--device", help="cpu (default), cuda, cuda:N, mps or auto, for every real model.")
    g.add_argument("--dtype", choices=["float32", "float16", "bfloat16"],
                   help="Precision of the real models (default float32; float16 needs a GPU).")
    g.add_argument("--class-token", action="append", default=[], metavar="[CLASS=]FILE",
                   help="Textual-inversion embedding for a class (Dataset Interfaces' learned tokens), so generated "
                        "images match a dataset's look; CLASS defaults to --class. Repeatable.")
    g.add_argument("--clip-checks", metavar="off|on|SPEC",
                   help="Dataset Interfaces' CLIP checks on generated images: images where CLIP does not see the "
                        "class are invalid, shifts it does not see are unrendered. on: use the --embedder CLIP "
                        "model; or a CLIP spec. Default off.")
    g.add_argument("--clip-class-top-k", type=int, metavar="K",
                   help="Class present when it is within CLIP's top K of all classes "
                        f"(default {default(BackendSpecs, 'clip_class_top_k')}).")
    g.add_argument("--clip-shift-threshold", type=float, metavar="X",
                   help="Shift present when its CLIP similarity to the image is at least X "
                        f"(default {default(BackendSpecs, 'clip_shift_threshold')}).")


def _class_tokens(args: argparse.Namespace) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in args.class_token:
        name, eq, file = item.rpartition("=")
        if not eq or Path(item).expanduser().is_file():
            name, file = getattr(args, "label", None) or "", item
            if not name:
                raise UsageError(f"--class-token {item}: say which class it is for: --class-token 'CLASS=FILE'.")
        if not Path(file).expanduser().is_file():
            raise UsageError(f"--class-token: no such file: {file}")
        out[name.strip()] = file
    return out


def _set(args: argparse.Namespace, names: dict[str, str]) -> dict[str, Any]:
    """The flags the user gave (not None), under their config names."""
    return {to: getattr(args, dest) for dest, to in names.items() if getattr(args, dest, None) is not None}


def backend_specs(args: argparse.Namespace) -> BackendSpecs:
    """The backend flags as a ``BackendSpecs`` (what audit configs hold too), checked before any model loads."""
    from sleuth.tools.backends.toyworld.config import load_world

    settings = _set(args, {**{s: s for s in SLOTS}, "world": "world", "device": "device", "dtype": "dtype",
                           "clip_checks": "clip_checks", "clip_class_top_k": "clip_class_top_k",
                           "clip_shift_threshold": "clip_shift_threshold"})
    try:
        specs = BackendSpecs(**settings, class_tokens=_class_tokens(args))
    except ValidationError as e:
        flags = {k: "--" + k.replace("_", "-") for k in BackendSpecs.model_fields}
        raise UsageError(one_line(e, flags=flags)) from None
    try:
        specs.parsed()
        if specs.world:
            load_world(specs.world)
    except BackendError as e:
        raise UsageError(str(e)) from None
    return specs


def planner_config(args: argparse.Namespace) -> PlannerConfig:
    """The planner flags as a ``PlannerConfig``."""
    name = args.planner or ("llm" if args.llm else "protocol")
    if name == "llm" and not args.llm:
        raise UsageError("--planner llm needs --llm MODEL (a litellm model string)")
    if args.llm and name != "llm":
        raise UsageError(f"--llm is for the llm planner; drop --planner {name} or --llm")
    if not args.llm:
        for flag, value in (("--api-base", args.api_base), ("--api-key-env", args.api_key_env),
                            ("--planner-sees-images", args.planner_sees_images), ("--llm-timeout", args.llm_timeout),
                            ("--llm-retries", args.llm_retries), ("--llm-context", args.llm_context),
                            ("--tool-choice", getattr(args, "tool_choice", None)),
                            ("--call-format", getattr(args, "call_format", None))):
            if value:
                raise UsageError(f"{flag} needs --llm MODEL")
    if args.api_key_env and not os.environ.get(args.api_key_env):
        raise UsageError(f"--api-key-env: environment variable {args.api_key_env} is not set")
    llm = _set(args, {"llm": "model", "api_base": "api_base", "api_key_env": "api_key_env",
                      "llm_timeout": "timeout_s", "llm_retries": "retries", "tool_choice": "tool_choice",
                      "call_format": "call_format"})
    settings = {"name": name, **_set(args, {"baseline_n": "baseline_n", "max_turns": "max_turns",
                                            "max_seconds": "max_seconds", "llm_context": "context_tokens"})}
    if args.planner_sees_images:
        settings["sees_images"] = True
    if llm:
        settings["llm"] = llm
    try:
        return PlannerConfig.model_validate(settings)
    except ValidationError as e:
        raise UsageError(one_line(e, flags={k.removeprefix("planner."): v for k, v in FLAG_OF.items()})) from None


def run_config(args: argparse.Namespace) -> RunConfig:
    """Every flag of an investigation as one validated ``RunConfig``."""
    planner = planner_config(args)
    backends = backend_specs(args)
    settings = {"class": args.label, **_set(args, {"budget": "budget", "seed": "seed", "criterion": "criterion",
                                                   "alpha": "alpha", "confirmations": "confirmations"})}
    try:
        return RunConfig.model_validate({**settings, "planner": planner, "backends": backends})
    except ValidationError as e:
        raise UsageError(one_line(e, flags=FLAG_OF)) from None


def build_backends(specs: BackendSpecs, progress: Progress | None = None) -> Backends:
    """The backends the specs name (toyworld unless told otherwise), real models loaded now.

    A model that is missing or does not load raises `BackendError` (one line naming it and how to fetch it).
    """
    return specs.build(progress, load=True)
