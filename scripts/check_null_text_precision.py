"""Null-text inversion in float16 against float32, on your GPU: the measurement docs/editing.md asks for.

    python scripts/check_null_text_precision.py --model stable-diffusion-v1-5/stable-diffusion-v1-5 \\
        --image photo.jpg --prompt "a photo of a tabby cat on a sofa" --device cuda

For each precision it prints one JSON line: the latent reconstruction error (MSE against the image's own latent)
after null-text optimisation, the same for plain DDIM inversion at the same guidance (the drift null-text
optimisation has to remove), the share of gradient entries that were exactly zero over all Adam steps (float16
underflow shows here), and the seconds the optimisation took. float16 is sound when its null-text error is close to
float32's and far below plain DDIM's, with a zero share near 0. Weights are read from a local folder or the Hugging
Face cache, never downloaded.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from sleuth.tools.backends.loading import resolve_pretrained
from sleuth.tools.backends.sd_edit import inversion
from sleuth.tools.backends.sd_edit.ddim import check_pipeline, working_size


def measure(pipe: Any, image: np.ndarray, prompt: str, settings: inversion.InversionSettings,
            hw: tuple[int, int]) -> dict[str, float]:
    """Reconstruction errors of null-text and plain DDIM inversion, the zero-gradient share, and seconds."""
    zeros: list[float] = []
    original = inversion.null_gradient

    def recording(loss_of: Any, emb: Any) -> tuple[Any, float]:
        grad, loss = original(loss_of, emb)
        zeros.append(float((grad == 0).float().mean()))
        return grad, loss

    inversion.null_gradient = recording  # null_text_optimise looks the function up in its module at each call
    try:
        t0 = time.perf_counter()
        tuned = inversion.invert(pipe, image, prompt, settings, hw)
        seconds = time.perf_counter() - t0
    finally:
        inversion.null_gradient = original
    plain = inversion.invert(pipe, image, prompt, settings.model_copy(update={"null_steps": 0}), hw)

    def error(inv: inversion.Inversion) -> float:
        return float(((inversion.reconstruct(pipe, inv) - inv.z0) ** 2).mean())

    return {"null_text_mse": error(tuned), "plain_ddim_mse": error(plain),
            "zero_gradient_share": float(np.mean(zeros)) if zeros else float("nan"), "seconds": round(seconds, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="Stable Diffusion 1.x/2.x pipeline folder or cached Hub id")
    p.add_argument("--image", required=True, help="an image file")
    p.add_argument("--prompt", required=True, help="the image's caption (the source caption of an edit)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtypes", default="float32,float16")
    p.add_argument("--size", type=int, default=512, help="long side in pixels")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--guidance", type=float, default=7.5)
    p.add_argument("--null-steps", type=int, default=10)
    p.add_argument("--null-lr", type=float, default=0.01)
    args = p.parse_args(argv)

    import torch
    from diffusers import DiffusionPipeline
    from PIL import Image

    folder = resolve_pretrained(args.model, what="Stable Diffusion pipeline")
    image = np.asarray(Image.open(args.image).convert("RGB"))
    settings = inversion.InversionSettings(steps=args.steps, guidance=args.guidance, null_steps=args.null_steps,
                                           null_lr=args.null_lr)
    for name in args.dtypes.split(","):
        pipe = DiffusionPipeline.from_pretrained(folder, dtype=getattr(torch, name), local_files_only=True)
        check_pipeline(pipe)
        pipe.to(args.device)
        for part in (pipe.unet, pipe.vae, pipe.text_encoder):
            part.requires_grad_(False)
        result = measure(pipe, image, args.prompt, settings, working_size(image, pipe, args.size))
        print(json.dumps({"dtype": name, **result}), flush=True)
        del pipe
    return 0


if __name__ == "__main__":
    sys.exit(main())
