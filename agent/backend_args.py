"""Command-line flags that choose the backends, shared by every command that runs an investigation.

Each slot takes a spec (see tools/backends/specs.py and docs/real_models.md); toyworld is the default for all.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sleuth.agent.cli import UsageError
from sleuth.tools.backends.base import BackendError, Backends
from sleuth.tools.backends.specs import SLOTS, BackendSpecs

Progress = Callable[[str, int, int], None]

SPEC_HELP = {
    "generator": "Image generator: toyworld (default) or diffusers:PATH_OR_HUB_ID[,steps=N,guidance=X,height=H,"
                 "width=W,batch=B,negative=TEXT].",
    "classifier": "Classifier under audit: toyworld (default), efficientnet-lite0, torchvision:ARCH[:WEIGHTS], "
                  "timm:NAME[:CKPT], open_clip:MODEL[:WEIGHTS], hf:PATH_OR_HUB_ID, callable:module:function.",
    "captioner": "Failure captioner: toyworld (default) or blip:PATH_OR_HUB_ID[,beams=N,samples=N].",
    "embedder": "Image embedder for clustering failures: toyworld (default), open_clip:MODEL:WEIGHTS or "
                "open_clip:FOLDER.",
    "editor": "Counterfactual editor: toyworld (default) or sd-edit:PATH_OR_HUB_ID.",
}


def add_backend_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models", "Which models to audit and generate with (docs/real_models.md). Weights are "
                                       "read from local paths or the Hugging Face cache, never downloaded.")
    g.add_argument("--world", help="toyworld config: a YAML/JSON file or a packaged world name (default, nobugs). "
                                   "Default: the embedded default world.")
    for slot in SLOTS:
        g.add_argument(f"--{slot}", default="toyworld", metavar="SPEC", help=SPEC_HELP[slot])
    g.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps or auto, for every real model.")
    g.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                   help="Precision of the real models (default float32; float16 needs a GPU).")
    g.add_argument("--class-token", action="append", default=[], metavar="[CLASS=]FILE",
                   help="Textual-inversion embedding for a class (Dataset Interfaces' learned tokens), so generated "
                        "images match a dataset's look; CLASS defaults to --class. Repeatable.")
    g.add_argument("--clip-checks", default="off", metavar="off|on|SPEC",
                   help="Dataset Interfaces' CLIP checks on generated images: images where CLIP does not see the "
                        "class are invalid, shifts it does not see are unrendered. on: use the --embedder open_clip "
                        "model; or an open_clip spec. Default off.")
    g.add_argument("--clip-class-top-k", type=int, default=5, metavar="K",
                   help="Class present when it is within CLIP's top K of all classes (default 5).")
    g.add_argument("--clip-shift-threshold", type=float, default=0.2, metavar="X",
                   help="Shift present when its CLIP similarity to the image is at least X (default 0.2).")


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


def backend_specs(args: argparse.Namespace) -> BackendSpecs:
    """The flags as a `BackendSpecs` (what audit configs hold too)."""
    if args.clip_class_top_k < 1:
        raise UsageError(f"--clip-class-top-k must be at least 1, got {args.clip_class_top_k}")
    return BackendSpecs(**{slot: getattr(args, slot) for slot in SLOTS}, world=args.world, device=args.device,
                        dtype=args.dtype, class_tokens=_class_tokens(args), clip_checks=args.clip_checks,
                        clip_class_top_k=args.clip_class_top_k, clip_shift_threshold=args.clip_shift_threshold)


def backend_config(args: argparse.Namespace) -> dict[str, Any]:
    """The backend settings as they go into a run's recorded config: the specs and every non-default setting."""
    specs = backend_specs(args)
    return {**{slot: getattr(specs, slot) for slot in SLOTS},
            **specs.model_dump(exclude=set(SLOTS), exclude_defaults=True)}


def check_backend_args(args: argparse.Namespace) -> None:
    """Reject bad backend flags before any model is loaded."""
    from sleuth.tools.backends.toyworld.config import load_world

    try:
        specs = backend_specs(args)
        specs.parsed()
        if args.world:
            load_world(args.world)
    except BackendError as e:
        raise UsageError(str(e)) from None


def build_backends(args: argparse.Namespace, progress: Progress | None = None) -> Backends:
    """The backends the flags name (toyworld unless told otherwise), real models loaded now.

    A model that is missing or does not load raises `BackendError` (one line naming it and how to fetch it).
    """
    return backend_specs(args).build(progress, load=True)
