"""Command-line flags of every command that runs an investigation, read into the one config model (``RunConfig``).

Flags carry no defaults of their own: an unset flag leaves the model's default (``agent.config``), and the help text
quotes it from there. ``run_config(args)`` validates the lot; any problem is one line naming the flag. The API key is
read from the provider's usual environment variable (or the one ``--api-key-env`` names), never from the command line,
where it would land in shell history and process listings.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from sleuth.agent.config import PlannerConfig, RunConfig, one_line
from sleuth.agent.errors import UsageError
from sleuth.agent.llm.client import LLMConfig
from sleuth.agent.planners import PLANNERS
from sleuth.tools.backends.base import BackendError, Backends, LabelSpace
from sleuth.tools.backends.specs import SLOTS, BackendSpecs, parse_spec

Progress = Callable[[str, int, int], None]

SPEC_HELP = {
    "generator": "toyworld (default) or diffusers:PATH_OR_HUB_ID[,steps=N,...]",
    "classifier": "toyworld[:WEIGHTS] (default), torchvision:ARCH[:WEIGHTS], timm:NAME[:CKPT], open_clip:MODEL, "
                  "hf:PATH_OR_HUB_ID, efficientnet-lite0, callable:module:function",
    "captioner": "toyworld (default) or blip:PATH_OR_HUB_ID[,beams=N,samples=N]",
    "embedder": "toyworld (default), toyworld-clip, open_clip:MODEL:WEIGHTS or clip:PATH_OR_HUB_ID",
    "editor": "toyworld (default) or sd-edit:PATH_OR_HUB_ID",
}

# Where each config field is set on the command line, for error messages.
FLAG_OF = {"class": "--class", "label": "--class", "budget": "--budget", "seed": "--seed", "alpha": "--alpha",
           "confirmation_draw": "--confirmation-draw",
           "confirmations": "--confirmations",
           "criterion": "--criterion", "planner.baseline_n": "--baseline-n", "planner.max_turns": "--max-turns",
           "planner.max_seconds": "--max-seconds",
           "planner.name": "--planner", "planner.llm.timeout_s": "--llm-timeout",
           "planner.llm.retries": "--llm-retries", "planner.llm.api_base": "--api-base",
           "planner.llm.tool_choice": "--tool-choice", "planner.llm.call_format": "--call-format",
           "planner.context_tokens": "--llm-context", "planner.proposer": "--proposer", "planner": "--planner"}


def default(model: type[BaseModel], name: str) -> Any:
    return model.model_fields[name].default


def add_run_arguments(p: argparse.ArgumentParser, *, max_turns: bool = True) -> None:
    """The class, budgets and statistics settings of one investigation."""
    # Help texts fit one line each; the details are in the docs (docs/audit.md, docs/llm.md, docs/real_models.md).
    p.add_argument("--class", dest="label", required=True, metavar="LABEL", help="class to audit, e.g. cat")
    p.add_argument("--budget", type=int, metavar="N", help=f"most images to generate ({default(RunConfig, 'budget')})")
    p.add_argument("--runs", default="runs", metavar="DIR", help="folder for run directories (./runs)")
    g = p.add_argument_group("statistics and limits")
    g.add_argument("--baseline-n", type=int, metavar="N",
                   help="class baseline images (300 protocol, 1000 others)")
    g.add_argument("--seed", type=int, help=f"seed of the image seeds ({default(RunConfig, 'seed')})")
    g.add_argument("--confirmation-draw", type=int, metavar="D",
                   help="block of confirmation seeds (default: the next unused)")
    g.add_argument("--criterion", choices=["top1", "topk", "parent"], metavar="top1|topk|parent",
                   help=f"failure: top-1 wrong, not in top-3, no top-3 label under the parent "
                        f"({default(RunConfig, 'criterion')})")
    g.add_argument("--alpha", type=float, help=f"family-wise error level ({default(RunConfig, 'alpha')})")
    g.add_argument("--confirmations", type=int, metavar="M",
                   help="confirmation attempts, each at alpha/M (protocol: 40 at any budget)")
    if max_turns:
        g.add_argument("--max-turns", type=int, metavar="N", help="most planner turns (1000 protocol, 100 others)")
        g.add_argument("--max-seconds", type=float, metavar="S",
                       help="stop after the turn that passes S seconds (no limit)")


class PlannerName:
    """``--planner``'s type: any registered planner (or an ``extra`` one), named in errors by the public ones only;
    the adversarial calibration scripts are accepted but not advertised (docs/bench.md)."""

    def __init__(self, extra: tuple[str, ...] = ()) -> None:
        self.public = (*(n for n, s in PLANNERS.items() if not s.adversarial), *extra)
        self.known = (*PLANNERS, *extra)
        self.__name__ = "planner"  # argparse names the type in its messages

    def __call__(self, text: str) -> str:
        if text not in self.known:
            raise argparse.ArgumentTypeError(f"unknown planner {text!r} (choose from {', '.join(self.public)})")
        return text


def add_planner_arguments(p: argparse.ArgumentParser, *, extra: tuple[str, ...] = ()) -> None:
    """Which planner plans; ``extra`` are planner names only this command offers (e.g. replay for forks)."""
    names = PlannerName(extra)
    g = p.add_argument_group("planner", "--planner NAME or --llm MODEL (docs/llm.md); the API key comes from the "
                                        "provider's environment variable and is never written")
    g.add_argument("--planner", type=names, metavar="NAME",
                   help=f"{', '.join(names.public)} (default: protocol, or llm with --llm)")
    g.add_argument("--llm", metavar="MODEL", help="litellm model, e.g. gpt-4o-mini or openai/NAME")
    g.add_argument("--proposer", choices=["vocabulary", "llm"], metavar="vocabulary|llm",
                   help="llm: the protocol planner with --llm MODEL adding candidates (one request per class)")
    g.add_argument("--api-base", metavar="URL", help="OpenAI-compatible server, e.g. http://127.0.0.1:8080/v1")
    g.add_argument("--api-key-env", metavar="VAR", help="variable holding the API key (the provider's own)")
    g.add_argument("--planner-sees-images", action="store_true", help="show a vision model thumbnails")
    g.add_argument("--llm-timeout", type=float, metavar="S",
                   help=f"seconds per request ({default(LLMConfig, 'timeout_s'):g})")
    g.add_argument("--llm-retries", type=int, metavar="N",
                   help=f"retries on rate limits, timeouts, 5xx ({default(LLMConfig, 'retries')})")
    g.add_argument("--llm-context", type=int, metavar="TOKENS",
                   help=f"token budget per request ({default(PlannerConfig, 'context_tokens')})")
    g.add_argument("--tool-choice", choices=["auto", "required"], metavar="auto|required",
                   help="tool_choice to send (not sent)")
    g.add_argument("--call-format", choices=["tools", "json"], metavar="tools|json",
                   help="json: one JSON call per reply (tools)")


def add_backend_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models", "what to audit and generate with (docs/real_models.md); weights come from local "
                                       "paths or the Hugging Face cache, never downloaded")
    g.add_argument("--world", metavar="WORLD", help="toyworld config: a YAML/JSON file, default or nobugs")
    for slot in SLOTS:
        g.add_argument(f"--{slot}", metavar="SPEC", help=SPEC_HELP[slot])
    g.add_argument("--device", help="cpu (default), cuda, cuda:N, mps or auto")
    g.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], metavar="DTYPE",
                   help="float32 (default), float16 or bfloat16")
    g.add_argument("--class-token", action="append", default=[], metavar="[CLASS=]FILE",
                   help="textual-inversion embedding for a class (repeatable)")
    g.add_argument("--clip-checks", metavar="off|on|SPEC", help="CLIP checks of generated images (off)")
    g.add_argument("--clip-class-top-k", type=int, metavar="K",
                   help=f"class seen when in CLIP's top K ({default(BackendSpecs, 'clip_class_top_k')})")
    g.add_argument("--clip-shift-threshold", type=float, metavar="X",
                   help=f"shift seen at CLIP similarity >= X ({default(BackendSpecs, 'clip_shift_threshold')})")


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
    proposer = getattr(args, "proposer", None)
    name = args.planner or ("llm" if args.llm and proposer != "llm" else "protocol")
    if name == "llm" and not args.llm:
        raise UsageError("--planner llm needs --llm MODEL (a litellm model string)")
    if proposer == "llm":
        if name != "protocol":
            raise UsageError(f"--proposer llm adds candidates to the protocol planner, not to --planner {name}")
        if not args.llm:
            raise UsageError("--proposer llm needs --llm MODEL (a litellm model string)")
    elif args.llm and name != "llm":
        raise UsageError(f"--llm is for the llm planner (or --proposer llm); drop --planner {name} or --llm")
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
    if proposer:
        settings["proposer"] = proposer
    if llm:
        settings["llm"] = llm
    try:
        config = PlannerConfig.model_validate(settings)
    except ValidationError as e:
        raise UsageError(one_line(e, flags={k.removeprefix("planner."): v for k, v in FLAG_OF.items()})) from None
    if config.llm is not None and config.llm.model != args.llm:
        print(f"--api-base names an OpenAI-compatible server: the model is sent as {config.llm.model!r}",
              file=sys.stderr)
    return config


def run_config(args: argparse.Namespace) -> RunConfig:
    """Every flag of an investigation as one validated ``RunConfig``, the class checked against the toy world's when
    the classifier is toyworld's: all before any model (or torch) loads, so a typo costs no start-up."""
    planner = planner_config(args)
    backends = backend_specs(args)
    settings = {"class": args.label, **_set(args, {"budget": "budget", "seed": "seed", "criterion": "criterion",
                                                   "alpha": "alpha", "confirmations": "confirmations",
                                                   "confirmation_draw": "confirmation_draw"})}
    try:
        config = RunConfig.model_validate({**settings, "planner": planner, "backends": backends})
    except ValidationError as e:
        raise UsageError(one_line(e, flags=FLAG_OF)) from None
    labels = toy_labels(config.backends)
    if labels is not None and config.label not in labels.labels:
        raise UsageError(labels.unknown_message(config.label))
    return config


def toy_labels(specs: BackendSpecs) -> LabelSpace | None:
    """The classes of a toyworld classifier, read from its world config (no network is built); None for any other
    classifier, whose labels are known once it loads."""
    from sleuth.tools.backends.toyworld.config import load_world

    if parse_spec(specs.classifier, "classifier").kind != "toyworld":
        return None
    try:
        return load_world(specs.world).labels
    except BackendError as e:
        raise UsageError(str(e)) from None


def build_backends(specs: BackendSpecs, progress: Progress | None = None) -> Backends:
    """The backends the specs name (toyworld unless told otherwise), real models loaded now.

    A model that is missing or does not load raises `BackendError` (one line naming it and how to fetch it).
    """
    return specs.build(progress, load=True)
