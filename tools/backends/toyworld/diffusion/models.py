"""The architectures of toyworld-clip and toyworld-sd: small versions of CLIP and Stable Diffusion 1.x.

toyworld-clip is a transformers ``CLIPModel`` (ViT image tower on 64 px renders, 8 px patches; a causal text tower
over the world's BPE vocabulary). toyworld-sd is a diffusers Stable Diffusion pipeline: an ``AutoencoderKL`` that
maps 64×64 images to 16×16×8 latents, a ``UNet2DConditionModel`` cross-attending to toyworld-clip's text tower,
and a DDIM-compatible noise schedule (SD's scaled-linear betas, epsilon prediction).
"""

from __future__ import annotations

from typing import Any

IMAGE_SIZE = 64
MAX_TOKENS = 48
TEXT_WIDTH = 128
LATENT_CHANNELS = 8
"""Eight latent channels where SD 1.x has four: at 64 px a 16×16×4 latent loses the renders' fine lines and grain."""
LATENT_SIZE = 16
SCHEDULE = {"num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
            "prediction_type": "epsilon", "clip_sample": False, "set_alpha_to_one": False, "steps_offset": 1}
"""Stable Diffusion 1.x's training schedule (the DDIM scheduler config SD ships)."""
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def clip_config(vocab_size: int, bos: int, eos: int, *, text_width: int = TEXT_WIDTH, vision_width: int = 128,
                layers: int = 4) -> Any:
    from transformers import CLIPConfig

    text = {"vocab_size": vocab_size, "hidden_size": text_width, "intermediate_size": 4 * text_width,
            "num_hidden_layers": layers, "num_attention_heads": 4, "max_position_embeddings": MAX_TOKENS,
            "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": eos, "projection_dim": 128}
    vision = {"image_size": IMAGE_SIZE, "patch_size": 8, "hidden_size": vision_width,
              "intermediate_size": 4 * vision_width, "num_hidden_layers": layers, "num_attention_heads": 4,
              "projection_dim": 128}
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=128, logit_scale_init_value=2.6592)


def image_processor() -> Any:
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(do_resize=True, size={"shortest_edge": IMAGE_SIZE}, do_center_crop=True,
                              crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_normalize=True,
                              image_mean=list(CLIP_MEAN), image_std=list(CLIP_STD), do_convert_rgb=True)


def vae(channels: tuple[int, ...] = (32, 64, 64), groups: int = 16, latent_channels: int = LATENT_CHANNELS) -> Any:
    """Three blocks: 64 px -> 16×16 latents (a factor of 4, where SD 1.x has 8 at 512 px)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, latent_channels=latent_channels,
                         down_block_types=("DownEncoderBlock2D",) * len(channels),
                         up_block_types=("UpDecoderBlock2D",) * len(channels),
                         block_out_channels=tuple(channels), layers_per_block=1, norm_num_groups=groups,
                         sample_size=IMAGE_SIZE, scaling_factor=1.0)


def unet(channels: tuple[int, ...] = (64, 128, 128), text_width: int = TEXT_WIDTH, groups: int = 32,
         latent_channels: int = LATENT_CHANNELS, pooled_text: bool = False) -> Any:
    """SD 1.x's UNet, small. With ``pooled_text`` the time embedding also gets an attention-pooled summary of the
    text's hidden states and the ResNet blocks scale and shift their features by it (diffusers'
    ``addition_embed_type="text"`` with ``resnet_time_scale_shift="scale_shift"``): a global route for
    whole-image attributes (background, lighting, domain) beside the per-token cross-attention. The pipeline's
    call is unchanged: both routes read the same ``encoder_hidden_states``."""
    from diffusers import UNet2DConditionModel

    n = len(channels)
    extra: dict[str, Any] = {}
    if pooled_text:
        extra = {"addition_embed_type": "text", "addition_embed_type_num_heads": 4,
                 "resnet_time_scale_shift": "scale_shift"}
    return UNet2DConditionModel(
        sample_size=LATENT_SIZE, in_channels=latent_channels, out_channels=latent_channels, **extra,
        down_block_types=("CrossAttnDownBlock2D",) * (n - 1) + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * (n - 1),
        block_out_channels=tuple(channels), layers_per_block=1, cross_attention_dim=text_width,
        attention_head_dim=8, norm_num_groups=groups)


def scheduler() -> Any:
    from diffusers import DDIMScheduler

    return DDIMScheduler(**SCHEDULE)
