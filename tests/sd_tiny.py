"""A tiny random-weight Stable Diffusion pipeline built from configs, offline, for the editing tests.

A UNet with random weights predicts erratic noise: DDIM inversion through it does not even reconstruct at
guidance 1. Scaling its output convolution down (``out_scale``, 0.1 by default) gives a well-conditioned
model whose predictions change smoothly with the latent, so inversion and null-text optimisation behave as
they do on a trained model, only at toy scale. Query and key weights are scaled up (``qk_scale``, 4) so
attention maps are peaked and spatially selective, as a trained model's are, instead of near-uniform (with
near-uniform maps, injecting the source's attention changes almost nothing). The VAE's scaling factor (4.5)
gives its latents unit variance, as 0.18215 does for Stable Diffusion's, so latent errors read on the same
scale. The CLIP tokenizer is a real one, written from the BPE vocabulary open_clip ships.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import torch

SIZE = 32
"""Image side in pixels; the VAE halves it, so latents are 4 x 16 x 16."""


def clip_tokenizer(folder: Path) -> Any:
    """A ``CLIPTokenizer`` written from open_clip's bundled vocabulary, kept in ``folder`` for next time."""
    import open_clip
    from transformers import CLIPTokenizer

    fast = folder / "fast"
    if (fast / "tokenizer.json").is_file():
        # Parsing 49k BPE merges takes seconds; the saved tokenizer.json alone loads in about one.
        return CLIPTokenizer.from_pretrained(fast, model_max_length=77)
    bpe = folder / "bpe"
    merges = gzip.open(Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz").read().decode("utf-8")
    specials = {"<start_of_text>": "<|startoftext|>", "<end_of_text>": "<|endoftext|>"}
    vocab = {specials.get(k, k): v for k, v in open_clip.tokenizer.SimpleTokenizer().encoder.items()}
    bpe.mkdir(parents=True, exist_ok=True)
    (bpe / "vocab.json").write_text(json.dumps(vocab))
    (bpe / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges.split("\n")[1:49152 - 256 - 2 + 1]) + "\n")
    tok = CLIPTokenizer.from_pretrained(bpe, model_max_length=77)
    tok.save_pretrained(fast)
    return tok


def tiny_sd(folder: Path, *, prediction_type: str = "epsilon", out_scale: float = 0.1, qk_scale: float = 4.0,
            seed: int = 0) -> Any:
    """A ``StableDiffusionPipeline`` with random weights; latents 4 x 16 x 16, attention at 8 x 8."""
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(block_out_channels=(16, 32), layers_per_block=1, sample_size=SIZE // 2,
                                in_channels=4, out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
                                cross_attention_dim=32, norm_num_groups=4, attention_head_dim=4)
    with torch.no_grad():
        unet.conv_out.weight.mul_(out_scale)
        unet.conv_out.bias.mul_(out_scale)
        for name, module in unet.named_modules():
            if name.endswith(("attn1", "attn2")):
                module.to_q.weight.mul_(qk_scale)
                module.to_k.weight.mul_(qk_scale)
    vae = AutoencoderKL(block_out_channels=(8, 16), in_channels=3, out_channels=3, latent_channels=4,
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        norm_num_groups=4, scaling_factor=4.5)
    text = CLIPTextModel(CLIPTextConfig(bos_token_id=49406, eos_token_id=49407, pad_token_id=49407, hidden_size=32,
                                        intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
                                        vocab_size=49408, max_position_embeddings=77))
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                              set_alpha_to_one=False, steps_offset=1, prediction_type=prediction_type)
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=text, tokenizer=clip_tokenizer(folder / "tokenizer"),
                                   unet=unet, scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    for part in (unet, vae, text):
        part.requires_grad_(False)
    return pipe


def tiny_image(pipe: Any, prompt: str, seed: int, steps: int = 10) -> Any:
    """A uint8 (SIZE, SIZE, 3) image the tiny pipeline generates: something to invert and edit."""
    import numpy as np

    with torch.no_grad():
        out = pipe(prompt, num_inference_steps=steps, guidance_scale=7.5, height=SIZE, width=SIZE,
                   generator=torch.Generator("cpu").manual_seed(seed), output_type="np")
    return (np.clip(out.images[0], 0, 1) * 255).round().astype(np.uint8)


def tiny_sdxl(folder: Path, seed: int = 0) -> Any:
    """A ``StableDiffusionXLPipeline`` with random weights: two CLIP text encoders (the second with a projection,
    whose pooled output and the size/crop time ids condition the UNet), latents 4 x 16 x 16."""
    from diffusers import (
        AutoencoderKL,
        EulerAncestralDiscreteScheduler,
        StableDiffusionXLPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(block_out_channels=(16, 32), layers_per_block=1, sample_size=SIZE // 2,
                                in_channels=4, out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=4,
                                norm_num_groups=4, cross_attention_dim=64, addition_embed_type="text_time",
                                addition_time_embed_dim=8, projection_class_embeddings_input_dim=6 * 8 + 32,
                                use_linear_projection=True)
    vae = AutoencoderKL(block_out_channels=(8, 16), in_channels=3, out_channels=3, latent_channels=4,
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        norm_num_groups=4, scaling_factor=4.5)
    config = CLIPTextConfig(bos_token_id=49406, eos_token_id=49407, pad_token_id=49407, hidden_size=32,
                            intermediate_size=37, num_attention_heads=4, num_hidden_layers=2, vocab_size=49408,
                            max_position_embeddings=77, projection_dim=32)
    tok = clip_tokenizer(folder / "tokenizer")
    scheduler = EulerAncestralDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                                steps_offset=1, timestep_spacing="trailing")
    pipe = StableDiffusionXLPipeline(vae=vae, text_encoder=CLIPTextModel(config), tokenizer=tok,
                                     text_encoder_2=CLIPTextModelWithProjection(config), tokenizer_2=tok, unet=unet,
                                     scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    return pipe
