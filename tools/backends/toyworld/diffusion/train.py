"""Training toyworld-clip and toyworld-sd from a world's renders, on CPU, with fixed seeds.

Three stages, each on fresh renders every step (counter-based, so step ``i`` always sees the same images):

1. **toyworld-clip**: CLIP's symmetric contrastive loss on (render, text) pairs.
2. **the autoencoder**: L1 reconstruction plus a small KL term; afterwards the latents' standard deviation sets
   ``scaling_factor``, as Stable Diffusion's 0.18215 was set.
3. **the UNet**: epsilon prediction on the scaled latents, conditioned on the frozen text tower's last hidden
   states, with Min-SNR-5 loss weights, 10% empty texts (for classifier-free guidance) and an exponential moving
   average of the weights, which is what is saved.

The same seed and thread count give the same weights on the same machine; another CPU may round differently.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from sleuth.tools.backends.toyworld.config import World
from sleuth.tools.backends.toyworld.diffusion import models
from sleuth.tools.backends.toyworld.diffusion.data import Scenes, to_unit
from sleuth.tools.backends.toyworld.diffusion.tokenizer import build_tokenizer

Progress = Callable[[str, int, int], None]


class TrainSettings(BaseModel):
    """Everything that decides the trained weights."""

    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    threads: int = Field(default=2, ge=1)
    tokenizer_texts: int = Field(default=50_000, ge=100, description="Texts the BPE is learned on.")
    clip_steps: int = Field(default=700, ge=1)
    clip_batch: int = Field(default=128, ge=2)
    clip_lr: float = 5e-4
    vae_steps: int = Field(default=1500, ge=1)
    vae_batch: int = Field(default=16, ge=1)
    vae_lr: float = 1e-3
    vae_kl: float = 1e-6
    unet_steps: int = Field(default=5400, ge=1)
    unet_batch: int = Field(default=32, ge=1)
    unet_lr: float = 5e-4
    ema_decay: float = 0.999
    min_snr_gamma: float = 5.0
    text_width: int = Field(default=models.TEXT_WIDTH, ge=8)
    vision_width: int = Field(default=128, ge=8)
    clip_layers: int = Field(default=4, ge=1)
    vae_channels: tuple[int, ...] = (32, 64, 64)
    vae_groups: int = 16
    vae_latent_channels: int = Field(default=models.LATENT_CHANNELS, ge=1)
    unet_channels: tuple[int, ...] = (64, 96, 128)
    unet_groups: int = 32
    unet_pooled_text: bool = Field(default=True, description="Also condition the ResNet blocks on pooled text.")


@contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _schedule(step: int, total: int, warmup: int = 100) -> float:
    """Linear warm-up, then cosine decay to 10%."""
    if step < warmup:
        return (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))


def _optimizer(params: Any, lr: float, total: int) -> tuple[torch.optim.Optimizer, Any]:
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _schedule(s, total))


def _clip_pixels(images: np.ndarray) -> torch.Tensor:
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float().div(255)
    mean = torch.tensor(models.CLIP_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(models.CLIP_STD).view(1, 3, 1, 1)
    return (x - mean) / std


class Trainer:
    """The three stages for one world; ``progress(task, done, total)`` is told of every step."""

    def __init__(self, world: World, settings: TrainSettings | None = None, progress: Progress | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.world = world
        self.settings = settings or TrainSettings()
        self.progress = progress
        self.log = log or (lambda _m: None)
        self.seconds: dict[str, float] = {}

    def _data(self, stage: int) -> Scenes:
        return Scenes(self.world, seed=self.settings.seed * 16 + stage)

    def _tell(self, task: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(task, done, total)

    def tokenizer(self) -> Any:
        data = self._data(0)
        texts: list[str] = []
        for start in range(0, self.settings.tokenizer_texts, 5000):
            scenes = data.scenes(start, min(5000, self.settings.tokenizer_texts - start))
            rng = np.random.default_rng([data.seed, start, 13])
            texts.extend(data.captions.text(s, rng) for s in scenes)
        return build_tokenizer(texts, models.MAX_TOKENS)

    def tokens(self, tokenizer: Any, texts: list[str]) -> torch.Tensor:
        return tokenizer(texts, padding="max_length", max_length=models.MAX_TOKENS, truncation=True,
                         return_tensors="pt").input_ids

    def train_clip(self, tokenizer: Any) -> Any:
        from transformers import CLIPModel

        s = self.settings
        torch.manual_seed(s.seed)
        model = CLIPModel(models.clip_config(len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id,
                                             text_width=s.text_width, vision_width=s.vision_width,
                                             layers=s.clip_layers))
        model.train()
        opt, sched = _optimizer(model.parameters(), s.clip_lr, s.clip_steps)
        data = self._data(1)
        start = time.perf_counter()
        with _threads(s.threads):
            for step in range(s.clip_steps):
                batch = data.batch(step * s.clip_batch, s.clip_batch)
                # Empty texts carry no pair information: contrast only the described images.
                keep = [i for i, t in enumerate(batch.texts) if t]
                texts = [batch.texts[i] for i in keep]
                out = model(input_ids=self.tokens(tokenizer, texts), pixel_values=_clip_pixels(batch.images[keep]),
                            return_loss=True)
                opt.zero_grad(set_to_none=True)
                out.loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                with torch.no_grad():
                    model.logit_scale.clamp_(0, math.log(100))
                if step % 100 == 0 or step == s.clip_steps - 1:
                    self.log(f"clip step {step}: loss {out.loss.item():.3f}")
                self._tell("training toyworld-clip", step + 1, s.clip_steps)
        self.seconds["clip"] = time.perf_counter() - start
        return model.eval()

    def train_vae(self) -> Any:
        s = self.settings
        torch.manual_seed(s.seed + 1)
        vae = models.vae(s.vae_channels, s.vae_groups, s.vae_latent_channels)
        vae.train()
        opt, sched = _optimizer(vae.parameters(), s.vae_lr, s.vae_steps)
        data = self._data(2)
        start = time.perf_counter()
        with _threads(s.threads):
            for step in range(s.vae_steps):
                x = to_unit(data.batch(step * s.vae_batch, s.vae_batch).images)
                posterior = vae.encode(x).latent_dist
                recon = vae.decode(posterior.sample()).sample
                rec = (recon - x).abs().mean()
                loss = rec + s.vae_kl * posterior.kl().mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
                opt.step()
                sched.step()
                if step % 100 == 0 or step == s.vae_steps - 1:
                    self.log(f"vae step {step}: l1 {rec.item():.4f}")
                self._tell("training the autoencoder", step + 1, s.vae_steps)
            vae.eval()
            with torch.no_grad():
                z = torch.cat([vae.encode(to_unit(data.batch(10**7 + i * 64, 64).images)).latent_dist.mean
                               for i in range(8)])
        std = float(z.std())
        vae.register_to_config(scaling_factor=1.0 / std)
        self.log(f"latent std {std:.4f}: scaling_factor {1.0 / std:.4f}")
        self.seconds["vae"] = time.perf_counter() - start
        return vae

    def train_unet(self, text_encoder: Any, tokenizer: Any, vae: Any) -> Any:
        s = self.settings
        torch.manual_seed(s.seed + 2)
        unet = models.unet(s.unet_channels, s.text_width, s.unet_groups, s.vae_latent_channels, s.unet_pooled_text)
        ema = [p.detach().clone() for p in unet.parameters()]
        unet.train()
        noise_schedule = models.scheduler()
        alphas = noise_schedule.alphas_cumprod
        snr = alphas / (1 - alphas)
        weights = torch.clamp(snr, max=s.min_snr_gamma) / snr
        opt, sched = _optimizer(unet.parameters(), s.unet_lr, s.unet_steps)
        data = self._data(3)
        gen = torch.Generator().manual_seed(s.seed + 3)
        scale = vae.config.scaling_factor
        start = time.perf_counter()
        text_encoder.eval()
        vae.eval()
        with _threads(s.threads):
            for step in range(s.unet_steps):
                batch = data.batch(step * s.unet_batch, s.unet_batch)
                with torch.no_grad():
                    latents = vae.encode(to_unit(batch.images)).latent_dist.sample(gen) * scale
                    cond = text_encoder(self.tokens(tokenizer, batch.texts))[0]
                noise = torch.randn(latents.shape, generator=gen)
                t = torch.randint(0, len(alphas), (len(latents),), generator=gen)
                noisy = noise_schedule.add_noise(latents, noise, t)
                pred = unet(noisy, t, cond).sample
                per = F.mse_loss(pred, noise, reduction="none").mean(dim=(1, 2, 3))
                loss = (per * weights[t]).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
                opt.step()
                sched.step()
                decay = min(s.ema_decay, (1 + step) / (10 + step))
                with torch.no_grad():
                    for e, p in zip(ema, unet.parameters(), strict=True):
                        e.mul_(decay).add_(p.detach(), alpha=1 - decay)
                if step % 100 == 0 or step == s.unet_steps - 1:
                    self.log(f"unet step {step}: loss {loss.item():.4f}")
                self._tell("training the UNet", step + 1, s.unet_steps)
        with torch.no_grad():
            for e, p in zip(ema, unet.parameters(), strict=True):
                p.copy_(e)
        self.seconds["unet"] = time.perf_counter() - start
        return unet.eval()

    def run(self, out: Path) -> dict[str, Any]:
        """Train all three and write ``out/toyworld-clip`` and ``out/toyworld-sd``; returns the training record."""
        from diffusers import StableDiffusionPipeline
        from transformers import CLIPTextModel

        tokenizer = self.tokenizer()
        clip = self.train_clip(tokenizer)
        vae = self.train_vae()
        text_encoder = CLIPTextModel(clip.config.text_config)
        target = getattr(text_encoder, "text_model", text_encoder)  # transformers < 5 wraps the tower
        target.load_state_dict(clip.text_model.state_dict())
        text_encoder.eval()
        unet = self.train_unet(text_encoder, tokenizer, vae)
        clip_dir, sd_dir = out / "toyworld-clip", out / "toyworld-sd"
        for d in (clip_dir, sd_dir):
            if d.exists():
                shutil.rmtree(d)
        clip.save_pretrained(clip_dir, safe_serialization=True)
        tokenizer.save_pretrained(clip_dir)
        models.image_processor().save_pretrained(clip_dir)
        pipe: Any = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                            scheduler=models.scheduler(), safety_checker=None,
                                            feature_extractor=None, requires_safety_checker=False)
        pipe.save_pretrained(sd_dir, safe_serialization=True)
        return {"world": self.world.name, "config_hash": self.world.config_hash(),
                "settings": self.settings.model_dump(), "seconds": dict(self.seconds),
                "threads": self.settings.threads}
