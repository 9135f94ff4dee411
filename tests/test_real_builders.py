"""Tiny random-weight real models built from configs and saved the way users' checkpoints are laid out.

Used by the real-backend tests and the end-to-end investigation on real backends; nothing is downloaded: the CLIP
tokenizer is written from the BPE vocabulary open_clip ships, the BLIP tokenizer from a small word list.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import torch

IMAGENET = {"tabby cat": 281, "tiger cat": 282, "cougar": 286, "lynx": 287, "snow leopard": 289}

BLIP_WORDS = ("a realistic photograph of tabby cat dog fly flower snow grass net sitting on in the with red blue "
              "small large green water bench sleeping window . ,").split()


def clip_tokenizer(folder: Path):
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


def tiny_sd_pipeline(tmp: Path):
    """Stable Diffusion's architecture at toy size: 8/16-channel UNet and VAE, a 2-layer CLIP text encoder."""
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


def save_sd_pipeline(tmp: Path) -> Path:
    tiny_sd_pipeline(tmp).save_pretrained(tmp / "pipe")
    return tmp / "pipe"


def save_blip(tmp: Path, words: tuple[str, ...] = ()) -> Path:
    """A 2-layer BLIP captioner with a BERT word-level tokenizer over ``BLIP_WORDS`` (and ``words``), saved as a
    model folder."""
    from transformers import (
        BertTokenizerFast,
        BlipConfig,
        BlipForConditionalGeneration,
        BlipImageProcessor,
        BlipProcessor,
        BlipTextConfig,
        BlipVisionConfig,
    )

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", *dict.fromkeys([*BLIP_WORDS, *words])]
    (tmp / "tok").mkdir(parents=True, exist_ok=True)
    (tmp / "tok" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast.from_pretrained(tmp / "tok", bos_token="[DEC]", do_lower_case=True)
    assert len(tokenizer) == len(vocab)
    processor = BlipProcessor(image_processor=BlipImageProcessor(size={"height": 32, "width": 32}),
                              tokenizer=tokenizer)
    text = BlipTextConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                          num_attention_heads=4, max_position_embeddings=64, encoder_hidden_size=32,
                          bos_token_id=5, sep_token_id=3, pad_token_id=0, eos_token_id=3)
    vision = BlipVisionConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                              image_size=32, patch_size=8, initializer_range=0.02)
    torch.manual_seed(0)
    model = BlipForConditionalGeneration(BlipConfig(text_config=text.to_dict(), vision_config=vision.to_dict()))
    model.save_pretrained(tmp / "blip")
    processor.save_pretrained(tmp / "blip")
    return tmp / "blip"


def byte_level_bpe(words: tuple[str, ...]):
    """An OPT-style byte-level BPE tokenizer (GPT-2's algorithm, BOS ``</s>`` first) whose merges make each word a
    single token after a space ("Ġsitting") and leave it in single bytes at the start of a text, as a real
    vocabulary often does: the same word is tokenised differently in context."""
    from transformers import GPT2Tokenizer

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    chars = [chr(b) for b in printable] + [chr(256 + i) for i in range(len(others))]  # GPT-2's byte alphabet
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, **{c: 4 + i for i, c in enumerate(chars)}}
    merges: list[tuple[str, str]] = []
    for w in words:
        piece = "Ġ"
        for ch in w:
            if (piece, ch) not in merges:
                merges.append((piece, ch))
            piece += ch
            vocab.setdefault(piece, len(vocab))
    return GPT2Tokenizer(vocab=vocab, merges=merges, bos_token="</s>", eos_token="</s>", pad_token="<pad>",
                         unk_token="<unk>", add_bos_token=True)


def save_blip2(tmp: Path) -> Path:
    """A tiny BLIP-2 (ViT, Q-Former with 4 queries, 2-layer OPT) with a byte-level BPE tokenizer over ``BLIP_WORDS``,
    saved as a model folder; the processor puts the image tokens first, as transformers' own does."""
    from transformers import (
        Blip2Config,
        Blip2ForConditionalGeneration,
        Blip2Processor,
        Blip2QFormerConfig,
        Blip2VisionConfig,
        BlipImageProcessor,
        OPTConfig,
    )

    tokenizer = byte_level_bpe(tuple(w for w in BLIP_WORDS if w.isalpha()))
    processor = Blip2Processor(image_processor=BlipImageProcessor(size={"height": 32, "width": 32}),
                               tokenizer=tokenizer, num_query_tokens=4)  # adds the <image> token
    vision = Blip2VisionConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4,
                               image_size=32, patch_size=8)
    qformer = Blip2QFormerConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4,
                                 encoder_hidden_size=32, vocab_size=len(tokenizer))
    text = OPTConfig(vocab_size=len(tokenizer), hidden_size=32, ffn_dim=37, num_hidden_layers=2, num_attention_heads=4,
                     max_position_embeddings=64, word_embed_proj_dim=32, bos_token_id=2, eos_token_id=2,
                     pad_token_id=1)
    config = Blip2Config(vision_config=vision.to_dict(), qformer_config=qformer.to_dict(), text_config=text.to_dict(),
                         num_query_tokens=4, image_token_index=tokenizer.convert_tokens_to_ids("<image>"))
    torch.manual_seed(0)
    Blip2ForConditionalGeneration(config).save_pretrained(tmp / "blip2")
    processor.save_pretrained(tmp / "blip2")
    return tmp / "blip2"


TINY_CLIP = {"embed_dim": 16,
             "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
             "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}


def save_open_clip_folder(folder: Path) -> Path:
    """A tiny CLIP in open_clip's folder layout (open_clip_config.json + open_clip_model.safetensors)."""
    import open_clip
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CLIP, "preprocess_cfg": {}}))
    torch.manual_seed(0)
    model = open_clip.CLIP(**TINY_CLIP)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "open_clip_model.safetensors"))
    return folder


def save_imagenet_mobilenet(path: Path, *, favoured: dict[str, float] | None = None) -> Path:
    """A random-weight torchvision MobileNetV3-Small with 1000 outputs (so: the ImageNet label space).

    Random initialisation makes logits vanish, so batch-norm statistics are first set on noise images, and the
    head is scaled; ``favoured`` adds a bias to some ImageNet classes so the top-3 hover among them, which makes the
    "parent" criterion fail on a fraction of images instead of on all or none.
    """
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(num_classes=1000)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the calibration batch
    model.train()
    with torch.no_grad():
        model(torch.randn(16, 3, 224, 224, generator=torch.Generator().manual_seed(0)))
    head = model.classifier[-1]
    with torch.no_grad():
        head.weight.mul_(100.0)
        for name, bias in (favoured or {}).items():
            head.bias[IMAGENET[name]] += bias
    model.eval()
    torch.save(model.state_dict(), path)
    return path


def noise_images(n: int, size: int = 32, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(n)]


def test_clip_tokenizer_matches_open_clip(tmp_path: Path) -> None:
    import open_clip

    text = "a realistic photograph of a tabby cat in the snow"
    ids = clip_tokenizer(tmp_path)(text)["input_ids"]
    assert ids == [i for i in open_clip.tokenize([text])[0].tolist() if i]
