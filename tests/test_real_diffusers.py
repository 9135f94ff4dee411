"""DiffusersGenerator on a tiny random-weight Stable Diffusion pipeline saved to disk and loaded back."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tools.backends.base import BackendError
from tools.backends.diffusers_generator import DiffusersGenerator
from tools.backends.specs import UnavailableEditor, make_backends, parse_spec

torch.set_num_threads(2)


def clip_tokenizer(folder: Path):  # noqa: ANN201 - a CLIPTokenizer
    """A real CLIP BPE tokenizer, written from the vocabulary open_clip ships (no download)."""
    import open_clip
    from transformers import CLIPTokenizer

    bpe = Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz"
    merges = gzip.open(bpe).read().decode("utf-8").split("\n")[1:49152 - 256 - 2 + 1]
    tok = open_clip.tokenizer.SimpleTokenizer()
    specials = {"<start_of_text>": "<|startoftext|>", "<end_of_text>": "<|endoftext|>"}
    vocab = {specials.get(k, k): v for k, v in tok.encoder.items()}
    assert vocab["<|startoftext|>"] == 49406 and vocab["<|endoftext|>"] == 49407
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return CLIPTokenizer.from_pretrained(folder, model_max_length=77)


def tiny_pipeline(tmp: Path):  # noqa: ANN201 - a StableDiffusionPipeline
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(block_out_channels=(8, 16), layers_per_block=1, sample_size=16, in_channels=4,
                                out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
                                norm_num_groups=4, attention_head_dim=4)
    vae = AutoencoderKL(block_out_channels=(8, 16), in_channels=3, out_channels=3, latent_channels=4,
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        norm_num_groups=4)
    text = CLIPTextModel(CLIPTextConfig(bos_token_id=49406, eos_token_id=49407, pad_token_id=49407, hidden_size=32,
                                        intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
                                        vocab_size=49408, max_position_embeddings=77))
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                              set_alpha_to_one=False, steps_offset=1)
    return StableDiffusionPipeline(vae=vae, text_encoder=text, tokenizer=clip_tokenizer(tmp / "tok"), unet=unet,
                                   scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)


@pytest.fixture(scope="module")
def saved_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("sd")
    tiny_pipeline(tmp).save_pretrained(tmp / "pipe")
    return tmp / "pipe"


def test_clip_tokenizer_matches_open_clip(tmp_path: Path) -> None:
    import open_clip

    text = "a realistic photograph of a tabby cat in the snow"
    ids = clip_tokenizer(tmp_path)(text)["input_ids"]
    assert ids == [i for i in open_clip.tokenize([text])[0].tolist() if i]


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


class FlagSecond:
    """A stand-in safety checker: blacks out and flags the second image of every call."""

    def __call__(self, images, clip_input):  # noqa: ANN001, ANN204
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


def test_generator_spec_and_real_editor(saved_pipeline: Path) -> None:
    spec = parse_spec(f"diffusers:{saved_pipeline},steps=1,guidance=0", "generator")
    assert spec.option("steps", cast=int) == 1
    from tools.backends.specs import _generator

    gen = _generator(spec, "cpu", ["tabby cat"])
    assert (gen.num_inference_steps, gen.guidance_scale) == (1, 0.0)
    assert gen._pipe is None  # loads on first use
    with pytest.raises(BackendError, match="sd-edit:PATH"):
        UnavailableEditor().edit(None, "a", "b")  # type: ignore[arg-type]
    with pytest.raises(BackendError, match="not found"):
        DiffusersGenerator(str(saved_pipeline / "missing"))


def test_textual_inversion_class_token(saved_pipeline: Path, tmp_path: Path) -> None:
    torch.manual_seed(1)
    # Dataset Interfaces' format: {"placeholder": (token, embedding)}.
    torch.save({"placeholder": ("<tabby-token>", torch.randn(32))}, tmp_path / "learned_embeds.bin")
    gen = DiffusersGenerator(str(saved_pipeline), num_inference_steps=2, height=32, width=32,
                             class_token=str(tmp_path / "learned_embeds.bin"), class_name="tabby cat")
    plain = DiffusersGenerator(str(saved_pipeline), num_inference_steps=2, height=32, width=32)
    a = gen.generate(PROMPTS[:1], SEEDS[:1])[0]
    b = plain.generate(PROMPTS[:1], SEEDS[:1])[0]
    assert gen.prompt_with_token("A photo of a Tabby Cat in the snow") == "A photo of a <tabby-token> in the snow"
    assert "<tabby-token>" in gen.pipe.tokenizer.get_vocab()
    assert a.prompt == PROMPTS[0]  # the user's prompt is kept, the token is an encoding detail
    assert np.abs(a.image.astype(int) - b.image.astype(int)).max() > 0


def test_make_backends_mixes_real_and_toyworld_parts(saved_pipeline: Path, monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    import sys
    import types

    from tools.backends.base import Backends, LabelSpace, Vocabulary

    class Toy:
        def __init__(self, id: str) -> None:
            self.id = id
            self.labels = LabelSpace(("cat", "dog"))

    calls: list[tuple] = []

    def load_backends(world=None, *, size=64, device="cpu"):  # noqa: ANN001, ANN202
        calls.append((world, device))
        return Backends(Toy("toy-gen"), Toy("toy-clf"), Toy("toy-cap"), Toy("toy-emb"), Toy("toy-edit"),
                        vocabulary=Vocabulary(background=["in the snow"]), class_prompt="a toy {label}")

    monkeypatch.setitem(sys.modules, "tools.backends.toyworld", types.SimpleNamespace(load_backends=load_backends))
    toy = make_backends(world="w.yaml")
    assert toy.ids == {"generator": "toy-gen", "classifier": "toy-clf", "captioner": "toy-cap",
                       "embedder": "toy-emb", "editor": "toy-edit"}
    assert toy.class_prompt == "a toy {label}" and toy.vocabulary.background == ["in the snow"]
    mixed = make_backends(generator=f"diffusers:{saved_pipeline},steps=2", world="w.yaml")
    assert isinstance(mixed.generator, DiffusersGenerator) and mixed.classifier.id == "toy-clf"
    assert isinstance(mixed.editor, UnavailableEditor)
    assert mixed.class_prompt == "a realistic photograph of a {label}" and mixed.vocabulary.background == []
    assert calls == [("w.yaml", "cpu")] * 2
