"""Prompt-to-prompt on captions as investigations write them (sentences joined by ". "), with CLIP's real tokenizer;
local blending from attention accumulated over the steps; editing at guidance 1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from sleuth.tools.backends.sd_edit import EditSettings, Injection, InversionSettings, edit_latents, invert
from sleuth.tools.backends.sd_edit.controls import QualityThresholds, class_word_check, find_class
from sleuth.tools.backends.sd_edit.p2p import LocalBlend, align, word_tokens
from tests.sd_tiny import SIZE, clip_tokenizer, tiny_image, tiny_sd

torch.set_num_threads(1)

CLASS_PROMPT = "a realistic photograph of a tabby cat"
HYPOTHESIS = "a realistic photograph of a tabby cat. it is sitting on a bench."


@pytest.fixture(scope="module")
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    return Path(cache.mkdir("sd-tiny")) if cache is not None else tmp_path_factory.mktemp("sd")


@pytest.fixture(scope="module")
def tok(folder: Path) -> Any:
    return clip_tokenizer(folder / "tokenizer")


def test_a_sentence_after_the_class_word_leaves_the_class_word_unchanged(tok: Any) -> None:
    a = align(tok, CLASS_PROMPT, HYPOTHESIS)
    # Tokens: 1-7 "a realistic photograph of a tabby cat", 8 ".", 9-14 "it is sitting on a bench", 15 ".".
    assert a.mode == "refine" and a.removed == [] and a.added == ["it", "is", "sitting", "on", "a", "bench"]
    cat = 7
    assert float(a.alpha[cat]) == 1.0 and float(a.mapper[cat, cat]) == 1.0  # "cat" takes the source's map
    assert a.source_changed == [] and a.target_changed == list(range(9, 15))  # re-weighted and blended: the words
    assert float(a.alpha[8]) == 0.0 and float(a.alpha[15]) == 0.0  # the full stops are new tokens, own maps
    # End of text: source position 8, target 16.
    assert float(a.mapper[8, 16]) == 1.0
    # So the class-word filter has nothing to object to: nothing was replaced.
    th = QualityThresholds()
    assert class_word_check(a.removed, find_class(CLASS_PROMPT, ["tabby cat", "tiger cat"]), th) == (None, None)


def test_punctuation_inside_swaps_and_hyphenated_class_names(tok: Any) -> None:
    swap = align(tok, "a photo of a cat. it is on the grass.", "a photo of a cat. it is on the sand.")
    assert swap.mode == "replace" and swap.removed == ["grass"] and swap.added == ["sand"]
    assert swap.source_changed == swap.target_changed == [11]
    assert torch.equal(swap.mapper, torch.eye(77))
    sloth = align(tok, "a photo of a three-toed sloth", "a photo of a three-toed sloth. it is in the water.")
    assert sloth.removed == [] and sloth.added == ["it", "is", "in", "the", "water"]
    # "three-toed" is one word of four tokens (three, -, to, ed), all kept.
    assert bool((sloth.alpha[1:10] == 1).all())
    assert word_tokens(tok, "a cat. a cat, and a cat", "cat") == [2, 5, 9]


def test_local_blend_accumulates_attention_from_the_first_step() -> None:
    """As prompt-to-prompt's AttentionStore: the mask at a step comes from the maps summed over every step so far,
    not from that step's alone (a one-step map is noisy and jumps from step to step)."""
    blend = LocalBlend([1], [1], threshold=0.5, start=2)
    q, side = 16, 4  # a 4 x 4 map for an 8 x 8 latent... at a quarter of the side, as Hertz et al. blend
    early = torch.zeros(2, 1, q, 77)
    early[:, :, :4, 1] = 1.0  # steps 0-1: the word attends to the first row of the map
    late = torch.zeros(2, 1, q, 77)
    late[:, :, 12:, 1] = 0.3  # step 2: weakly to the last row
    x = torch.zeros(2, 4, 4 * side, 4 * side)
    x[1] = 1.0  # the target row differs everywhere; the mask decides where it is kept
    for step, cond in enumerate([early, early, late]):
        assert blend.wants(step)  # maps are recorded from step 0 on
        blend.record(cond)
        out = blend.after_step(step, x)
        if step < 2:
            assert out is x  # no blending before the start step
    mask = blend.last_mask[0, 0]
    # Summed: rows of weight 2.0 (first) and 0.3 (last): after normalising only the first row (dilated by the 3 x 3
    # max-pool to two rows of the 4 x 4 map, i.e. 8 latent rows) passes 0.5.
    assert bool((mask[:8] == 1).all()) and bool((mask[8:] == 0).all())
    assert float(out[1, :, :8].min()) == 1.0 and float(out[1, :, 8:].max()) == 0.0


@pytest.fixture(scope="module")
def pipe(folder: Path) -> Any:
    return tiny_sd(folder)


@pytest.mark.e2e
def test_editing_at_guidance_1(pipe: Any) -> None:
    """Guidance 1 runs no unconditional half: the attention control must not split the batch in two."""
    image = tiny_image(pipe, "a photo of a cat on the grass", seed=1)
    settings = InversionSettings(steps=6, guidance=1.0, null_steps=0)
    inv = invert(pipe, image, "a photo of a cat on the grass", settings, (SIZE, SIZE))
    run = edit_latents(pipe, inv, "a photo of a dog on the grass", [Injection(0.0, 0.0), Injection(0.8, 0.5)],
                       EditSettings(edit_word_weight=1.0, blend_threshold=0.6))
    src, regenerated, injected = run.latents
    assert run.latents.shape == (3, 4, SIZE // 2, SIZE // 2)
    assert float(((src - inv.z0) ** 2).mean()) < 5e-3  # guidance 1 retraces the inversion
    # Injection keeps the edit closer to the source than regenerating with the new prompt does.
    assert float(((injected - src) ** 2).mean()) < float(((regenerated - src) ** 2).mean())
    assert run.blend_mask is not None and 0.0 < float(run.blend_mask.mean()) < 1.0
    same = edit_latents(pipe, inv, "a photo of a cat on the grass", [Injection(0.8, 0.5)], EditSettings())
    np.testing.assert_allclose(same.latents[1].numpy(), same.latents[0].numpy(), atol=1e-5)
