"""DiffusersGenerator on a tiny random-weight Stable Diffusion pipeline saved to disk and loaded back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sleuth.tools.backends.base import BackendError
from sleuth.tools.backends.diffusers_generator import DiffusersGenerator
from sleuth.tools.backends.specs import BackendSpecs, UnavailableEditor, make_backends, parse_spec
from tests.test_real_builders import save_open_clip_folder, save_sd_pipeline

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def saved_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_sd_pipeline(tmp_path_factory.mktemp("sd"))


PROMPTS = ["a realistic photograph of a tabby cat", "a realistic photograph of a tabby cat in the snow",
           "a realistic photograph of a fly on a flower", "a realistic photograph of a tabby cat"]
SEEDS = [11, 12, 13, 14]


def test_same_image_whatever_the_batch_size(saved_pipeline: Path) -> None:
    four = DiffusersGenerator(str(saved_pipeline), num_inference_steps=2, height=32, width=32, batch_size=4)
    one = DiffusersGenerator(str(saved_pipeline), num_inference_steps=2, height=32, width=32, batch_size=1)
    a = four.generate(PROMPTS, SEEDS)
    b = one.generate(PROMPTS, SEEDS)
    assert [g.image.shape for g in a] == [(32, 32, 3)] * 4 and a[0].image.dtype == np.uint8
    diff = max(int(np.abs(x.image.astype(int) - y.image.astype(int)).max()) for x, y in zip(a, b))
    assert diff <= 1
    assert all(g.valid and g.unrendered == () for g in a)
    assert [(g.prompt, g.seed) for g in a] == list(zip(PROMPTS, SEEDS))
    # Seeds and prompts matter: images 0 and 3 share the prompt, not the seed.
    assert np.abs(a[0].image.astype(int) - a[3].image.astype(int)).mean() > 1
    again = four.generate(PROMPTS[:1], SEEDS[:1])[0].image
    assert np.array_equal(again, a[0].image)


def test_seeds_differing_above_32_bits_draw_different_images(saved_pipeline: Path) -> None:
    """Confirmation seeds sit 2**40 above discovery seeds; torch's CPU generator keeps only a seed's low 32 bits,
    so the initial noise must come from the whole seed or confirmation would re-run discovery's images."""
    from sleuth.tools.backends.diffusers_generator import initial_latents, seed32

    gen = DiffusersGenerator(str(saved_pipeline), num_inference_steps=2, height=32, width=32, batch_size=4)
    low = gen.generate(PROMPTS[:2], [11, 12])
    high = gen.generate(PROMPTS[:2], [11 + 2**40, 12 + 2**40])
    for a, b in zip(low, high):
        assert np.abs(a.image.astype(int) - b.image.astype(int)).mean() > 1
    latents = initial_latents(gen.pipe, [11, 11 + 2**40], 32, 32)
    factor = gen.pipe.vae_scale_factor
    assert tuple(latents.shape) == (2, gen.pipe.unet.config.in_channels, 32 // factor, 32 // factor)
    expected = np.random.default_rng(11).standard_normal(tuple(latents.shape[1:]), dtype=np.float32)
    assert np.allclose(latents[0].numpy(), expected, atol=1e-6)
    assert float((latents[0] - latents[1]).abs().mean()) > 0.5
    assert seed32(11) != seed32(11 + 2**40) and 0 <= seed32(2**64 + 5) < 2**32
    assert ":noise=np64" in gen.id


class FlagSecond:
    """A stand-in safety checker: blacks out and flags the second image of every call."""

    def __call__(self, images, clip_input):
        flags = [i == 1 for i in range(len(images))]
        images = images.clone()
        images[1] = -1.0  # black once mapped from [-1, 1] to [0, 1]
        return images, flags


def test_safety_checker_blackout_is_invalid(saved_pipeline: Path) -> None:
    from diffusers import DiffusionPipeline, StableDiffusionPipeline
    from transformers import CLIPImageProcessor

    base = DiffusionPipeline.from_pretrained(saved_pipeline, local_files_only=True)
    components = {**base.components, "safety_checker": FlagSecond(),
                  "feature_extractor": CLIPImageProcessor(size={"shortest_edge": 32},
                                                          crop_size={"height": 32, "width": 32})}
    pipe = StableDiffusionPipeline(**components, requires_safety_checker=False)
    gen = DiffusersGenerator(pipeline=pipe, num_inference_steps=2, height=32, width=32, batch_size=4)
    out = gen.generate(PROMPTS, SEEDS)
    assert [g.valid for g in out] == [True, False, True, True]
    assert out[1].meta == {"nsfw": True} and out[1].image.max() == 0
    assert out[0].image.max() > 0


@pytest.fixture()
def fake_toyworld(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """toyworld's loader replaced by stand-ins; returns the calls it gets."""
    import sys
    import types

    from sleuth.tools.backends.base import Backends, LabelSpace

    class Toy:
        def __init__(self, id: str) -> None:
            self.id = id
            self.labels = LabelSpace(("cat", "tabby cat", "dog"))

    calls: list[tuple] = []

    def load_backends(world=None, *, size=64, device="cpu", progress=None):
        calls.append((world, device, progress))
        return Backends(Toy("toy-gen"), Toy("toy-clf"), Toy("toy-cap"), Toy("toy-emb"), Toy("toy-edit"),
                        class_prompt="a toy {label}")

    fake = types.SimpleNamespace(load_backends=load_backends)
    monkeypatch.setitem(sys.modules, "sleuth.tools.backends.toyworld", fake)
    return calls


def test_generator_spec_and_real_editor(saved_pipeline: Path, fake_toyworld: list[tuple]) -> None:
    spec = parse_spec(f"diffusers:{saved_pipeline},steps=1,guidance=0", "generator")
    assert spec.option("steps", cast=int) == 1
    b = BackendSpecs(generator=f"diffusers:{saved_pipeline},steps=1,guidance=0,height=32,width=32,batch=2,"
                               "negative=blurry").build_parts()
    gen = b["generator"]
    assert isinstance(gen, DiffusersGenerator)
    assert (gen.num_inference_steps, gen.guidance_scale, gen.height, gen.batch_size) == (1, 0.0, 32, 2)
    assert gen.negative_prompt == "blurry" and gen._pipe is None  # loads on first use
    assert gen.id.startswith(f"diffusers:{saved_pipeline}@") and ":steps=1:cfg=0:noise=np64:size=32x32:" in gen.id
    assert isinstance(b["editor"], UnavailableEditor)
    with pytest.raises(BackendError, match="sd-edit:PATH"):
        make_backends(generator=f"diffusers:{saved_pipeline},steps=1").editor.edit(None, "a", "b")  # type: ignore
    loaded = BackendSpecs(generator=f"diffusers:{saved_pipeline},steps=1").build_parts(load=True)["generator"]
    assert loaded._pipe is not None and type(loaded._pipe).__name__ == "StableDiffusionPipeline"
    with pytest.raises(BackendError, match="not found"):
        DiffusersGenerator(str(saved_pipeline / "missing"))
    with pytest.raises(BackendError, match="unknown option.*colour"):
        make_backends(generator=f"diffusers:{saved_pipeline},colour=red")
    with pytest.raises(BackendError, match="at least 1"):
        make_backends(generator=f"diffusers:{saved_pipeline},steps=0")


def test_ids_change_with_what_changes_the_images(saved_pipeline: Path, tmp_path: Path) -> None:
    import shutil

    def gen_id(folder: Path, **kw: object) -> str:
        return DiffusersGenerator(str(folder), num_inference_steps=2, **kw).id  # type: ignore[arg-type]

    base = gen_id(saved_pipeline)
    assert base == gen_id(saved_pipeline)
    assert len({base, gen_id(saved_pipeline, height=64), gen_id(saved_pipeline, guidance_scale=1.0),
                gen_id(saved_pipeline, negative_prompt="x")}) == 4
    copy = shutil.copytree(saved_pipeline, tmp_path / "copy")
    before = gen_id(copy)
    (copy / "unet" / "config.json").write_text((copy / "unet" / "config.json").read_text() + " ")
    assert gen_id(copy) != before  # weights or configs replaced in place: cached predictions are not reused


def test_textual_inversion_class_tokens(saved_pipeline: Path, tmp_path: Path) -> None:
    torch.manual_seed(1)
    # Dataset Interfaces' format {"placeholder": (token, embedding)} and diffusers' {token: embedding}.
    torch.save({"placeholder": ("<tabby-token>", torch.randn(32))}, tmp_path / "tabby.bin")
    torch.save({"<tiger-token>": torch.randn(1, 32)}, tmp_path / "tiger.bin")
    gen = DiffusersGenerator(str(saved_pipeline), num_inference_steps=1, guidance_scale=0, height=32, width=32,
                             class_tokens={"tabby cat": str(tmp_path / "tabby.bin"),
                                           "tiger cat": str(tmp_path / "tiger.bin")})
    plain = DiffusersGenerator(str(saved_pipeline), num_inference_steps=1, guidance_scale=0, height=32, width=32)
    a = gen.generate(PROMPTS[:1], SEEDS[:1])[0]
    b = plain.generate(PROMPTS[:1], SEEDS[:1])[0]
    assert gen.prompt_with_token("A photo of a Tabby Cat in the snow") == "A photo of a <tabby-token> in the snow"
    assert gen.prompt_with_token("a tiger cat, not a tiger") == "a <tiger-token>, not a tiger"
    vocab = gen.pipe.tokenizer.get_vocab()
    assert {"<tabby-token>", "<tiger-token>"} <= set(vocab)
    # The learned vector really is the token's embedding in the text encoder.
    table = gen.pipe.text_encoder.get_input_embeddings().weight
    torch.manual_seed(1)
    assert torch.allclose(table[vocab["<tabby-token>"]], torch.randn(32))
    assert a.prompt == PROMPTS[0]  # the user's prompt is kept, the token is an encoding detail
    assert np.abs(a.image.astype(int) - b.image.astype(int)).max() > 0
    assert ":token=tabby cat=tabby.bin@" in gen.id and gen.id != plain.id
    with pytest.raises(BackendError, match="class token file not found"):
        DiffusersGenerator(str(saved_pipeline), class_tokens={"tabby cat": str(tmp_path / "none.bin")})


def test_make_backends_mixes_real_and_toyworld_parts(saved_pipeline: Path, fake_toyworld: list[tuple]) -> None:
    ticks: list[tuple[str, int, int]] = []
    toy = make_backends(world="w.yaml", progress=lambda *a: ticks.append(a))
    assert toy.ids == {"generator": "toy-gen", "classifier": "toy-clf", "captioner": "toy-cap",
                       "embedder": "toy-emb", "editor": "toy-edit"}
    assert toy.class_prompt == "a toy {label}"
    assert ticks == [("loading models", 0, 1), ("loading models", 1, 1)]
    assert fake_toyworld[0][2] is not None  # toyworld gets the progress callback (it may train)
    mixed = BackendSpecs(generator=f"diffusers:{saved_pipeline},steps=2", world="w.yaml").build_parts()
    assert isinstance(mixed["generator"], DiffusersGenerator) and mixed["classifier"].id == "toy-clf"
    assert isinstance(mixed["editor"], UnavailableEditor) and "class_prompt" not in mixed
    assert make_backends(generator=f"diffusers:{saved_pipeline},steps=2", world="w.yaml").class_prompt == \
        "a realistic photograph of a {label}"
    assert [c[:2] for c in fake_toyworld] == [("w.yaml", "cpu")] * 3  # one load per build above
    with pytest.raises(BackendError, match="need a diffusers generator"):
        make_backends(class_tokens={"cat": "x.bin"})
    with pytest.raises(BackendError, match="CLIP embedder"):
        make_backends(generator=f"diffusers:{saved_pipeline}", clip_checks="on")


def test_clip_checks_on_generated_images(saved_pipeline: Path, tmp_path: Path, fake_toyworld: list[tuple]) -> None:
    from sleuth.tools.backends.specs import BackendSpecs

    folder = save_open_clip_folder(tmp_path / "clip")
    specs = BackendSpecs(generator=f"diffusers:{saved_pipeline},steps=1,guidance=0,height=32,width=32",
                         embedder=f"open_clip:{folder}", clip_checks="on", clip_class_top_k=1,
                         clip_shift_threshold=1.01)
    b = specs.build_parts()
    gen = b["generator"]
    assert gen.checks.model is b["embedder"].model  # one CLIP for clustering and checking
    assert (gen.checks.class_top_k, gen.checks.shift_threshold) == (1, 1.01)
    assert gen.checks.class_names == ["cat", "tabby cat", "dog"]  # the classifier's label space
    assert ":checks=open_clip:" in gen.id
    prompts = ["a realistic photograph of a tabby cat in the snow", "a realistic photograph of a dog"] * 3
    out = gen.generate(prompts, list(range(6)))
    ranks = [g.meta["clip"]["class_rank"] for g in out]
    assert [g.meta["clip"]["class"] for g in out] == ["tabby cat", "dog"] * 3
    assert set(ranks) <= {1, 2, 3} and 1 in ranks and max(ranks) > 1  # both outcomes occur (measured: 1,3,2,3,1,3)
    assert [g.valid for g in out] == [r == 1 for r in ranks]  # the class not CLIP's first choice: invalid
    # No similarity reaches 1.01: the shift is reported unrendered wherever the class was seen.
    assert [g.unrendered for g in out if g.valid and "snow" in g.prompt] == \
        [("in the snow",)] * sum(1 for g, r in zip(out, ranks) if r == 1 and "snow" in g.prompt)
    assert all(-1 <= g.meta["clip"]["class_similarity"] <= 1 for g in out)
