"""Training toyworld-clip and toyworld-sd from a world's renders, on CPU, with fixed seeds.

Three stages, each on fresh renders every step (counter-based, so step ``i`` always sees the same images):

1. **toyworld-clip**: CLIP's symmetric contrastive loss on (render, text) pairs.
2. **the autoencoder**: L1 reconstruction plus a small KL term; afterwards the latents' standard deviation sets
   ``scaling_factor``, as Stable Diffusion's 0.18215 was set.
3. **the UNet**: epsilon prediction on the scaled latents, conditioned on the frozen text tower's last hidden
   states, with Min-SNR-5 loss weights, 10% empty texts (for classifier-free guidance) and an exponential moving
   average of the weights, which is what is saved.
4. **offset noise**: a short fine-tune of that average in which every image's noise has an added per-channel
   constant (Guttenberg's offset noise). The standard noise schedule never destroys an image's mean colour, so
   sampling from zero-mean noise draws mid-tone images; toyworld-sd drew snow grey (read as sky) until this stage.

``Trainer.run(out, resume=folder)`` takes stages 1-3 from an earlier run's folders when that run's settings for
them are the same, and trains only the offset stage.

The same seed and thread count give the same weights on the same machine; another CPU may round differently.
"""

from __future__ import annotations

import json
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
    offset_steps: int = Field(default=500, ge=0, description="Offset-noise fine-tune steps after the UNet stage.")
    offset_lr: float = 2e-4
    noise_offset: float = Field(default=0.1, ge=0, description="Std of the per-image, per-channel noise offset.")
    offset_ema_decay: float = 0.99

    def base(self) -> dict[str, Any]:
        """The settings that decide stages 1-3 (everything but the offset stage's)."""
        return {k: v for k, v in self.model_dump().items()
                if k not in OFFSET_SETTINGS and k != "threads"}


