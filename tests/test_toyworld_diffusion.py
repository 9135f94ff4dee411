"""toyworld-clip and toyworld-sd: training data, the BPE tokenizer, the training stages on tiny sizes, and the
folders they write loading through sleuth's real-model specs (diffusers generator, sd-edit editor, CLIP embedder)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sleuth.tools.backends.base import BackendError
from sleuth.tools.backends.packaged import packaged
from sleuth.tools.backends.toyworld import load_world
from sleuth.tools.backends.toyworld.diffusion import data
from sleuth.tools.backends.toyworld.diffusion.tokenizer import learn_bpe, words

TINY = {"seed": 3, "tokenizer_texts": 2000, "clip_steps": 2, "clip_batch": 8, "vae_steps": 2, "vae_batch": 2,
        "unet_steps": 3, "unet_batch": 2, "text_width": 32, "vision_width": 32, "clip_layers": 1,
        "vae_channels": (8, 16, 16), "vae_groups": 8, "unet_channels": (16, 32, 32), "unet_groups": 8,
        "offset_steps": 2, "offset_lr": 0.05}


@pytest.fixture(scope="module")
def world() -> Any:
    return load_world()


def test_scenes_are_counter_based_and_texts_name_the_class(world: Any) -> None:
    s = data.Scenes(world, seed=5)
    a, b = s.batch(100, 300), s.batch(100, 300)
    assert np.array_equal(a.images, b.images) and a.texts == b.texts and a.images.shape == (300, 64, 64, 3)
    assert s.batch(400, 300).texts != a.texts
    empty = sum(t == "" for t in a.texts)
    assert 10 <= empty <= 55  # 10% of 300, with room
    words_of = {c.name: {c.name, *c.synonyms} for c in world.classes}
    for scene, text in zip(a.scenes, a.texts, strict=True):
        if text:
            assert any(w in text for w in words_of[scene.label]), (scene.label, text)
    # Scenes follow the natural priors except for a share with one attribute drawn uniformly: every background
    # appears, and the training seeds are far from any investigation's.
    backgrounds = {sc.background for sc in s.scenes(0, 2000)}
    assert backgrounds == set(world.vocabulary.names("background"))
    assert data.SEED_BASE >= 2**50


def test_texts_name_only_true_attributes(world: Any) -> None:
    from sleuth.tools.backends.toyworld.parser import parse

    s = data.Scenes(world, seed=1)
    batch = s.batch(0, 400)
    checked = 0
    for scene, text in zip(batch.scenes, batch.texts, strict=True):
        parsed = parse(text, world)
        for attr in ("background", "lighting", "domain"):
            allowed = parsed.scene_constraints.get(attr)
            if allowed:
                assert getattr(scene, attr) in allowed, (text, attr, getattr(scene, attr))
                checked += 1
        if text:
            assert parsed.label == scene.label, text
    assert checked > 200


def test_bpe_spells_every_training_word_as_one_token() -> None:
    from transformers import CLIPTokenizer

    texts = ["a photo of a cat in the snow", "the snow leopard. it is at dusk.", "a pencil sketch of a kitten"] * 3
    vocab, merges = learn_bpe(texts)
    assert learn_bpe(texts) == (vocab, merges)  # deterministic
    tok = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=16)
    for w in words(texts):
        ids = tok(w.replace("</w>", ""), add_special_tokens=False).input_ids
        assert len(ids) == 1, w
    ids = tok("a cat", padding="max_length", max_length=16).input_ids
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id == tok.pad_token_id and len(ids) == 16
    # An unseen word is spelled in pieces, never dropped.
    unseen = tok("zebra", add_special_tokens=False).input_ids
    assert len(unseen) > 1 and tok.decode(unseen).strip() == "zebra"


def test_prompt_to_prompt_alignment_takes_the_tokenizers_length() -> None:
    """toyworld-sd's prompts are 48 tokens, not Stable Diffusion's 77: the alignment follows the tokenizer."""
    from transformers import CLIPTokenizer

    from sleuth.tools.backends.sd_edit.p2p import align, word_tokens

    texts = ["a photo of a cat on the grass", "a photo of a cat in the snow"]
    vocab, merges = learn_bpe(texts)
    tok = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=48)
    a = align(tok, texts[0], texts[1])
    assert a.mapper.shape == (48, 48) and a.alpha.shape == (48,)
    assert a.added == ["in", "snow"] and a.removed == ["on", "grass"]
    assert word_tokens(tok, texts[1], "snow") == [8]
    assert float(a.mapper[47, 47]) == 1.0  # padding matched position by position to the end


def test_training_script_flags_cover_every_setting(tmp_path: Path) -> None:
    import importlib.util

    from sleuth.tools.backends.toyworld.diffusion.train import TrainSettings

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("train_toyworld_sd_script", root / "scripts" / "train_toyworld_sd.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    args, settings = script.parse(["--out", str(tmp_path), "--unet-steps", "7", "--unet-channels", "16,32",
                                   "--no-unet-pooled-text", "--unet-lr", "0.001"])
    assert args.out == tmp_path
    assert settings == TrainSettings(unet_steps=7, unet_channels=(16, 32), unet_pooled_text=False, unet_lr=1e-3)
    assert script.parse([])[1] == TrainSettings()
    with pytest.raises(SystemExit):
        script.parse(["--unet-pooled-text", "no"])


def test_packaged_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sleuth.tools.backends import packaged as registry

    assert packaged("some/model") is None and packaged(str(tmp_path)) is None
    monkeypatch.setattr(registry, "WEIGHTS", tmp_path)
    with pytest.raises(BackendError, match="train_toyworld_sd.py"):
        packaged("toyworld-sd")
    (tmp_path / "toyworld-sd").mkdir()
    (tmp_path / "toyworld-sd" / "model_index.json").write_text("{}")
    assert packaged("toyworld-sd") == tmp_path / "toyworld-sd"


@pytest.fixture(scope="module")
def trained(world: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    from sleuth.tools.backends.toyworld.diffusion.train import Trainer, TrainSettings

    out = tmp_path_factory.mktemp("toyworld-diffusion")
    seen: list[tuple[str, int, int]] = []
    record = Trainer(world, TrainSettings(**TINY), progress=lambda t, d, n: seen.append((t, d, n))).run(out)
    record["progress"] = seen
    return out, record


def test_training_writes_standard_folders(trained: tuple[Path, dict[str, Any]]) -> None:
    import torch
    from diffusers import StableDiffusionPipeline
    from transformers import CLIPModel, CLIPTextModel

    out, record = trained
    assert set(record["seconds"]) == {"clip", "vae", "unet", "offset"}
    assert ("training the UNet", 3, 3) in record["progress"]
    assert record["progress"][-1] == ("fine-tuning the UNet with offset noise", 2, 2)
    assert json.loads((out / "toyworld-sd" / "training.json").read_text())["settings"]["offset_steps"] == 2
    pipe = StableDiffusionPipeline.from_pretrained(out / "toyworld-sd", local_files_only=True)
    assert pipe.vae_scale_factor == 4 and pipe.unet.config.sample_size == 16
    # Eight latent channels end to end, and the UNet's second, pooled route to the text.
    assert pipe.vae.config.latent_channels == pipe.unet.config.in_channels == pipe.unet.config.out_channels == 8
    assert pipe.unet.config.addition_embed_type == "text"
    assert pipe.vae.config.scaling_factor > 0 and pipe.vae.config.scaling_factor != 1.0
    clip = CLIPModel.from_pretrained(out / "toyworld-clip", local_files_only=True)
    # The pipeline's text encoder is toyworld-clip's text tower, weight for weight.
    text = CLIPTextModel.from_pretrained(out / "toyworld-sd" / "text_encoder", local_files_only=True)
    ids = pipe.tokenizer(["a photo of a cat in the snow"], padding="max_length", return_tensors="pt").input_ids
    with torch.no_grad():
        a = text(ids).last_hidden_state
        b = clip.text_model(ids).last_hidden_state
    assert torch.allclose(a, b, atol=1e-6)
    images = pipe(["a photo of a cat"], num_inference_steps=2, output_type="np",
                  generator=torch.Generator().manual_seed(0)).images
    assert images.shape == (1, 64, 64, 3)


@pytest.mark.e2e
def test_resume_trains_only_the_offset_stage(trained: tuple[Path, dict[str, Any]], world: Any,
                                             tmp_path: Path) -> None:
    """A run resumed from an earlier run without the offset stage trains only that stage, and gives the UNet a
    full run gives (same machine, so within float noise); a resume that would mix settings is refused."""
    from diffusers import UNet2DConditionModel

    from sleuth.tools.backends.toyworld.diffusion.train import Trainer, TrainSettings

    full, _ = trained
    base, resumed = tmp_path / "base", tmp_path / "resumed"
    Trainer(world, TrainSettings(**{**TINY, "offset_steps": 0})).run(base)
    seen: list[tuple[str, int, int]] = []
    record = Trainer(world, TrainSettings(**TINY), progress=lambda t, d, n: seen.append((t, d, n))).run(
        resumed, resume=base)
    assert {t for t, _, _ in seen} == {"fine-tuning the UNet with offset noise"}
    assert set(record["seconds"]) == {"clip", "vae", "unet", "offset"} and record["resumed"]["from"] == str(base)
    unets = [UNet2DConditionModel.from_pretrained(d / "toyworld-sd" / "unet", local_files_only=True)
             for d in (base, resumed, full)]
    before, after, reference = (dict(u.named_parameters()) for u in unets)
    assert max((after[k] - reference[k]).abs().max().item() for k in after) < 1e-5
    assert max((after[k] - before[k]).abs().max().item() for k in after) > 1e-4  # the stage changed the weights
    # What was not retrained is the earlier run's files, byte for byte; the UNet's config names no local path.
    for f in ("toyworld-clip/model.safetensors", "toyworld-clip/tokenizer_config.json", "toyworld-sd/vae/config.json",
              "toyworld-sd/unet/config.json"):
        assert (resumed / f).read_bytes() == (base / f).read_bytes(), f
    with pytest.raises(ValueError, match="already had the offset stage"):
        Trainer(world, TrainSettings(**TINY)).run(tmp_path / "again", resume=resumed)
    with pytest.raises(ValueError, match=r"other settings \(unet_steps\)"):
        Trainer(world, TrainSettings(**{**TINY, "unet_steps": 4})).run(tmp_path / "mixed", resume=base)
    with pytest.raises(ValueError, match="no toyworld-sd/training.json"):
        Trainer(world, TrainSettings(**TINY)).run(tmp_path / "x", resume=tmp_path / "nothing")
    assert not (tmp_path / "mixed").exists()


def test_specs_load_the_folders(trained: tuple[Path, dict[str, Any]], world: Any) -> None:
    from sleuth.tools.backends.clip import ClipEmbedder, HFClipModel
    from sleuth.tools.backends.diffusers_generator import DiffusersGenerator
    from sleuth.tools.backends.specs import BackendSpecs

    out, _ = trained
    sd, clip = out / "toyworld-sd", out / "toyworld-clip"
    parts = BackendSpecs(generator=f"diffusers:{sd},steps=2,batch=2", embedder=f"clip:{clip}",
                         editor=f"sd-edit:{sd},steps=2,null_steps=1,self=0.5,clip=on").build_parts(load=True)
    gen, emb = parts["generator"], parts["embedder"]
    assert isinstance(gen, DiffusersGenerator) and isinstance(emb, ClipEmbedder)
    assert isinstance(emb.model, HFClipModel) and emb.id.startswith(f"clip:{clip}@")
    g = gen.generate(["a realistic photograph of a cat", "a realistic photograph of a dog"], [1, 2])
    assert [x.image.shape for x in g] == [(64, 64, 3)] * 2
    again = gen.generate(["a realistic photograph of a dog"], [2])[0]
    assert np.abs(again.image.astype(int) - g[1].image.astype(int)).max() <= 2  # batch-independent, per-image seed
    e = emb.embed([x.image for x in g])
    assert e.shape == (2, 128) and np.allclose(np.linalg.norm(e, axis=1), 1, atol=1e-5)
    t = emb.model.encode_texts(["a cat", "a dog in the snow"])
    assert t.shape == (2, 128) and np.allclose(np.linalg.norm(t, axis=1), 1, atol=1e-5)
    outcome = parts["editor"].edit(g[0], "a realistic photograph of a cat on the grass",
                                   "a realistic photograph of a cat in the snow")
    assert outcome.image.shape == (64, 64, 3) and "clip_image_image" in outcome.scores
    with pytest.raises(BackendError, match="toyworld-clip takes no argument"):
        BackendSpecs(embedder="toyworld-clip:x").build_parts()
    with pytest.raises(BackendError, match="no config.json"):
        BackendSpecs(embedder=f"clip:{sd}").build_parts()


def test_diffusion_check_on_the_tiny_model(trained: tuple[Path, dict[str, Any]], world: Any) -> None:
    from sleuth.tools.backends.specs import BackendSpecs
    from sleuth.tools.backends.toyworld.captioner import ToyCaptioner
    from sleuth.tools.backends.toyworld.classifier import ToyClassifier
    from sleuth.tools.backends.toyworld.diffusion.check import DiffusionCheck, psnr

    out, _ = trained
    sd = out / "toyworld-sd"
    parts = BackendSpecs(generator=f"diffusers:{sd},steps=2,batch=8",
                         editor=f"sd-edit:{sd},steps=2,null_steps=1,self=0.5").build_parts(load=True)
    classifier = ToyClassifier(world)
    check = DiffusionCheck(world, parts["generator"], parts["editor"], classifier, ToyCaptioner(world), classifier,
                           reconstruction_steps=3)
    report = check.run(n=24, attribute_n=8, inversions=2, swaps=2)
    acc = report["class_accuracy"]
    assert acc["overall"]["n"] == 24 and sum(r["n"] for r in acc["by_class"].values()) == 24
    assert 0 <= acc["overall"]["low"] <= acc["overall"]["rate"] <= acc["overall"]["high"] <= 1
    assert set(report["attribute_adherence"]) == {"background", "colour", "lighting", "domain"}
    # Reconstructions at the steps asked for; the editor itself (the swaps) keeps its own 2.
    assert report["null_text_reconstruction"]["n"] == 2 and report["null_text_reconstruction"]["steps"] == 3
    assert parts["editor"].inversion_settings.steps == 2
    assert report["background_swaps"]["success"]["n"] == 2
    a = np.zeros((4, 4, 3), np.uint8)
    assert psnr(a, a) == float("inf") and psnr(a, a + 255) == pytest.approx(0.0)
    assert psnr(a, a + 1) == pytest.approx(48.13, abs=0.01)


@pytest.mark.e2e
def test_world_check_diffusion_command(trained: tuple[Path, dict[str, Any]],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from sleuth.agent.cli import main

    sd = trained[0] / "toyworld-sd"
    code = main(["world", "check", "--diffusion", "--generator", f"diffusers:{sd},steps=2,batch=12",
                 "--editor", f"sd-edit:{sd},steps=2,null_steps=1,self=0.5", "--n", "12", "--attribute-n", "4",
                 "--inversions", "1", "--inversion-steps", "2", "--swaps", "1", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["class_accuracy"]["overall"]["n"] == 12
    assert report["null_text_reconstruction"]["autoencoder_psnr_mean"] > 0
    assert report["null_text_reconstruction"]["steps"] == 2
    assert main(["world", "check", "--diffusion", "--n", "5"]) == 2
    assert "--n must be between 12" in capsys.readouterr().err



@pytest.mark.e2e
def test_the_packaged_models_draw_the_world(world: Any) -> None:
    """The shipped toyworld-sd, through the specs, draws classes the world's classifier recognises and the
    backgrounds its prompts name; toyworld-clip matches those images to their class.

    Small samples at bounds far below the measured rates (docs/toyworld_sd.md), so another CPU's rounding cannot
    fail them; random weights score about 1 in 12 on classes and never read a background on cue."""
    from sleuth.tools.backends.specs import BackendSpecs
    from sleuth.tools.backends.toyworld.captioner import ToyCaptioner
    from sleuth.tools.backends.toyworld.classifier import ToyClassifier
    from sleuth.tools.backends.toyworld.diffusion.check import _top1

    parts = BackendSpecs(generator="diffusers:toyworld-sd", embedder="toyworld-clip").build_parts(load=True)
    gen = parts["generator"]
    assert gen.num_inference_steps == 25 and gen.guidance_scale == 7.5
    labels = [c.name for c in world.classes] * 4
    images = [g.image for g in gen.generate([f"a realistic photograph of a {lab}" for lab in labels],
                                            list(range(len(labels))))]
    hits = sum(p == lab for p, lab in zip(_top1(ToyClassifier(world), images), labels, strict=True))
    assert hits >= 0.25 * len(labels), f"{hits}/{len(labels)}"
    # The prompted background is drawn (the captioner reads grass, water, indoors in 14-16 of 16 images, and snow,
    # near white, which only the offset-noise stage lets the model draw, in 28 of 32).
    places = {"grass": "on the grass", "water": "in the water", "indoor": "indoors", "snow": "in the snow"}
    captioner = ToyCaptioner(world)
    for bg, where in places.items():
        drawn = gen.generate([f"a realistic photograph of a dog {where}"] * 12, list(range(12)))
        reads = [p["background"] for p in captioner.predict([g.image for g in drawn])]
        assert reads.count(bg) >= 6, (bg, reads)
    # toyworld-clip ranks the right class prompt first for many of the class images.
    model = parts["embedder"].model
    sims = model.encode_images(images) @ model.encode_texts([f"a photo of a {c.name}" for c in world.classes]).T
    names = [c.name for c in world.classes]
    right = sum(names[int(i)] == lab for i, lab in zip(sims.argmax(axis=1), labels, strict=True))
    assert right >= 0.3 * len(labels), f"{right}/{len(labels)}"


@pytest.mark.e2e
def test_the_packaged_editor_keeps_the_class_region(world: Any) -> None:
    """``sd-edit:toyworld-sd`` keeps the class region by default, and on renders that region covers the object.

    The object's pixels are those a background change leaves alone (the same scene rendered on grass and on snow).
    Measured on 24 renders of 4 classes: the region holds 96% of object pixels and 29% of background pixels; the
    bounds leave a wide margin."""
    import dataclasses

    from sleuth.tools.backends.sd_edit.ddim import encode_image
    from sleuth.tools.backends.sd_edit.regions import class_region
    from sleuth.tools.backends.specs import BackendSpecs
    from sleuth.tools.backends.toyworld.parser import ParsedPrompt, sample_scenes
    from sleuth.tools.backends.toyworld.render import Renderer

    editor = BackendSpecs(editor="sd-edit:toyworld-sd").build_parts()["editor"]
    assert editor.settings.keep == "class" and editor.inversion_settings.steps == 25  # its generator's steps
    other = BackendSpecs(editor="sd-edit:toyworld-sd,keep=none,steps=50").build_parts()["editor"]
    assert other.settings.keep == "none" and other.inversion_settings.steps == 50
    renderer = Renderer(world, 64)
    on_object, on_background = [], []
    for label in ("cat", "dog", "goldfish", "bee"):
        scene = sample_scenes(ParsedPrompt({"background": ["grass"]}, [], label), [0], world)[0]
        grass, snow = renderer.render([scene, dataclasses.replace(scene, background="snow")])
        obj = np.abs(grass.astype(int) - snow.astype(int)).sum(-1) == 0
        z0 = encode_image(editor.pipe, grass, (64, 64))
        region = class_region(editor.pipe, z0, f"a realistic photograph of a {label} on the grass", label, 7.5)
        assert region is not None
        up = np.kron(region[0, 0].numpy(), np.ones((4, 4))) > 0
        on_object.append(up[obj].mean())
        on_background.append(up[~obj].mean())
    assert np.mean(on_object) > 0.7 and np.mean(on_background) < 0.5
    assert np.mean(on_object) - np.mean(on_background) > 0.3


def test_weights_fingerprint_follows_contents_not_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model's tag (in backend ids, cache keys and transcripts) is the same in every copy of the same weights, so
    a run on the packaged models replays on another machine, and changes when any byte of a small file does."""
    import os
    import shutil

    from sleuth.tools.backends import loading

    folder = packaged("toyworld-clip")
    assert folder is not None
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    for f in copy.rglob("*"):
        os.utime(f, (1, 1))
    assert loading.fingerprint(copy) == loading.fingerprint(folder)
    config = copy / "config.json"
    config.write_text(config.read_text().replace("}", " }", 1))
    assert loading.fingerprint(copy) != loading.fingerprint(folder)
    # Large files: their ends are read, not their middles.
    monkeypatch.setattr(loading, "FINGERPRINT_WHOLE", 100)
    monkeypatch.setattr(loading, "FINGERPRINT_ENDS", 10)
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(1000))
    tag = loading.fingerprint(big)
    big.write_bytes(bytes(500) + b"x" + bytes(499))
    assert loading.fingerprint(big) == tag
    big.write_bytes(b"x" + bytes(999))
    assert loading.fingerprint(big) != tag
