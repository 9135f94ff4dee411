"""BlipCaptioner on tiny random-weight BLIP and BLIP-2 models saved to disk and loaded back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sleuth.tools.backends.base import BackendError
from sleuth.tools.backends.blip_captioner import BlipCaptioner, split_sentences
from tests.test_real_builders import BLIP_WORDS, save_blip, save_blip2

torch.set_num_threads(2)

WORDS = BLIP_WORDS
PROMPT = "a realistic photograph of a tabby cat"


@pytest.fixture(scope="module")
def blip_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_blip(tmp_path_factory.mktemp("blip"))


def images(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.integers(0, 256, (48, 40, 3), dtype=np.uint8) for _ in range(n)]


def test_split_sentences() -> None:
    assert split_sentences("a cat on a bench. it is red! ") == ["a cat on a bench", "it is red"]
    assert split_sentences("  ") == []


def test_captions_continue_the_class_prompt(blip_folder: Path) -> None:
    cap = BlipCaptioner(str(blip_folder), num_beams=2, num_samples=2, max_new_tokens=6)
    out = cap.captions(images(3), PROMPT)
    assert len(out) == 3
    for sentences in out:
        assert sentences and len(sentences) == len(set(sentences))
        assert not any(s.startswith(PROMPT) for s in sentences)  # the prompt is given, not a finding
    # The first candidate is what the best beam wrote after the prompt.
    inputs = cap._processor(images=images(1), text=[PROMPT], return_tensors="pt")
    with torch.no_grad():
        ids = cap._model.generate(**inputs, max_new_tokens=6, num_beams=2, num_return_sequences=2)
    best = cap._processor.batch_decode(ids, skip_special_tokens=True)[0]
    assert best.startswith(PROMPT) and split_sentences(best[len(PROMPT):])[0] == out[0][0]
    again = BlipCaptioner(str(blip_folder), num_beams=2, num_samples=2, max_new_tokens=6).captions(images(3), PROMPT)
    assert again == out  # sampling is seeded
    assert BlipCaptioner._target(f"{PROMPT}, sitting on a bench", PROMPT) == "sitting on a bench"
    assert BlipCaptioner._target(f"{PROMPT}s on a bench", PROMPT) == f"{PROMPT}s on a bench"


def test_sentence_loglik_is_the_teacher_forced_likelihood(blip_folder: Path) -> None:
    cap = BlipCaptioner(str(blip_folder), num_beams=0, num_samples=0, max_new_tokens=6)
    cap.load()
    ims = images(2)
    proc, model = cap._processor, cap._model
    inputs = proc(images=ims[:1], text=[PROMPT], return_tensors="pt")
    with torch.no_grad():
        gen = model.generate(**inputs, max_new_tokens=6, do_sample=False, output_scores=True,
                             return_dict_in_generate=True)
    n_prompt = inputs["input_ids"].shape[1] - 1  # generate() drops the trailing [SEP]
    new = gen.sequences[0, n_prompt:].tolist()
    steps = [torch.log_softmax(s[0], -1)[t].item() for s, t in zip(gen.scores, new)]
    keep = next((i for i, t in enumerate(new) if t < 6), len(new))  # stop at the first special token
    assert keep >= 2, "the tiny model should say something before a special token"
    greedy = f"{PROMPT} {cap.tokenizer.decode(new[:keep])}"
    expected = sum(steps[:keep])
    got = cap.sentence_loglik(ims[:1], greedy, PROMPT)
    assert got.shape == (1,)
    assert got[0] == pytest.approx(expected, abs=1e-3)
    # The greedy continuation beats random words of the same length, for this image.
    rng = np.random.default_rng(0)
    for _ in range(5):
        random_sentence = f"{PROMPT} " + " ".join(rng.choice(WORDS[:-2], size=keep))
        assert cap.sentence_loglik(ims[:1], random_sentence, PROMPT)[0] < got[0]
    both = cap.sentence_loglik(ims, greedy, PROMPT)
    assert both.shape == (2,) and both[0] == pytest.approx(got[0], abs=1e-4) and both[0] != both[1]
    # A sentence that does not repeat the prompt is scored after it, all its tokens counted.
    assert cap.sentence_loglik(ims[:1], "sitting on a bench", PROMPT)[0] < 0


SLOTH = "a realistic photograph of a three-toed sloth"


def test_a_class_name_with_punctuation_is_cut_off_by_token_ids(tmp_path: Path) -> None:
    """BERT decodes "three-toed" as "three - toed": the continuation is found by the ids after the prompt's, not by
    matching the decoded text against the prompt (which fails for 37 of ImageNet's class names)."""
    folder = save_blip(tmp_path, words=("three", "-", "toed", "sloth"))
    cap = BlipCaptioner(str(folder), num_beams=2, num_samples=0, max_new_tokens=6)
    out = cap.captions(images(2), SLOTH)
    inputs = cap._processor(images=images(1), text=[SLOTH], return_tensors="pt")
    with torch.no_grad():
        ids = cap._model.generate(**inputs, max_new_tokens=6, num_beams=2, num_return_sequences=2)
    decoded = cap._processor.decode(ids[0], skip_special_tokens=True)
    assert decoded.startswith("a realistic photograph of a three - toed sloth ")  # so text matching fails
    n_prompt = inputs["input_ids"].shape[1] - 1  # generate() drops the trailing [SEP]
    assert out[0][0] == split_sentences(cap._processor.decode(ids[0, n_prompt:], skip_special_tokens=True))[0]
    assert all(s for s in out) and not any("photograph" in s or "toed" in s for sents in out for s in sents)


@pytest.fixture(scope="module")
def blip2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_blip2(tmp_path_factory.mktemp("blip2"))


def test_blip2_scores_the_sentence_as_tokenised_in_the_caption(blip2_folder: Path) -> None:
    """OPT's byte-level BPE spells "sitting" as one token after a space and as seven at the start of a text: the
    likelihood is of the tokens the caption really has after the prompt."""
    cap = BlipCaptioner(str(blip2_folder), num_beams=0, num_samples=0)
    cap.load()
    tok, proc, model = cap.tokenizer, cap._processor, cap._model
    sentence = "sitting on a bench"
    assert len(tok(sentence, add_special_tokens=False)["input_ids"]) == 10  # s i t t i n g Ġon Ġa Ġbench
    ims = images(2)
    enc = proc(images=ims, text=[f"{PROMPT} {sentence}"] * 2, return_tensors="pt")
    ids = enc["input_ids"]
    assert tok.convert_ids_to_tokens(ids[0, -4:].tolist()) == ["Ġsitting", "Ġon", "Ġa", "Ġbench"]
    with torch.no_grad():
        logits = model(**enc).logits[:, -ids.shape[1]:]
    logp = torch.log_softmax(logits[:, -5:-1].float(), -1)  # position j predicts token j + 1
    expected = logp.gather(-1, ids[:, -4:, None])[..., 0].sum(-1).numpy()
    got = cap.sentence_loglik(ims, sentence, PROMPT)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    # The same sentence given with the prompt in front scores the same.
    np.testing.assert_allclose(cap.sentence_loglik(ims, f"{PROMPT} {sentence}", PROMPT), expected, rtol=1e-5)


def test_blip2_captions_continue_the_prompt(blip2_folder: Path) -> None:
    cap = BlipCaptioner(str(blip2_folder), num_beams=2, num_samples=1, max_new_tokens=6)
    out = cap.captions(images(2), PROMPT)
    inputs = cap._processor(images=images(1), text=[PROMPT], return_tensors="pt")
    with torch.no_grad():
        ids = cap._model.generate(**inputs, max_new_tokens=6, num_beams=2, num_return_sequences=2)
    # BLIP-2 returns the prompt (4 image tokens, BOS, text) and then what it wrote.
    assert ids[0, :inputs["input_ids"].shape[1]].tolist() == inputs["input_ids"][0].tolist()
    new = cap._processor.decode(ids[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert out[0][0] == split_sentences(new)[0]
    assert all(out) and not any(s.startswith("a realistic photograph") for sents in out for s in sents)


def test_blip2_with_an_encoder_decoder_language_model_is_refused(tmp_path: Path) -> None:
    from transformers import Blip2Config, T5Config

    Blip2Config(text_config=T5Config(d_model=32, d_ff=37, num_layers=1, num_heads=4).to_dict()).save_pretrained(
        tmp_path)
    with pytest.raises(BackendError, match="decoder-only"):
        BlipCaptioner(str(tmp_path)).load()
