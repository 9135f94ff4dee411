"""`sleuth classify IMAGE... --classifier SPEC`: top labels of a classifier on image files.

The quickest way to check that a classifier spec loads and behaves before auditing it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from sleuth.agent.errors import UsageError

NAME = "classify"
HELP = "Classify image files with a classifier spec and print the top labels with probabilities."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("images", nargs="+", metavar="IMAGE", help="Image files (PNG, JPEG, ...).")
    p.add_argument("--classifier", default="toyworld",
                   help="Classifier spec: toyworld[:WEIGHTS] (default), efficientnet-lite0, "
                        "torchvision:resnet50[:WEIGHTS], timm:NAME:CKPT, open_clip:MODEL:WEIGHTS, hf:PATH, "
                        "callable:module:function.")
    p.add_argument("--world", help="toyworld config file, for --classifier toyworld.")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps or auto.")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                   help="Precision of a real classifier (default float32; float16 needs a GPU).")
    p.add_argument("--top", type=int, default=5, help="Labels to show per image (default 5).")
    p.add_argument("--json", action="store_true", help="Print JSON instead of a table.")


def read_image(path: Path) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except (UnidentifiedImageError, OSError) as e:
        raise UsageError(f"cannot read image {path}: {e}") from None


def load_classifier(spec: str, world: str | None, device: str, dtype: str | None = None) -> Any:
    head = spec.split(",")[0].strip()
    if head.partition(":")[0] == "toyworld":
        from sleuth.tools.backends.toyworld import load_backends

        return load_backends(world, device=device, classifier_weights=head.partition(":")[2] or None).classifier
    from sleuth.tools.backends.specs import make_classifier

    return make_classifier(spec, device=device, dtype=dtype)


def top_labels(logits: np.ndarray, labels: tuple[str, ...], k: int) -> list[list[dict[str, Any]]]:
    z = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    order = np.argsort(-probs, axis=1)[:, :k]
    return [[{"label": labels[j], "prob": round(float(p[j]), 4)} for j in row] for p, row in zip(probs, order)]


def run(args: argparse.Namespace) -> int:
    from sleuth.tools.backends.base import BackendError

    if args.top < 1:
        raise UsageError(f"--top must be at least 1, got {args.top}")
    paths = [Path(p) for p in args.images]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise UsageError(f"image not found: {', '.join(missing)}")
    if args.world and not Path(args.world).is_file():
        raise UsageError(f"world config not found: {args.world}")
    images = [read_image(p) for p in paths]
    try:
        clf = load_classifier(args.classifier, args.world, args.device, args.dtype)
        logits = np.asarray(clf.logits(images), dtype=np.float64)
    except BackendError as e:
        raise UsageError(str(e)) from None
    tops = top_labels(logits, clf.labels.labels, min(args.top, logits.shape[1]))
    out = {"classifier": clf.id, "images": [{"path": str(p), "top": t} for p, t in zip(paths, tops)]}
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(clf.id))
    table.add_column("image")
    table.add_column("rank", justify="right")
    table.add_column("label")
    table.add_column("prob", justify="right")
    for item in out["images"]:
        for r, t in enumerate(item["top"], 1):
            # Text, not markup: a path or label with [brackets] prints as it is.
            table.add_row(Text(item["path"] if r == 1 else ""), str(r), Text(t["label"]), f"{t['prob']:.3f}")
        table.add_section()
    Console().print(table)
    return 0
