"""`sleuth mitigate`: retraining a classifier's head on generated images of its findings, measured before and after on
fresh seeds; the head retraining of real architectures (torchvision, Hugging Face) on tiny random-weight models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from sleuth.agent.cli import main
from sleuth.agent.errors import UsageError
from sleuth.agent.mitigate import (
    EVAL_OFFSET,
    SEEDS_PER_MITIGATION,
    TRAIN_OFFSET,
    MitigateConfig,
    Mitigation,
    MitigationResult,
    find_runs,
    load_run,
    mode_sentences,
)
from sleuth.agent.transcript import read_transcript
from sleuth.tools.backends.base import BackendError
from sleuth.tools.backends.heads import Group, LinearHead, fit, reload, tail_logits
from sleuth.tools.backends.specs import parse_spec
from sleuth.tools.defaults import CONFIRMATION_DRAWS
from sleuth.tools.investigation import CONFIRMATION_OFFSET, SEEDS_PER_INVESTIGATION

EXAMPLES = Path(__file__).resolve().parents[1] / "transcripts"
FLY = EXAMPLES / "investigate-fly-s0"
AUDIT = EXAMPLES / "audit-fly-cat"
SMALL = {"n": 200, "id_n": 40, "eval_n": 300, "eval_id_n": 40, "steps": 150, "train": "head"}


def small(**over: object) -> MitigateConfig:
    return MitigateConfig.model_validate({**SMALL, **over})


@pytest.fixture(scope="module")
def fly_result(tmp_path_factory: pytest.TempPathFactory) -> tuple[MitigationResult, Path]:
    out = tmp_path_factory.mktemp("mitigation")
    runs = [load_run(t) for t in find_runs([FLY])]
    cfg = small(findings=["f4"])
    return Mitigation(runs, cfg).run(out), out


def test_seed_spaces_are_disjoint_from_every_investigation() -> None:
    # investigations: discovery [0, 2^40), confirmation draw d [2^40 (1 + d), 2^40 (2 + d)); 65536 seeds of 2^24
    # each fit inside each of them, and the last draw ends below the mitigation's training seeds
    assert 65536 * SEEDS_PER_INVESTIGATION <= CONFIRMATION_OFFSET
    assert CONFIRMATION_OFFSET * (1 + CONFIRMATION_DRAWS) <= TRAIN_OFFSET
    assert TRAIN_OFFSET + 65536 * SEEDS_PER_MITIGATION <= EVAL_OFFSET
    assert EVAL_OFFSET + 65536 * SEEDS_PER_MITIGATION < 1 << 63  # a signed 64-bit seed


def test_mode_sentences() -> None:
    cat = "a realistic photograph of a cat"
    assert mode_sentences(cat + ". it is in the snow.", cat) == ["it is in the snow"]
    assert mode_sentences("a realistic photograph of a cat in the snow.", cat) == \
        ["a realistic photograph of a cat in the snow."]
    assert mode_sentences("a pencil sketch of a cat", cat) == ["a pencil sketch of a cat"]


@pytest.mark.e2e
def test_a_mitigated_finding_improves_on_fresh_seeds_and_the_weights_load_again(
        fly_result: tuple[MitigationResult, Path]) -> None:
    result, out = fly_result
    # evaluation: five findings and the class prompt, 300 fresh images each, and 12 classes of 40 for accuracy
    assert result.images == {"training": 12 * 40 + 200, "evaluation": 5 * 300 + 300 + 12 * 40}
    trained = [o for o in result.findings if o.mitigated_here]
    assert [(o.finding_id, o.caption) for o in trained] == [
        ("f4", "a realistic photograph of a fly next to a potted plant.")]
    flower = trained[0]
    assert flower.generated == 200 and 0 < flower.training_images <= 200
    assert flower.rates.before.n == flower.rates.after.n == 300
    # the flower finding is a strong shortcut: its failures on fresh images must drop, and significantly
    assert flower.rates.after.k < flower.rates.before.k / 2
    assert flower.rates.fixed > flower.rates.broken
    assert flower.rates.adjusted_p_better is not None and flower.rates.adjusted_p_better < 0.05
    # its verdict follows the rule: significant improvement and non-inferior accuracy
    assert flower.verdict == ("mitigated" if result.accuracy.test.shown else "not shown")
    assert result.effective == (flower.verdict == "mitigated")
    # every other finding of the run is measured too, and only tested for harm
    others = [o for o in result.findings if not o.mitigated_here]
    assert len(others) == 4 and all(o.rates.adjusted_p_better is None for o in others)
    assert all(o.rates.adjusted_p_worse is not None for o in others)
    assert all(o.verdict in ("unchanged", "worse") for o in others)
    assert [b.label for b in result.baselines] == ["fly"]
    # accuracy: 12 classes of 40 fresh images, paired; the interval is Newcombe's at 90% (one-sided 95%)
    acc = result.accuracy
    assert acc.classes == 12 and acc.test.interval.n == 12 * 40 and acc.test.interval.confidence == pytest.approx(0.9)
    assert acc.test.shown == (acc.test.interval.low > -0.01)
    # the weights: toyworld's format with the world's config hash, loading back to the trained head
    spec = parse_spec(result.classifier_after, "classifier")
    assert spec.kind == "toyworld" and Path(spec.argument) == out / "classifier.safetensors"
    with safe_open(str(out / "classifier.safetensors"), framework="pt") as f:
        meta = f.metadata()
    assert meta["world"] == "default" and meta["mitigated_from"] == result.classifier_before
    assert result.reload_max_abs_diff < 1e-4 and result.trained == "head"
    # only the head changed: the trunk is frozen
    w = _tensors(out / "classifier.safetensors")
    orig = reload("toyworld").net.state_dict()
    assert all(torch.equal(w[f"classifier.{k}"], v) for k, v in orig.items() if not k.startswith("head."))
    assert not torch.equal(w["classifier.head.weight"], orig["head.weight"])


def test_the_mitigated_classifier_is_audited_through_its_spec(fly_result: tuple[MitigationResult, Path],
                                                              tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    result, _ = fly_result
    code = main(["investigate", "--class", "fly", "--classifier", result.classifier_after, "--budget", "400",
                 "--runs", str(tmp_path), "--json", "--quiet"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    started = read_transcript(next(tmp_path.glob("*/transcript.jsonl")))[0]
    assert started.backends["classifier"] != "toyworld-cnn:default:19a40ad9"  # type: ignore[union-attr]
    assert started.backends["classifier"].startswith("toyworld-cnn:default:19a40ad9:classifier.safetensors@")  # type: ignore[union-attr]
    assert summary["class"] == "fly" and summary["images"] <= 400


def test_the_transcript_and_json_are_written(fly_result: tuple[MitigationResult, Path], tmp_path: Path) -> None:
    from sleuth.agent.mitigate import write

    result, _ = fly_result
    path = write(result, tmp_path, "sleuth mitigate x")
    assert MitigationResult.model_validate_json(path.read_text()) == result
    events = read_transcript(tmp_path / "mitigation.jsonl")  # the hash chain is checked
    assert [e.kind for e in events] == ["run_started"] + ["tool_called", "tool_returned"] * 3 + ["run_finished"]
    assert events[-1].n_findings == sum(o.verdict == "mitigated" for o in result.findings)  # type: ignore[union-attr]


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.e2e
def test_block_training_changes_the_last_block_only_and_repeats_exactly(tmp_path: Path) -> None:
    runs = [load_run(t) for t in find_runs([FLY])]
    cfg = small(findings=["f4"], n=60, id_n=12, eval_n=30, eval_id_n=12, steps=20, train="auto")
    result = Mitigation(runs, cfg).run(tmp_path / "a")
    w = _tensors(tmp_path / "a" / "classifier.safetensors")
    orig = reload("toyworld").net.state_dict()
    changed = {k.split(".")[2] if k.startswith("trunk.features.") else k.split(".")[0]
               for k, v in orig.items() if v.dtype.is_floating_point and not torch.equal(w[f"classifier.{k}"], v)}
    assert changed == {"6", "head"}
    assert result.reload_max_abs_diff < 1e-4
    assert result.trained == "block"  # auto: the toyworld CNN retrains its last block too
    # the same settings give the same weights and the same measurements
    again = Mitigation(runs, cfg).run(tmp_path / "b")
    w2 = _tensors(tmp_path / "b" / "classifier.safetensors")
    assert w.keys() == w2.keys() and all(torch.equal(w[k], w2[k]) for k in w)
    assert [o.rates for o in again.findings] == [o.rates for o in result.findings]


def test_the_captioner_filter_keeps_images_that_show_the_mode(tmp_path: Path) -> None:
    """The filter keeps an image when the captioner reads the mode's sentences in it more readily than in the median
    plain image of the class: about half of plain class images pass, nearly all images of a visible mode do."""
    from sleuth.tools.backends.toyworld import load_backends

    b = load_backends()
    prompt = b.prompt_for("fly")
    plain = [g.image for g in b.generator.generate([prompt] * 200, list(range(200)))]
    flower = [g.image for g in b.generator.generate([prompt + ". it is next to a flower."] * 200, list(range(200)))]
    sentence = "it is next to a flower"
    ref = np.median(b.captioner.sentence_loglik(plain[:100], sentence, prompt))
    plain_pass = float(np.mean(b.captioner.sentence_loglik(plain[100:], sentence, prompt) > ref))
    flower_pass = float(np.mean(b.captioner.sentence_loglik(flower, sentence, prompt) > ref))
    assert 0.3 < plain_pass < 0.7
    assert flower_pass > 0.9


def test_choosing_findings_and_bad_input(tmp_path: Path) -> None:
    runs = [load_run(t) for t in find_runs([AUDIT])]
    assert [r.label for r in runs] == ["cat", "fly"]
    with pytest.raises(UsageError, match="several runs: name it as CLASS:f1"):
        Mitigation(runs, small(findings=["f1"]))
    with pytest.raises(UsageError, match="no confirmed finding 'cat:f99'"):
        Mitigation(runs, small(findings=["cat:f99"]))
    assert Mitigation(runs, small(findings=["cat:f1", "fly:f2"])).chosen == {(0, "f1"), (1, "f2")}
    # runs of different classifiers cannot be mitigated together
    other = load_run(FLY / "transcript.jsonl")
    other.backends = other.backends.model_copy(update={"world": "nobugs"})
    with pytest.raises(UsageError, match="different models"):
        Mitigation([runs[0], other], small())
    with pytest.raises(UsageError, match="no such run directory"):
        find_runs([tmp_path / "missing"])
    with pytest.raises(UsageError, match="no transcript.jsonl"):
        find_runs([tmp_path])
    with pytest.raises(ValueError):
        MitigateConfig.model_validate({"lambda": 1.5})


def test_cli_errors_name_the_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["mitigate", str(FLY), "--lambda", "2"]) == 2
    assert "--lambda" in capsys.readouterr().err
    assert main(["mitigate", str(FLY), "--findings", "f42", "--out", str(tmp_path)]) == 2
    assert "no confirmed finding 'f42'" in capsys.readouterr().err


def test_weights_of_another_world_are_refused(fly_result: tuple[MitigationResult, Path], tmp_path: Path) -> None:
    _, out = fly_result
    from sleuth.tools.backends.toyworld.classifier import ToyClassifier
    from sleuth.tools.backends.toyworld.config import load_world

    with pytest.raises(BackendError, match="made for another world config"):
        ToyClassifier(load_world("nobugs"), weights=out / "classifier.safetensors")
    with pytest.raises(BackendError, match="not a file"):
        ToyClassifier(load_world("default"), weights=tmp_path / "none.safetensors")


# -- real architectures, tiny random weights -----------------------------------------------------------------------


def _images(n: int, seed: int, size: int = 40) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(n)]


def _separable(head: LinearHead, n: int = 24) -> list[Group]:
    """Dark images labelled 0, bright ones 1: a head can learn it from almost any features."""
    dark = [np.clip(im // 4, 0, 255).astype(np.uint8) for im in _images(n, 1)]
    bright = [(255 - im // 4).astype(np.uint8) for im in _images(n, 2)]
    x = torch.cat([head.features(dark), head.features(bright)])
    y = torch.tensor([0] * n + [1] * n)
    return [Group(x, y, 1.0)]


def test_torchvision_head_retrains_and_reloads_with_its_labels(tmp_path: Path) -> None:
    import torchvision
    from safetensors.torch import save_file

    from sleuth.tools.backends.specs import make_classifier

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=3).eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "m.safetensors"),
              metadata={"labels": json.dumps(["dark", "bright", "other"])})
    spec_text = f"torchvision:resnet18:{tmp_path / 'm.safetensors'}"
    clf = make_classifier(spec_text)
    assert clf.labels.labels == ("dark", "bright", "other")  # label names carried in the checkpoint
    head = LinearHead(clf, parse_spec(spec_text, "classifier"))
    assert head.head_name == "fc"
    groups = _separable(head)
    before = tail_logits(head.tail(), groups[0].features)
    tail = fit(head.tail(), groups, steps=60, lr=1e-2)
    after = tail_logits(tail, groups[0].features)
    acc = lambda z: float((z.argmax(1) == groups[0].labels.numpy()).mean())  # noqa: E731
    assert acc(after) == 1.0 and acc(after) > acc(before)
    saved = head.save(tail, tmp_path / "out")
    assert saved == f"torchvision:resnet18:{tmp_path / 'out' / 'classifier.safetensors'}"
    again = reload(saved)
    assert again.labels.labels == ("dark", "bright", "other")
    dark = [np.clip(im // 4, 0, 255).astype(np.uint8) for im in _images(24, 1)]
    np.testing.assert_allclose(again.logits(dark), after[:24], atol=1e-4, rtol=1e-4)
    with pytest.raises(BackendError, match="supported for the toyworld classifier"):
        LinearHead(clf, parse_spec(spec_text, "classifier"), train="block")


def test_hf_head_retrains_and_reloads(tmp_path: Path) -> None:
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    from sleuth.tools.backends.specs import make_classifier

    torch.manual_seed(0)
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=64, num_labels=2, id2label={0: "dark", 1: "bright"},
                       label2id={"dark": 0, "bright": 1})
    ViTForImageClassification(config).save_pretrained(tmp_path / "vit")
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path / "vit")
    spec_text = f"hf:{tmp_path / 'vit'}"
    clf = make_classifier(spec_text)
    head = LinearHead(clf, parse_spec(spec_text, "classifier"))
    assert head.head_name == "classifier"
    groups = _separable(head)
    tail = fit(head.tail(), groups, steps=80, lr=2e-2)
    after = tail_logits(tail, groups[0].features)
    assert float((after.argmax(1) == groups[0].labels.numpy()).mean()) == 1.0
    saved = head.save(tail, tmp_path / "out")
    assert saved == f"hf:{tmp_path / 'out' / 'classifier'}"
    again = reload(saved)
    assert again.labels.labels == ("dark", "bright")
    dark = [np.clip(im // 4, 0, 255).astype(np.uint8) for im in _images(24, 1)]
    np.testing.assert_allclose(again.logits(dark), after[:24], atol=1e-4, rtol=1e-4)


def test_a_classifier_without_a_linear_head_is_refused(tmp_path: Path) -> None:
    spec = parse_spec("callable:x:y", "classifier")
    with pytest.raises(BackendError, match="no final linear layer"):
        LinearHead(object(), spec)


@pytest.mark.e2e
def test_mitigate_runs_end_to_end_on_a_real_architecture(tmp_path: Path) -> None:
    """A torchvision architecture whose checkpoint carries toyworld's label names, audited with toyworld images:
    the whole mitigation (data, training, evaluation, weights, reload check) runs through its head."""
    import torchvision
    from safetensors.torch import save_file

    from sleuth.tools.backends.toyworld import load_world

    labels = list(load_world().labels.labels)
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(num_classes=len(labels)).eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "m.safetensors"),
              metadata={"labels": json.dumps(labels)})
    spec_text = f"torchvision:mobilenet_v3_small:{tmp_path / 'm.safetensors'}"
    run = load_run(FLY / "transcript.jsonl")
    run.backends = run.backends.model_copy(update={"classifier": spec_text})
    run.started = run.started.model_copy(update={"backends": {}})
    cfg = small(findings=["f4"], n=16, id_n=2, eval_n=4, eval_id_n=2, steps=10, filter="none")
    result = Mitigation([run], cfg).run(tmp_path / "out")
    assert result.classifier_after == f"torchvision:mobilenet_v3_small:{tmp_path / 'out' / 'classifier.safetensors'}"
    assert result.reload_max_abs_diff < 1e-3
    assert result.accuracy.classes == len(labels)
    shutil.rmtree(tmp_path / "out")


@pytest.mark.e2e
def test_the_report_shows_the_mitigation(fly_result: tuple[MitigationResult, Path], tmp_path: Path) -> None:
    from sleuth.agent.mitigate import write
    from sleuth.agent.report import build_report

    result, _ = fly_result
    write(result, tmp_path / "mitigation", "sleuth mitigate")
    page = build_report(tmp_path / "mitigation")  # the mitigation's folder: its runs are read from where they are
    assert page.count("<h2>Mitigation: ") == 1
    flower = next(o for o in result.findings if o.finding_id == "f4")
    before, after = flower.rates.before, flower.rates.after
    assert f"{before.k}/{before.n}" in page and f"{after.k}/{after.n}" in page
    # the run's own section too
    assert "fly next to a potted plant" in page and "fly" in page.split("<h2>Mitigation")[0]


def test_timm_head_retrains_and_reloads_with_its_labels(tmp_path: Path) -> None:
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    from sleuth.tools.backends.specs import make_classifier

    torch.manual_seed(0)
    model = timm.create_model("test_resnet", pretrained=False, num_classes=2).eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "m.safetensors"),
              metadata={"labels": json.dumps(["dark", "bright"])})
    spec_text = f"timm:test_resnet:{tmp_path / 'm.safetensors'}"
    clf = make_classifier(spec_text)
    assert clf.labels.labels == ("dark", "bright")
    head = LinearHead(clf, parse_spec(spec_text, "classifier"))
    groups = _separable(head)
    tail = fit(head.tail(), groups, steps=80, lr=2e-2)
    after = tail_logits(tail, groups[0].features)
    assert float((after.argmax(1) == groups[0].labels.numpy()).mean()) == 1.0
    saved = head.save(tail, tmp_path / "out")
    assert saved == f"timm:test_resnet:{tmp_path / 'out' / 'classifier.safetensors'}"
    again = reload(saved)
    assert again.labels.labels == ("dark", "bright")
    dark = [np.clip(im // 4, 0, 255).astype(np.uint8) for im in _images(24, 1)]
    np.testing.assert_allclose(again.logits(dark), after[:24], atol=1e-4, rtol=1e-4)


def test_bench_mitigation_asks_the_oracle(fly_result: tuple[MitigationResult, Path],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The oracle's view of the fixture's mitigation (trained on the fly's flower finding only): the planted
    fly-on-a-flower bug falls on the same fresh images; the other bugs are measured too."""
    _, out = fly_result
    assert main(["bench", "mitigation", str(out), "--n", "300", "--n-per-class", "30", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    bugs = {b["name"]: b for b in r["bugs"]}
    assert set(bugs) == {"cat in snow", "fly on a flower", "crayfish in a net", "pencil sketch of a goldfish",
                         "orange dog"}
    flower = bugs["fly on a flower"]
    assert flower["before"]["n"] == flower["after"]["n"] == 300
    assert flower["after"]["k"] < flower["before"]["k"] / 2 and flower["adjusted_p_lower"] < 0.05
    assert r["accuracy_class_prompts"]["n"] == r["accuracy_training_distribution"]["n"] == 12 * 30
    assert main(["bench", "mitigation", str(out / "nothing")]) == 2