OFFSET_SETTINGS = ("offset_steps", "offset_lr", "noise_offset", "offset_ema_decay")


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
        return self._denoise(unet, text_encoder, tokenizer, vae, stage=3, steps=s.unet_steps, lr=s.unet_lr,
                             offset=0.0, ema_decay=s.ema_decay, task="training the UNet", key="unet")

    def tune_offset(self, unet: Any, text_encoder: Any, tokenizer: Any, vae: Any) -> Any:
        s = self.settings
        if s.offset_steps == 0:
            return unet
        return self._denoise(unet, text_encoder, tokenizer, vae, stage=4, steps=s.offset_steps, lr=s.offset_lr,
                             offset=s.noise_offset, ema_decay=s.offset_ema_decay,
                             task="fine-tuning the UNet with offset noise", key="offset")

    def _denoise(self, unet: Any, text_encoder: Any, tokenizer: Any, vae: Any, *, stage: int, steps: int,
                 lr: float, offset: float, ema_decay: float, task: str, key: str) -> Any:
        """Epsilon-prediction training of ``unet`` (Min-SNR weights); the moving average is what is returned."""
        s = self.settings
        ema = [p.detach().clone() for p in unet.parameters()]
        unet.train()
        noise_schedule = models.scheduler()
        alphas = noise_schedule.alphas_cumprod
        snr = alphas / (1 - alphas)
        weights = torch.clamp(snr, max=s.min_snr_gamma) / snr
        opt, sched = _optimizer(unet.parameters(), lr, steps)
        data = self._data(stage)
        gen = torch.Generator().manual_seed(s.seed + stage)
        scale = vae.config.scaling_factor
        start = time.perf_counter()
        text_encoder.eval()
        vae.eval()
        with _threads(s.threads):
            for step in range(steps):
                batch = data.batch(step * s.unet_batch, s.unet_batch)
                with torch.no_grad():
                    latents = vae.encode(to_unit(batch.images)).latent_dist.sample(gen) * scale
                    cond = text_encoder(self.tokens(tokenizer, batch.texts))[0]
                noise = torch.randn(latents.shape, generator=gen)
                if offset:
                    noise = noise + offset * torch.randn(latents.shape[:2] + (1, 1), generator=gen)
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
                decay = min(ema_decay, (1 + step) / (10 + step))
                with torch.no_grad():
                    for e, p in zip(ema, unet.parameters(), strict=True):
                        e.mul_(decay).add_(p.detach(), alpha=1 - decay)
                if step % 100 == 0 or step == steps - 1:
                    self.log(f"{key} step {step}: loss {loss.item():.4f}")
                self._tell(task, step + 1, steps)
        with torch.no_grad():
            for e, p in zip(ema, unet.parameters(), strict=True):
                p.copy_(e)
        self.seconds[key] = time.perf_counter() - start
        return unet.eval()

    def resumed(self, folder: Path) -> tuple[Any, Any, Any, Any, Any, dict[str, Any]]:
        """Stages 1-3 from an earlier run's ``folder`` (with ``toyworld-clip`` and ``toyworld-sd``), refused unless
        its recorded settings for them are these settings'."""
        from diffusers import StableDiffusionPipeline
        from transformers import CLIPModel

        record_file = folder / "toyworld-sd" / "training.json"
        if not record_file.is_file():
            raise ValueError(f"cannot resume from {folder}: no toyworld-sd/training.json there")
        record = json.loads(record_file.read_text())
        theirs = TrainSettings(**{k: v for k, v in record["settings"].items() if k not in OFFSET_SETTINGS})
        if record.get("settings", {}).get("offset_steps"):
            raise ValueError(f"cannot resume from {folder}: its UNet already had the offset stage")
        ours = TrainSettings(**{k: v for k, v in self.settings.model_dump().items() if k not in OFFSET_SETTINGS})
        diff = sorted(k for k, v in ours.base().items() if theirs.base()[k] != v)
        if diff:
            raise ValueError(f"cannot resume from {folder}: its stages 1-3 used other settings ({', '.join(diff)})")
        if record.get("config_hash") != self.world.config_hash():
            raise ValueError(f"cannot resume from {folder}: it was trained on another world")
        pipe: Any = StableDiffusionPipeline.from_pretrained(folder / "toyworld-sd", local_files_only=True)
        clip = CLIPModel.from_pretrained(folder / "toyworld-clip", local_files_only=True).eval()
        self.seconds.update({k: v for k, v in record["seconds"].items() if k in ("clip", "vae", "unet")})
        return pipe.tokenizer, clip, pipe.vae.eval(), pipe.text_encoder.eval(), pipe.unet.eval(), record

    def run(self, out: Path, resume: Path | None = None) -> dict[str, Any]:
        """Train the stages and write ``out/toyworld-clip`` and ``out/toyworld-sd``; returns the training record.
        With ``resume``, stages 1-3 come from that earlier run's folders (see ``resumed``)."""
        from diffusers import StableDiffusionPipeline
        from transformers import CLIPTextModel

        extra: dict[str, Any] = {}
        if resume is not None:
            tokenizer, clip, vae, text_encoder, unet, before = self.resumed(resume)
            extra["resumed"] = {"from": str(resume), "seconds": before["seconds"]}
        else:
            tokenizer = self.tokenizer()
            clip = self.train_clip(tokenizer)
            vae = self.train_vae()
            text_encoder = CLIPTextModel(clip.config.text_config)
            target = getattr(text_encoder, "text_model", text_encoder)  # transformers < 5 wraps the tower
            target.load_state_dict(clip.text_model.state_dict())
            text_encoder.eval()
            unet = self.train_unet(text_encoder, tokenizer, vae)
        unet = self.tune_offset(unet, text_encoder, tokenizer, vae)
        # Written beside the old folders first, then swapped in: an interrupted save (or a resume from ``out``
        # itself) never leaves half a model.
        out.mkdir(parents=True, exist_ok=True)
        staging = out / ".training"
        if staging.exists():
            shutil.rmtree(staging)
        clip.save_pretrained(staging / "toyworld-clip", safe_serialization=True)
        tokenizer.save_pretrained(staging / "toyworld-clip")
        models.image_processor().save_pretrained(staging / "toyworld-clip")
        pipe: Any = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                            scheduler=models.scheduler(), safety_checker=None,
                                            feature_extractor=None, requires_safety_checker=False)
        pipe.save_pretrained(staging / "toyworld-sd", safe_serialization=True)
        if resume is not None:  # what was not retrained is the earlier run's files, byte for byte
            shutil.rmtree(staging / "toyworld-clip")
            shutil.copytree(resume / "toyworld-clip", staging / "toyworld-clip")
            for part in (resume / "toyworld-sd").iterdir():
                if part.name not in ("unet", "training.json"):
                    dest = staging / "toyworld-sd" / part.name
                    shutil.rmtree(dest) if dest.is_dir() else dest.unlink(missing_ok=True)
                    (shutil.copytree if part.is_dir() else shutil.copy2)(part, dest)
            config = staging / "toyworld-sd" / "unet" / "config.json"
            unet_config = json.loads(config.read_text())
            unet_config.pop("_name_or_path", None)
            config.write_text(json.dumps(unet_config, indent=2, sort_keys=True) + "\n")
        for name in ("toyworld-clip", "toyworld-sd"):
            if (out / name).exists():
                shutil.rmtree(out / name)
            (staging / name).rename(out / name)
        staging.rmdir()
        record = {"world": self.world.name, "config_hash": self.world.config_hash(),
                  "settings": self.settings.model_dump(), "seconds": dict(self.seconds),
                  "threads": self.settings.threads, **extra}
        for name in ("toyworld-clip", "toyworld-sd"):
            (out / name / "training.json").write_text(json.dumps(record, indent=2) + "\n")
        return record
