"""Prompt-conditioned captions and caption likelihoods from BLIP / BLIP-2 class models (transformers).

As in Wiles et al. §3: the captioner completes the class prompt ("a realistic photograph of a tabby cat ...")
for each failed image, with beam-search and sampled candidates; what the model adds after the prompt is split into
sentences (so "... tabby cat sitting on a bench. it is snowing." gives "sitting on a bench", "it is snowing"). The
greedy selection then ranks sentences by their log-likelihood, teacher-forced, given the image and the class prompt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from sleuth.tools.backends.base import BackendError, Image
from sleuth.tools.backends.loading import (
    batches,
    choose_device,
    choose_dtype,
    dtype_tag,
    fingerprint,
    quiet_loading,
    resolve_pretrained,
    to_pil,
)

_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+")


def split_sentences(text: str) -> list[str]:
    parts = [p.strip(" .!?;,") for p in _SENTENCE_END.split(text.strip())]
    return [re.sub(r"\s+", " ", p) for p in parts if p.strip(" .!?;,")]


class BlipCaptioner:
    """A BLIP (``BlipForConditionalGeneration``) or BLIP-2 (``Blip2ForConditionalGeneration``) captioner loaded
    on first use from a local folder or the HF cache."""

    def __init__(self, model: str, *, device: str = "cpu", dtype: str | None = None, num_beams: int = 3,
                 num_samples: int = 3, max_new_tokens: int = 30, top_p: float = 0.9, seed: int = 0,
                 batch_size: int = 8) -> None:
        self.model_ref = model
        self._folder = resolve_pretrained(model, what="BLIP captioner")
        self.device = choose_device(device)
        self.dtype = choose_dtype(dtype, self.device)
        self.num_beams = num_beams
        self.num_samples = num_samples
        self.max_new_tokens = max_new_tokens
        self.top_p = top_p
        self.seed = seed
        self.batch_size = batch_size
        self.id = (f"blip:{model}@{fingerprint(self._folder)}:beams={num_beams}:samples={num_samples}"
                   f":tokens={max_new_tokens}:seed={seed}{dtype_tag(self.dtype)}")
        self._model: Any = None
        self._processor: Any = None
        self._kind = ""

    def load(self) -> None:
        if self._model is not None:
            return
        from transformers import AutoConfig, AutoProcessor, Blip2ForConditionalGeneration, BlipForConditionalGeneration

        classes: dict[str, Any] = {"blip": BlipForConditionalGeneration, "blip-2": Blip2ForConditionalGeneration}
        try:
            with quiet_loading():
                config = AutoConfig.from_pretrained(self._folder, local_files_only=True)
                if config.model_type not in classes:
                    raise BackendError(f"{self.model_ref!r} is a {config.model_type} model; the captioner takes "
                                       f"BLIP or BLIP-2 models.")
                model = classes[config.model_type].from_pretrained(self._folder, local_files_only=True,
                                                                   dtype=self.dtype)
                self._processor = AutoProcessor.from_pretrained(self._folder, local_files_only=True)
        except (OSError, ValueError) as e:
            raise BackendError(f"BLIP captioner {self.model_ref!r}: cannot load from {self._folder}: "
                               f"{str(e).splitlines()[0]}") from None
        self._kind = config.model_type
        self._model = model.to(self.device).eval()

    @property
    def tokenizer(self) -> Any:
        self.load()
        return self._processor.tokenizer

    def _pixels(self, pils: list[Any]) -> Any:
        return self._processor(images=pils, return_tensors="pt")["pixel_values"].to(self.device, self.dtype)

    # -- candidates ------------------------------------------------------------------------------------------

    def captions(self, images: Sequence[Image], class_prompt: str) -> list[list[str]]:
        import torch

        self.load()
        pils = to_pil(images)
        out: list[list[str]] = []
        for sl in batches(len(pils), self.batch_size):
            chunk = pils[sl]
            inputs = self._processor(images=chunk, text=[class_prompt] * len(chunk), return_tensors="pt")
            inputs = {k: (v.to(self.device, self.dtype) if v.is_floating_point() else v.to(self.device))
                      for k, v in inputs.items()}
            texts: list[list[str]] = [[] for _ in chunk]
            runs: list[dict[str, Any]] = []
            if self.num_beams > 0:
                runs.append({"num_beams": self.num_beams, "num_return_sequences": self.num_beams})
            if self.num_samples > 0:
                runs.append({"do_sample": True, "top_p": self.top_p, "num_return_sequences": self.num_samples})
            devices = [self.device] if self.device.type == "cuda" else []
            for i, run in enumerate(runs):
                # A private RNG stream: sampled captions depend on the seed, not on what ran before.
                with torch.random.fork_rng(devices=devices), torch.no_grad():
                    torch.manual_seed(self.seed + i)
                    ids = self._model.generate(**inputs, max_new_tokens=self.max_new_tokens, **run)
                decoded = self._processor.batch_decode(ids, skip_special_tokens=True)
                per = run["num_return_sequences"]
                for j, text in enumerate(decoded):
                    texts[j // per].append(text)
            for cands in texts:
                sentences: list[str] = []
                for text in cands:
                    # The caption goes on after the class prompt: its sentences are what the model added.
                    for s in split_sentences(self._target(text, class_prompt)):
                        if s not in sentences:
                            sentences.append(s)
                out.append(sentences)
        return out

    # -- likelihood ------------------------------------------------------------------------------------------

    @staticmethod
    def _target(sentence: str, class_prompt: str) -> str:
        """The part of ``sentence`` the captioner must produce after the class prompt."""
        s, p = " ".join(sentence.split()), " ".join(class_prompt.split())
        if s.lower().startswith(p.lower()) and not s[len(p):len(p) + 1].isalnum():
            return s[len(p):].strip(" ,")
        return s

    def sentence_loglik(self, images: Sequence[Image], sentence: str, class_prompt: str) -> np.ndarray:
        import torch

        self.load()
        pils = to_pil(images)
        tok = self.tokenizer
        target = self._target(sentence, class_prompt)
        target_ids = tok(target, add_special_tokens=False)["input_ids"] if target else []
        if not target_ids:
            return np.zeros(len(pils))
        out = []
        for sl in batches(len(pils), self.batch_size):
            chunk = pils[sl]
            pixels = self._pixels(chunk)
            if self._kind == "blip":
                # BLIP decodes from [DEC] (bos) and reads the prompt without special tokens, as generate() does.
                prompt_ids = tok(class_prompt, add_special_tokens=False)["input_ids"]
                ids = [self._model.config.text_config.bos_token_id, *prompt_ids, *target_ids]
                input_ids = torch.tensor([ids] * len(chunk), device=self.device)
                with torch.no_grad():
                    logits = self._model(pixel_values=pixels, input_ids=input_ids).logits
            else:
                enc = self._processor(images=chunk, text=[f"{class_prompt} {target}"] * len(chunk),
                                      return_tensors="pt")
                input_ids = enc["input_ids"].to(self.device)
                with torch.no_grad():
                    logits = self._model(pixel_values=pixels, input_ids=input_ids,
                                         attention_mask=enc["attention_mask"].to(self.device)).logits
                # Query/image positions, if any, come first: the text's logits are the last ones.
                logits = logits[:, -input_ids.shape[1]:]
            n = len(target_ids)
            logp = torch.log_softmax(logits[:, -n - 1:-1].float(), dim=-1)
            tgt = input_ids[:, -n:]
            out.append(logp.gather(-1, tgt[..., None])[..., 0].sum(-1).cpu().numpy())
        return np.concatenate(out).astype(np.float64)
