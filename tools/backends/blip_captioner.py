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
                if config.model_type == "blip-2" and not config.use_decoder_only_language_model:
                    # A T5 decoder reads the prompt in its encoder: the prompt-continuation scoring here is for
                    # language models that read prompt and caption as one sequence.
                    raise BackendError(f"{self.model_ref!r} is a BLIP-2 model with an encoder-decoder language model "
                                       f"({config.text_config.model_type}); the captioner takes BLIP-2 with a "
                                       f"decoder-only one (OPT), e.g. Salesforce/blip2-opt-2.7b.")
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
                per = run["num_return_sequences"]
                for j, text in enumerate(self._continuations(inputs["input_ids"][0].tolist(), ids, class_prompt)):
                    texts[j // per].append(text)
            for cands in texts:
                sentences: list[str] = []
                for text in cands:
                    for s in split_sentences(text):
                        if s not in sentences:
                            sentences.append(s)
                out.append(sentences)
        return out

    def _continuations(self, prompt: list[int], sequences: Any, class_prompt: str) -> list[str]:
        """What the model wrote after the class prompt, decoded from the generated ids that follow the prompt's.

        Ids, not text: BERT's decoder spaces out punctuation ("three - toed sloth"), so the decoded text of 37
        of ImageNet's class names (hyphens, apostrophes, brackets) does not start with the prompt as written.
        """
        # BLIP's generate() puts its [DEC] where the prompt had [CLS] and drops the trailing [SEP]; BLIP-2 returns
        # the prompt (image tokens, BOS, text) as given.
        n = len(prompt) - 1 if self._kind == "blip" else len(prompt)
        body = prompt[1:n] if self._kind == "blip" else prompt
        out = []
        for seq in sequences.tolist():
            if (seq[1:n] if self._kind == "blip" else seq[:n]) == body:
                out.append(self._processor.decode(seq[n:], skip_special_tokens=True).strip(" ,"))
            else:  # a model that does not echo the prompt: its whole output is the continuation
                out.append(self._target(self._processor.decode(seq, skip_special_tokens=True), class_prompt))
        return out

    # -- likelihood ------------------------------------------------------------------------------------------

    @staticmethod
    def _target(sentence: str, class_prompt: str) -> str:
        """The part of ``sentence`` the captioner must produce after the class prompt."""
        s, p = " ".join(sentence.split()), " ".join(class_prompt.split())
        if s.lower().startswith(p.lower()) and not s[len(p):len(p) + 1].isalnum():
            return s[len(p):].strip(" ,")
        return s

    def _continuation_length(self, class_prompt: str, target: str) -> int:
        """How many tokens ``target`` is *after* the class prompt and a space, tokenised in context.

        Byte-level BPE (BLIP-2's OPT) spells a word differently after a space than at the start of a text
        ("Ġsitting" vs "sit"+"ting"), so the target alone can have another length than in the caption.
        """
        tok = self.tokenizer
        whole = tok(f"{class_prompt} {target}", add_special_tokens=False)["input_ids"]
        prompt = tok(class_prompt, add_special_tokens=False)["input_ids"]
        common = 0
        while common < min(len(whole), len(prompt)) and whole[common] == prompt[common]:
            common += 1
        return len(whole) - common

    def sentence_loglik(self, images: Sequence[Image], sentence: str, class_prompt: str) -> np.ndarray:
        import torch

        self.load()
        pils = to_pil(images)
        target = self._target(sentence, class_prompt)
        n = self._continuation_length(class_prompt, target) if target else 0
        if not n:
            return np.zeros(len(pils))
        full = f"{class_prompt} {target}"
        out = []
        for sl in batches(len(pils), self.batch_size):
            chunk = pils[sl]
            pixels = self._pixels(chunk)
            if self._kind == "blip":
                # BLIP decodes from [DEC] (bos) and reads the prompt without special tokens, as generate() does.
                ids = [self._model.config.text_config.bos_token_id,
                       *self.tokenizer(full, add_special_tokens=False)["input_ids"]]
                input_ids = torch.tensor([ids] * len(chunk), device=self.device)
                with torch.no_grad():
                    logits = self._model(pixel_values=pixels, input_ids=input_ids).logits
            else:
                enc = self._processor(images=chunk, text=[full] * len(chunk), return_tensors="pt")
                input_ids = enc["input_ids"].to(self.device)
                with torch.no_grad():
                    logits = self._model(pixel_values=pixels, input_ids=input_ids,
                                         attention_mask=enc["attention_mask"].to(self.device)).logits
                # Query/image positions, if any, come first: the text's logits are the last ones.
                logits = logits[:, -input_ids.shape[1]:]
            logp = torch.log_softmax(logits[:, -n - 1:-1].float(), dim=-1)
            tgt = input_ids[:, -n:]
            out.append(logp.gather(-1, tgt[..., None])[..., 0].sum(-1).cpu().numpy())
        return np.concatenate(out).astype(np.float64)
