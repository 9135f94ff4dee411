"""Null-text inversion + prompt-to-prompt on a tiny random-weight Stable Diffusion pipeline (CPU).

Numbers asserted here were measured on this tiny model (see tests/sd_tiny.py for why it is well conditioned);
each bound leaves a margin of 2-4x below the measured value so the tests catch a broken feature, not noise.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from sleuth.tools.backends.base import BackendError, Editor, Generation
from sleuth.tools.backends.sd_edit import (
    EditSettings,
    Injection,
    InversionCache,
    InversionSettings,
    QualityThresholds,
    SDEditor,
    edit_latents,
    invert,
    reconstruct,
)
from sleuth.tools.backends.sd_edit.controls import EditScores, choose, class_word_check, find_class
from sleuth.tools.backends.sd_edit.p2p import AttentionEdit, P2PAttnProcessor, align, word_tokens
from tests.sd_tiny import SIZE, tiny_image, tiny_sd

torch.set_num_threads(1)

SOURCE = "a photo of a cat on the grass"
SWAP = "a photo of a dog on the grass"
ADD = "a photo of a cat on the grass in the snow"
FAST = InversionSettings(steps=10, guidance=7.5, null_steps=10, null_lr=0.1)


def mse(a: Any, b: Any) -> float:
    return float(((a - b) ** 2).mean())


@pytest.fixture(scope="module")
def pipe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    # The tokenizer files persist in pytest's cache: writing them from open_clip's vocabulary takes seconds.
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    folder = cache.mkdir("sd-tiny") if cache is not None else tmp_path_factory.mktemp("sd")
    return tiny_sd(Path(folder))


@pytest.fixture(scope="module")
def image(pipe: Any) -> np.ndarray:
    return tiny_image(pipe, SOURCE, seed=1)


@pytest.fixture(scope="module")
def inverted(pipe: Any, image: np.ndarray) -> Any:
    return invert(pipe, image, SOURCE, FAST, (SIZE, SIZE))


def with_prediction(pipe: Any, kind: str) -> Any:
    """The same weights read as an epsilon- or v-prediction model."""
    from diffusers import DDIMScheduler, StableDiffusionPipeline

    return StableDiffusionPipeline(**{**pipe.components, "scheduler": DDIMScheduler.from_config(
        pipe.scheduler.config, prediction_type=kind)}, requires_safety_checker=False)


# -- inversion --------------------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_ddim_inversion_at_guidance_1_reconstructs(pipe: Any, image: np.ndarray) -> None:
    inv = invert(pipe, image, SOURCE, InversionSettings(steps=20, guidance=1.0, null_steps=0), (SIZE, SIZE))
    assert inv.nulls.dim() == 3  # one plain null embedding: nothing was optimised
    err = mse(reconstruct(pipe, inv), inv.z0)
    # Measured 2.0e-3 against a latent variance of 0.94 (20 steps).
    assert err < 5e-3 and err < 0.006 * float(inv.z0.var())
    # zT is noise-like, not the image: the reconstruction is real work.
    assert mse(inv.latent, inv.z0) > 0.5


@pytest.mark.e2e
def test_null_text_cuts_the_error_at_guidance_7_5(pipe: Any, image: np.ndarray, inverted: Any) -> None:
    plain = invert(pipe, image, SOURCE, FAST.model_copy(update={"null_steps": 0}), (SIZE, SIZE))
    drift = mse(reconstruct(pipe, plain), plain.z0)
    err = mse(reconstruct(pipe, inverted), inverted.z0)
    assert inverted.nulls.shape == (10, 1, 77, 32)
    # The optimiser's own account of where it ended matches sampling from its result.
    assert inverted.reconstruction_mse == pytest.approx(err, rel=1e-3)
    # Measured (10 steps, 10 Adam steps each): 8.6e-2 -> 1.0e-3, x83.
    assert drift > 25 * err and err < 3e-3, (drift, err)


@pytest.mark.e2e
def test_null_text_on_a_v_prediction_model(pipe: Any, image: np.ndarray) -> None:
    p = with_prediction(pipe, "v_prediction")
    plain = invert(p, image, SOURCE, FAST.model_copy(update={"null_steps": 0}), (SIZE, SIZE))
    tuned = invert(p, image, SOURCE, FAST.model_copy(update={"null_steps": 5}), (SIZE, SIZE))
    drift, err = mse(reconstruct(p, plain), plain.z0), mse(reconstruct(p, tuned), tuned.z0)
    # Measured (10 steps, 5 Adam steps each): 3.2e-3 -> 3.1e-4, x10. Guidance drifts less here: a v-model whose
    # outputs are scaled down predicts x0 ~ sqrt(alpha) x whatever the text.
    assert drift > 4 * err, (drift, err)


# -- prompt-to-prompt -------------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_identical_prompts_reproduce_the_reconstruction(pipe: Any, inverted: Any) -> None:
    run = edit_latents(pipe, inverted, SOURCE, [Injection(0.8, 0.6), Injection(0.0, 0.0)], EditSettings())
    rec = reconstruct(pipe, inverted)
    assert run.alignment.mode == "same"
    # Row 0 runs through the explicit attention path, the reconstruction through diffusers' own processors.
    assert float((run.latents[0] - rec).abs().max()) < 1e-4
    assert float((run.latents[1:] - run.latents[:1]).abs().max()) < 1e-4
    assert mse(run.latents[0], inverted.z0) == pytest.approx(inverted.reconstruction_mse, rel=1e-2)
    assert not any(isinstance(p, P2PAttnProcessor) for p in pipe.unet.attn_processors.values())


@pytest.mark.e2e
def test_word_swap_with_injection_stays_closer_than_regeneration(pipe: Any, inverted: Any) -> None:
    from sleuth.tools.backends.sd_edit.ddim import decode_latents

    settings = EditSettings(edit_word_weight=1.0, local_blend=False)
    run = edit_latents(pipe, inverted, SWAP, [Injection(0.0, 0.0), Injection(0.8, 0.4)], settings)
    assert run.alignment.mode == "replace" and run.alignment.removed == ["cat"] and run.alignment.added == ["dog"]
    src, regenerated, injected = run.latents
    # Measured: 1.1e-2 without injection, 4.5e-3 with it (x2.4 closer).
    assert mse(injected, src) * 1.6 < mse(regenerated, src)
    assert mse(injected, src) > 1e-4  # and it is an edit, not a copy
    imgs = [im.astype(float) for im in decode_latents(pipe, run.latents)]
    assert mse(imgs[2], imgs[0]) < mse(imgs[1], imgs[0])


@pytest.mark.e2e
def test_local_blend_keeps_the_source_outside_the_changed_words(pipe: Any, inverted: Any) -> None:
    settings = EditSettings(edit_word_weight=1.0, local_blend=True, blend_threshold=0.6)
    run = edit_latents(pipe, inverted, SWAP, [Injection(0.8, 0.4)], settings)
    mask = run.blend_mask
    assert mask is not None and mask.shape == (1, 1, SIZE // 2, SIZE // 2)
    inside = float(mask.mean())
    assert 0.05 < inside < 0.95
    diff = (run.latents[1] - run.latents[0]).abs().amax(0)
    outside = mask[0, 0] == 0
    assert float(diff[outside].max()) == 0.0 and float(diff[~outside].max()) > 1e-3



def test_without_class_removes_whole_words_only() -> None:
    from sleuth.tools.backends.sd_edit.regions import without_class

    assert without_class(SOURCE, "cat") == "a photo of a on the grass"
    assert without_class("A Snow Leopard in the snow.", "snow leopard") == "A in the snow."
    assert without_class("a photo of a bobcat", "cat") is None
    assert without_class("a cat-like dog", "cat") is None


@pytest.mark.e2e
def test_keep_class_leaves_the_class_region_as_the_source(pipe: Any, inverted: Any) -> None:
    from sleuth.tools.backends.sd_edit.regions import RegionSettings, class_region

    keep = class_region(pipe, inverted.z0, SOURCE, "cat", 7.5)
    assert keep is not None and keep.shape == (1, 1, SIZE // 2, SIZE // 2)
    assert set(torch.unique(keep).tolist()) <= {0.0, 1.0} and 0.0 < float(keep.mean()) < 1.0
    again = class_region(pipe, inverted.z0, SOURCE, "cat", 7.5)
    assert torch.equal(keep, again)  # seeded noise draws: the same region every time
    bare = class_region(pipe, inverted.z0, SOURCE, "cat", 7.5, RegionSettings(dilate=0))
    assert float(bare.mean()) <= float(keep.mean()) and bool((keep >= bare).all())  # dilation only grows it
    assert class_region(pipe, inverted.z0, SOURCE, "dog", 7.5) is None  # the caption does not name a dog
    # Words' maps off: the edit is free everywhere but in the class region, which stays the source's exactly.
    run = edit_latents(pipe, inverted, ADD, [Injection(0.8, 0.4)], EditSettings(local_blend=False), keep=keep)
    diff = (run.latents[1] - run.latents[0]).abs().amax(0)
    inside = keep[0, 0] == 1
    assert float(diff[inside].max()) == 0.0 and float(diff[~inside].max()) > 1e-3
    assert run.blend_mask is not None and torch.equal(run.blend_mask[0, 0], 1 - keep[0, 0])
    # With the words' maps too, the region changed is within theirs and outside the class region.
    both = edit_latents(pipe, inverted, ADD, [Injection(0.8, 0.4)], EditSettings(blend_threshold=0.6), keep=keep)
    assert both.blend_mask is not None and float((both.blend_mask * keep).max()) == 0.0
    assert 0.0 < float(both.blend_mask.mean()) < float((1 - keep).mean())


@pytest.mark.e2e
def test_editor_keep_class_option(pipe: Any, image: np.ndarray) -> None:
    from sleuth.tools.backends.sd_edit.editor import default_cost

    inversion = FAST.model_copy(update={"null_steps": 2})
    plain = SDEditor(pipeline=pipe, inversion=inversion, class_names=["cat", "dog"])
    keeping = SDEditor(pipeline=pipe, inversion=inversion, class_names=["cat", "dog"],
                       editing=EditSettings(keep="class"))
    assert keeping.id != plain.id
    # Two guided passes over 8 noise draws on top of the edit, in images of 10 steps: 2 * 8 / 10.
    assert keeping.cost.edit == pytest.approx(plain.cost.edit + 1.6)
    assert default_cost(inversion, EditSettings(keep="class"), False).edit == pytest.approx(2 + 1.6)
    gen = Generation(image=image, prompt=SOURCE, seed=1)
    out = keeping.edit(gen, SOURCE, ADD)
    assert 0.0 < out.meta["kept_region"] < 1.0 and plain.edit(gen, SOURCE, ADD).meta["kept_region"] is None
    assert keeping.edit(gen, "a photo of a bird on the grass", ADD).meta["kept_region"] is None  # no class named
    assert keeping.edit(gen, SOURCE, SOURCE).meta["kept_region"] is None  # a sham edit changes nothing to keep


def test_alignment_of_swaps_refinements_and_padding(pipe: Any) -> None:
    tok = pipe.tokenizer
    swap = align(tok, SOURCE, SWAP)
    # "a photo of a cat on the grass": cat is token 5; every token maps to itself.
    assert swap.source_changed == [5] and swap.target_changed == [5]
    assert torch.equal(swap.mapper, torch.eye(77)) and bool((swap.alpha == 1).all())
    refine = align(tok, SOURCE, SWAP, mode="refine")
    assert refine.mode == "refine" and float(refine.alpha[5]) == 0.0 and float(refine.alpha[4]) == 1.0
    add = align(tok, SOURCE, ADD)
    assert add.mode == "refine" and add.added == ["in", "the", "snow"] and add.removed == []
    assert add.target_changed == [9, 10, 11] and [float(add.alpha[j]) for j in (8, 9, 11, 12)] == [1, 0, 0, 1]
    # End of text to end of text (source 9, target 12); after it, padding position j takes source position j.
    assert float(add.mapper[9, 12]) == 1.0 and float(add.mapper[13, 13]) == 1.0 and float(add.mapper[76, 76]) == 1.0
    assert float(add.mapper[:, 13].sum()) == 1.0
    back = align(tok, ADD, SOURCE)
    assert back.removed == ["in", "the", "snow"] and float(back.mapper[12, 9]) == 1.0
    assert float(back.mapper[10, 10]) == 1.0 and bool((back.alpha[9:] == 1).all())
    # Different token counts: "cat" -> "kitten cub" is not a same-length swap.
    assert align(tok, SOURCE, "a photo of a kitten cub on the grass").mode == "refine"
    assert word_tokens(tok, ADD, "the") == [7, 10]


def test_attention_edit_follows_the_schedule(pipe: Any) -> None:
    a = align(pipe.tokenizer, SOURCE, ADD)
    eq = torch.ones(77)
    eq[a.target_changed] = 2.0
    heads, q = 2, 4
    control = AttentionEdit(a, [Injection(0.5, 0.2), Injection(0.0, 0.0)], 10, equalizer=eq, self_max_tokens=q)
    torch.manual_seed(0)
    probs = torch.rand(2 * 3 * heads, q, 77).softmax(-1)
    rows = probs.reshape(6, heads, q, 77)
    out = control.edit(probs.clone(), heads, True).reshape(6, heads, q, 77)
    assert torch.equal(out[:3], rows[:3])  # unconditional half untouched
    expect = (a.alpha * (rows[3] @ a.mapper) + (1 - a.alpha) * rows[4]) * eq
    assert torch.allclose(out[4], expect) and torch.equal(out[5], rows[5]) and torch.equal(out[3], rows[3])
    assert torch.allclose(out[4][..., 2], rows[3][..., 2]) and torch.allclose(out[4][..., 10], 2 * rows[4][..., 10])
    selfp = torch.rand(6 * heads, q, q)
    s = control.edit(selfp.clone(), heads, False).reshape(6, heads, q, q)
    assert torch.equal(s[4], selfp.reshape(6, heads, q, q)[3])
    assert control.needs(False, q) and not control.needs(False, q + 1)  # larger self maps are left alone
    control.begin_step(2)  # self injection ends after 2 of 10 steps, cross after 5
    assert not control.needs(False, q) and control.needs(True, q)
    control.begin_step(5)
    assert torch.equal(control.edit(probs.clone(), heads, True), probs)


# -- LANCE's controls -------------------------------------------------------------------------------------------


def scores(**kw: float) -> EditScores:
    base = {"image_image": 0.9, "source_text": 0.3, "target_text": 0.3, "directional": 0.3, "consistency": 0.1}
    return EditScores(**{**base, **kw})


def test_filters_and_the_sweep_pick() -> None:
    th = QualityThresholds()
    assert scores().passed(th) == {"image_image": True, "image_text": True, "directional": True, "consistent": True}
    assert scores(image_image=0.69).passed(th)["image_image"] is False
    assert scores(source_text=0.19).passed(th)["image_text"] is False
    assert scores(directional=0.1).passed(th)["directional"] is False
    assert scores(consistency=-0.01).passed(th)["consistent"] is False
    assert scores(directional=0.1).passed(QualityThresholds(directional=0.05))["directional"] is True
    # The best directional score among full passes, not the best overall.
    cands = [scores(directional=0.3), scores(directional=0.9, image_image=0.5), scores(directional=0.4)]
    assert choose(cands, th) == 2
    assert choose([scores(directional=0.1), scores(directional=0.15)], th) == 1  # none passes: best overall


class WordScorer:
    """A stand-in CLIP: texts embed by the words they contain, images by their mean colour."""

    id = "word-scorer"
    vocab = ["cat", "dog", "kitten", "grass", "snow", "photo"]

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        f = np.array([[0.2 + (w in t.split()) * 3 for w in self.vocab] for t in texts])
        return f / np.linalg.norm(f, axis=1, keepdims=True)

    def encode_images(self, images: list[np.ndarray]) -> np.ndarray:
        m = np.array([np.asarray(im, float).mean((0, 1)) / 255 for im in images])
        f = np.concatenate([m, 1 - m], axis=1)
        return f / np.linalg.norm(f, axis=1, keepdims=True)


def test_class_word_filter() -> None:
    th = QualityThresholds()
    assert find_class("a photo of a tabby cat on the grass", ["cat", "tabby cat", "dog"]) == "tabby cat"
    assert find_class("a photo of a category", ["cat"]) is None
    assert class_word_check(["grass"], "cat", th, WordScorer())[0] is True
    ok, sim = class_word_check(["cat"], "cat", th, WordScorer())
    assert ok is False and sim == pytest.approx(1.0)
    assert class_word_check([], "cat", th, WordScorer()) == (None, None)  # pure additions pass, as in LANCE
    assert class_word_check(["tabby"], "tabby cat", th) == (False, None)  # no CLIP: exact word overlap
    assert class_word_check(["grass"], "cat", QualityThresholds(class_word=0.1), WordScorer())[0] is False


# -- the editor and its cache ----------------------------------------------------------------------------------


@pytest.mark.e2e
def test_second_edit_of_an_image_reuses_its_inversion(pipe: Any, image: np.ndarray) -> None:
    editor = SDEditor(pipeline=pipe, inversion=FAST.model_copy(update={"null_steps": 5}), scorer=WordScorer(),
                      class_names=["cat", "dog"],
                      editing=EditSettings(self_steps=(0.4, 0.6, 0.8)))
    assert isinstance(editor, Editor)
    calls = []
    hook = pipe.unet.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        gen = Generation(image=image, prompt=SOURCE, seed=1)
        t0 = time.perf_counter()
        first = editor.edit(gen, SOURCE, SWAP)
        t1 = time.perf_counter()
        n_first = len(calls)
        second = editor.edit(gen, SOURCE, ADD)
        t2 = time.perf_counter()
        n_second = len(calls) - n_first
    finally:
        hook.remove()
    assert editor.inversions_run == 1 and editor.cache.hits == 1 and editor.cache.misses == 1
    assert first.meta["inversion_cached"] is False and second.meta["inversion_cached"] is True
    # The second edit is only the edit: one batched pass of 10 steps (source + 3 sweep rows). The first also paid
    # for the inversion: 10 DDIM steps, then per step one conditional call, up to 5 Adam steps and one step.
    assert n_second == 10 and n_first >= 10 + 10 * 3 + 10
    assert t2 - t1 < t1 - t0
    for out, tgt in ((first, SWAP), (second, ADD)):
        assert out.image.shape == image.shape and out.image.dtype == np.uint8
        assert out.target_caption == tgt and len(out.meta["sweep"]) == 3
        assert set(out.scores) >= {"clip_image_image", "clip_source_text", "clip_target_text", "clip_directional"}
        sweep = out.meta["sweep"]
        best = max(range(3), key=lambda i: sweep[i]["directional"])
        passing = [i for i in range(3) if all(EditScores(**{k: sweep[i][k] for k in EditScores.model_fields})
                                              .passed(editor.thresholds).values())]
        pick = max(passing, key=lambda i: sweep[i]["directional"]) if passing else best
        assert out.meta["self_steps"] == sweep[pick]["self"]
    assert first.passed["class_word"] is False and first.meta["removed"] == ["cat"]  # edits the class itself
    assert "class_word" not in second.passed and second.meta["mode"] == "refine"
    assert first.meta["reconstruction_mse"] < 5e-3
    other = image.copy()
    other[0, 0] ^= 1
    editor.edit(Generation(image=other, prompt=SOURCE, seed=1), SOURCE, SWAP)
    assert editor.inversions_run == 2  # one pixel changed: another image, another inversion


@pytest.mark.e2e
def test_a_sham_edit_is_the_reconstruction_and_costs_no_sampling(pipe: Any, image: np.ndarray) -> None:
    from sleuth.tools.backends.sd_edit.ddim import decode_latents

    editor = SDEditor(pipeline=pipe, inversion=FAST.model_copy(update={"null_steps": 5}), scorer=WordScorer(),
                      class_names=["cat", "dog"], editing=EditSettings(self_steps=(0.4, 0.6, 0.8), keep="class"))
    gen = Generation(image=image, prompt=SOURCE, seed=1)
    inv, _ = editor.invert(image, SOURCE)
    calls = []
    hook = pipe.unet.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        sham = editor.edit(gen, SOURCE, " ".join(SOURCE.split()) + " ")
    finally:
        hook.remove()
    # The null-text run ended at the reconstruction: the sham only decodes it.
    assert calls == [] and sham.meta["inversion_cached"] is True and sham.meta["kept_region"] is None
    assert np.array_equal(sham.image, decode_latents(pipe, inv.reconstruction)[0])
    # It is what sampling from the inversion under the source caption gives, as the full edit path gave it.
    sampled = decode_latents(pipe, reconstruct(pipe, inv))[0]
    assert np.abs(sham.image.astype(int) - sampled.astype(int)).max() <= 2
    assert sham.meta["reconstruction_mse"] == pytest.approx(inv.reconstruction_mse, rel=1e-6)
    assert sham.meta["removed"] == [] and sham.meta["added"] == [] and len(sham.meta["sweep"]) == 1
    # Without null-text optimisation nothing was sampled yet: the sham samples the reconstruction itself.
    plain = SDEditor(pipeline=pipe, inversion=FAST.model_copy(update={"null_steps": 0}))
    out = plain.edit(gen, SOURCE, SOURCE)
    inv0, _ = plain.invert(image, SOURCE)
    assert inv0.reconstruction is None
    again = decode_latents(pipe, reconstruct(pipe, inv0))[0]
    assert np.abs(out.image.astype(int) - again.astype(int)).max() <= 2


@pytest.mark.e2e
def test_inversions_persist_on_disk(inverted: Any, tmp_path: Path) -> None:
    from sleuth.tools.backends.sd_edit.cache import inversion_key

    key = inversion_key(np.zeros((4, 4, 3), np.uint8), SOURCE, FAST, "m", (SIZE, SIZE))
    assert key != inversion_key(np.zeros((4, 4, 3), np.uint8), SOURCE, FAST.model_copy(update={"steps": 11}), "m",
                                (SIZE, SIZE))
    InversionCache(directory=tmp_path).put(key, inverted)
    again = InversionCache(directory=tmp_path).get(key)
    assert again is not None and torch.equal(again.nulls, inverted.nulls) and torch.equal(again.latent,
                                                                                          inverted.latent)
    assert (again.prompt, again.settings, again.size) == (SOURCE, FAST, (SIZE, SIZE))
    assert inverted.reconstruction is not None and torch.equal(again.reconstruction, inverted.reconstruction)
    (tmp_path / f"{key}.safetensors").write_bytes(b"broken")
    assert InversionCache(directory=tmp_path).get(key) is None
    small = InversionCache(max_items=1)
    small.put("a", inverted)
    small.put("b", inverted)
    assert small.get("a") is None and small.get("b") is not None and len(small) == 1


def test_sd_edit_spec(pipe: Any, image: np.ndarray, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from sleuth.tools.backends.base import Backends, LabelSpace
    from sleuth.tools.backends.specs import BackendSpecs, make_backends

    class Toy:
        def __init__(self, id: str) -> None:
            self.id = id
            self.labels = LabelSpace(("cat", "dog"))

    def load_backends(world=None, *, size=64, device="cpu", progress=None):
        return Backends(Toy("g"), Toy("c"), Toy("cap"), Toy("e"), Toy("ed"))

    fake = types.SimpleNamespace(load_backends=load_backends)
    monkeypatch.setitem(sys.modules, "sleuth.tools.backends.toyworld", fake)
    pipe.save_pretrained(tmp_path / "sd")
    folder = tmp_path / "sd"
    b = BackendSpecs(generator=f"diffusers:{folder}", editor=f"sd-edit:{folder},steps=3,null_steps=2,"
                                                             f"self=0.2/0.6,weight=1.5,image_image=0.6,size={SIZE}")
    ed = b.build_parts()["editor"]
    assert isinstance(ed, SDEditor) and ed._pipe is None and ed.class_names == ["cat", "dog"]
    assert (ed.inversion_settings.steps, ed.inversion_settings.null_steps) == (3, 2)
    assert ed.settings.self_steps == (0.2, 0.6) and ed.settings.edit_word_weight == 1.5
    assert ed.thresholds.image_image == 0.6 and ed.size == SIZE and ed.id.startswith(f"sd-edit:{folder}@")
    out = ed.edit(Generation(image=image, prompt=SOURCE, seed=1), SOURCE, SWAP)  # loads from disk, no CLIP
    assert out.image.shape == image.shape and out.passed == {"class_word": False} and out.meta["self_steps"] == 0.6
    assert BackendSpecs(editor=f"sd-edit:{folder},keep=class").build_parts()["editor"].settings.keep == "class"
    for bad, match in [("colour=red", "unknown option"), ("steps=0", "steps"), ("self=x", "self_steps"),
                       ("keep=cat", "keep"),
                       ("clip=on", "CLIP embedder")]:
        with pytest.raises(BackendError, match=match):
            make_backends(generator=f"diffusers:{folder}", editor=f"sd-edit:{folder},{bad}")
    with pytest.raises(BackendError, match="not found"):
        make_backends(generator=f"diffusers:{folder}", editor=f"sd-edit:{tmp_path / 'missing'}")


# -- 50 steps, as in the papers ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["epsilon", "v_prediction"])
def test_fifty_step_inversion_numbers(pipe: Any, image: np.ndarray, kind: str) -> None:
    p = with_prediction(pipe, kind)
    hw = (SIZE, SIZE)
    g1 = invert(p, image, SOURCE, InversionSettings(steps=50, guidance=1.0, null_steps=0), hw)
    plain = invert(p, image, SOURCE, InversionSettings(steps=50, guidance=7.5, null_steps=0), hw)
    tuned = invert(p, image, SOURCE, InversionSettings(steps=50, guidance=7.5, null_steps=20, null_lr=0.1), hw)
    e1, drift, err = (mse(reconstruct(p, i), i.z0) for i in (g1, plain, tuned))
    # Measured with the official schedule (early stop at 1e-5 + 2e-5 a step, which later steps reach after one Adam
    # step): epsilon 6.1e-4 at guidance 1, 1.7e-1 -> 9.7e-4 at 7.5 (x180); v-prediction 7.9e-6, 3.3e-3 -> 5.7e-5
    # (x59).
    assert e1 < 2e-3
    assert drift > (60 if kind == "epsilon" else 20) * err, (e1, drift, err)


@pytest.mark.e2e
def test_an_image_the_same_weights_drew_is_edited_from_its_seed(pipe: Any, tmp_path: Path) -> None:
    """No inversion for a generated image: prompt-to-prompt starts from the seed's noise, its source row redraws
    the image, and the sham (caption unchanged) is that redraw. Anything else is inverted."""
    from sleuth.tools.backends.diffusers_generator import DiffusersGenerator
    from sleuth.tools.backends.sd_edit.ddim import psnr
    from sleuth.tools.backends.sd_edit.editor import SEED_PSNR

    gen = DiffusersGenerator(pipeline=pipe, num_inference_steps=FAST.steps, guidance_scale=FAST.guidance,
                             height=SIZE, width=SIZE)
    g, other = gen.generate([SOURCE, SOURCE], [2**40 + 3, 5])
    assert g.meta["drawn"] == {"model": gen.model_key, "noise": "np64", "steps": 10, "guidance": 7.5,
                               "scheduler": "DDIMScheduler", "size": [SIZE, SIZE]}
    editor = SDEditor(pipeline=pipe, inversion=FAST, class_names=["cat", "dog"])
    assert editor.model_id == gen.model_key
    inverting = SDEditor(pipeline=pipe, inversion=FAST, class_names=["cat", "dog"], start="invert")
    assert editor.id != inverting.id
    with pytest.raises(BackendError, match="start"):
        SDEditor(pipeline=pipe, start="guess")  # type: ignore[arg-type]

    calls: list[int] = []
    hook = pipe.unet.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        out = editor.edit(g, SOURCE, SWAP)
        edit_calls, calls[:] = len(calls), []
        sham = editor.edit(g, SOURCE, SOURCE)
        sham_calls = len(calls)
    finally:
        hook.remove()
    # One sampling pass (source and target rows batched, guided: one UNet call a step), no inversion; the sham
    # reuses the source row.
    assert edit_calls == FAST.steps and sham_calls == 0 and editor.inversions_run == 0
    assert out.meta["start"] == "seed" and out.meta["start_psnr"] >= SEED_PSNR
    assert sham.meta["start"] == "seed" and np.abs(sham.image.astype(int) - g.image.astype(int)).max() <= 2
    assert psnr(out.image, g.image) < out.meta["start_psnr"]  # the edit changed the image
    # The same edit by inversion starts from a reconstruction, not the image itself.
    by_inversion = inverting.edit(g, SOURCE, SWAP)
    assert by_inversion.meta["start"] == "inversion" and inverting.inversions_run == 1
    assert "start_psnr" not in by_inversion.meta

    # A caption other than the one the image was drawn with, or other steps: inverted.
    assert editor.edit(g, "a photo of a cat", SWAP).meta["start"] == "inversion"
    five = DiffusersGenerator(pipeline=pipe, num_inference_steps=5, guidance_scale=7.5, height=SIZE, width=SIZE)
    assert editor.edit(five.generate([SOURCE], [7])[0], SOURCE, SWAP).meta["start"] == "inversion"
    # Claimed by the metadata but not redrawn (other weights under the same name): inverted after all, with the
    # redraw's PSNR on record; the image's next edit goes straight to inversion.
    forged = Generation(image=other.image, prompt=SOURCE, seed=g.seed, meta={"drawn": dict(g.meta["drawn"])})
    runs = editor.inversions_run
    fell = editor.edit(forged, SOURCE, SWAP)
    assert fell.meta["start"] == "inversion" and fell.meta["seeded_psnr"] < SEED_PSNR
    assert editor.edit(forged, SOURCE, SOURCE).meta["start"] == "inversion"
    assert editor.inversions_run == runs + 1
