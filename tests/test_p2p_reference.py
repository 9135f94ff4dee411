"""Prompt-to-prompt against a reference-equivalent computation (tests/p2p_reference.py) on the tiny pipeline.

Every counterfactual edit is a refinement (the class prompt -> the class prompt and a sentence): the edited latent
must be the reference's to a relative 1e-4 of the edit's own size (measured: about 1e-6).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from sleuth.tools.backends.sd_edit import EditSettings, Injection, InversionSettings, edit_latents, invert
from sleuth.tools.backends.sd_edit.p2p import AttentionEdit, LocalBlend, align
from tests.p2p_reference import ReferenceEdit, reference_alignment, reference_sample
from tests.sd_tiny import SIZE, tiny_image, tiny_sd

torch.set_num_threads(1)

CLASS = "a photo of a cat"
HYPOTHESIS = "a photo of a cat. it is in the snow."
FAST = InversionSettings(steps=10, guidance=7.5, null_steps=10, null_lr=0.1)


@pytest.fixture(scope="module")
def pipe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("sd-tiny") if cache is not None else tmp_path_factory.mktemp("sd")
    return tiny_sd(Path(folder))


@pytest.fixture(scope="module")
def inverted(pipe: Any) -> Any:
    return invert(pipe, tiny_image(pipe, CLASS, seed=1), CLASS, FAST, (SIZE, SIZE))


def relative(a: torch.Tensor, b: torch.Tensor, source: torch.Tensor) -> float:
    """|a - b| relative to the size of the edit |b - source|."""
    return float((a - b).norm() / (b - source).norm())


@pytest.mark.parametrize("source,target", [(CLASS, HYPOTHESIS),
                                           ("a photo of a cat on the grass", "a photo of a cat in the snow"),
                                           (HYPOTHESIS, CLASS),
                                           (CLASS, "a photo of a fluffy cat")])
def test_refinement_alignment_is_the_reference_aligners(pipe: Any, source: str, target: str) -> None:
    """Target padding position j takes source position j (not the source's end of text + k)."""
    a = align(pipe.tokenizer, source, target, mode="refine")
    index, alpha = reference_alignment(pipe.tokenizer, source, target)
    assert torch.equal(a.alpha, alpha)
    expect = torch.zeros(77, 77)
    expect[index[alpha > 0], torch.arange(77)[alpha > 0]] = 1
    assert torch.equal(a.mapper, expect)


def test_only_content_words_are_reweighted_and_blended(pipe: Any) -> None:
    tok = pipe.tokenizer
    a = align(tok, CLASS, HYPOTHESIS)
    # ". it is in the snow ." adds tokens 6..12; only "snow" (11) names something to draw.
    assert a.target_changed == [7, 8, 9, 10, 11] and a.target_content == [11] and a.source_content == []
    swap = align(tok, "a photo of a cat on the grass", "a photo of a cat in the snow")
    assert swap.removed == ["on", "grass"] and swap.added == ["in", "snow"]
    assert swap.source_content == [8] and swap.target_content == [8]
    # A caption that adds only stop words has nothing to blend or re-weight.
    assert align(tok, CLASS, "a photo of a cat. it is here.").target_content == []


def test_the_blend_records_the_maps_as_injected(pipe: Any) -> None:
    """The store holds the maps after injection and re-weighting: in a word swap the target's new word has the
    source word's map (x its weight) while injected, and that is what the blend region is made of."""
    a = align(pipe.tokenizer, "a photo of a cat", "a photo of a dog")
    blend = LocalBlend(a.source_content, a.target_content, start=0)
    eq = torch.ones(77)
    eq[a.target_content] = 2.0
    control = AttentionEdit(a, [Injection(1.0, 0.0)], 4, blend=blend, equalizer=eq)
    heads, q = 1, 16
    probs = torch.full((2 * 2 * heads, q, 77), 1e-3)
    probs[:, :4, 5] = 0.5
    probs[3, :, 5] = 0.0
    probs[3, 12:, 5] = 0.5  # the target row alone puts "dog" in the last four positions
    out = control.edit(probs.clone(), heads, True)
    assert torch.equal(out[3, :, 5], 2 * probs[2, :, 5])
    recorded = blend.sums[q]
    assert torch.equal(recorded[0], probs[2, :, 5]) and torch.equal(recorded[1], 2 * probs[2, :, 5])


def sleuth_and_reference(pipe: Any, inv: Any, target: str, cross: float, self_: float,
                         threshold: float) -> tuple[Any, torch.Tensor, ReferenceEdit]:
    settings = EditSettings(cross_steps=(cross,), self_steps=(self_,), blend_threshold=threshold)
    run = edit_latents(pipe, inv, target, [Injection(cross, self_)], settings)
    a = run.alignment
    index, alpha = reference_alignment(pipe.tokenizer, inv.prompt, target)
    eq = torch.ones(77)
    eq[a.target_content] = 2.0
    h, w = inv.latent.shape[-2:]
    swap = a.mapper if a.mode == "replace" else None
    control = ReferenceEdit(index, alpha, FAST.steps, cross, self_, equalizer=eq, blend_source=a.source_content,
                            blend_target=a.target_content, self_max=h * w // 4, swap=swap,
                            threshold=threshold)
    ref = reference_sample(pipe, inv.latent, [inv.prompt, target], inv.nulls, FAST.steps, FAST.guidance, control)
    return run, ref, control


def test_a_counterfactual_refinement_is_the_references(pipe: Any, inverted: Any) -> None:
    run, ref, control = sleuth_and_reference(pipe, inverted, HYPOTHESIS, 0.8, 0.6, 0.6)
    assert run.alignment.mode == "refine"
    source = ref[:1]
    assert relative(run.latents[1:], ref[1:], source) < 1e-4
    assert relative(run.latents[:1], ref[:1], ref[1:]) < 1e-4
    assert run.blend_mask is not None and control.mask is not None and torch.equal(run.blend_mask, control.mask)



def test_a_word_swap_blends_where_the_reference_does(pipe: Any, inverted: Any) -> None:
    run, ref, control = sleuth_and_reference(pipe, inverted, "a photo of a dog", 0.8, 0.4, 0.3)
    assert run.alignment.mode == "replace"
    assert relative(run.latents[1:], ref[1:], ref[:1]) < 1e-4
    assert control.mask is not None and run.blend_mask is not None
    np.testing.assert_array_equal(run.blend_mask.numpy(), control.mask.numpy())

