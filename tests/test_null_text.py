"""Null-text optimisation as the official code runs it: its learning-rate and early-stop schedule, and gradients
that survive half precision (tiny random-weight Stable Diffusion, CPU)."""

from __future__ import annotations

import copy
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from sleuth.tools.backends.sd_edit import InversionSettings, invert
from sleuth.tools.backends.sd_edit.ddim import DDIMSchedule, encode_image, encode_text, unet_out
from sleuth.tools.backends.sd_edit.inversion import StepLoss, null_gradient, null_schedule
from tests.sd_tiny import SIZE, tiny_image, tiny_sd

torch.set_num_threads(1)

PROMPT = "a photo of a cat on the grass"


@pytest.fixture(scope="module")
def pipe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    return tiny_sd(Path(cache.mkdir("sd-tiny")) if cache is not None else tmp_path_factory.mktemp("sd"))


def test_the_official_schedule() -> None:
    s = InversionSettings(steps=50)  # google/prompt-to-prompt: lr 1e-2 * (1 - i / 100), stop at 1e-5 + i * 2e-5
    for i in (0, 1, 25, 49):
        lr, tol = null_schedule(i, 50, s)
        assert lr == pytest.approx(1e-2 * (1 - i / 100), rel=1e-12)
        assert tol == pytest.approx(1e-5 + i * 2e-5, rel=1e-12)
    # Other step counts keep the shape: half the learning rate, 101 times the tolerance, by the end.
    assert null_schedule(5, 10, s) == pytest.approx((0.0075, 1e-5 + 5e-4))
    assert null_schedule(49, 50, s.model_copy(update={"null_tol": 0.0}))[1] == 0.0  # 0: never stop early


def test_the_loop_follows_the_schedule_and_steps_before_it_stops(pipe: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rates: list[float] = []

    class Recording(torch.optim.Adam):
        def __init__(self, params: Any, lr: float) -> None:
            rates.append(lr)
            super().__init__(params, lr=lr)

    monkeypatch.setattr(torch.optim, "Adam", Recording)
    image = tiny_image(pipe, PROMPT, seed=1)
    # A tolerance no loss is above: as in the official loop, each step still takes one Adam step, then stops.
    inv = invert(pipe, image, PROMPT, InversionSettings(steps=4, null_steps=3, null_lr=0.1, null_tol=10.0),
                 (SIZE, SIZE))
    assert rates == pytest.approx([0.1 * (1 - i / 8) for i in range(4)])
    null = encode_text(pipe, [""]).float()
    # Each step starts from the last one's embedding; one Adam step moves an entry by at most the learning rate,
    # and the entries with a clear gradient by just that.
    moved = torch.diff(torch.cat([null[None], inv.nulls]), dim=0).abs().amax(dim=(1, 2, 3))
    assert moved.tolist() == pytest.approx(rates, rel=1e-2)  # Adam's eps (1e-8) takes a little off tiny gradients


def test_gradients_survive_float16(pipe: Any) -> None:
    """Near convergence (loss ~1e-5) the mean-squared error's gradient is ~1e-8 an entry: float16 flushes it to zero
    inside the UNet unless the loss is scaled first."""
    image = tiny_image(pipe, PROMPT, seed=1)
    schedule = DDIMSchedule.from_pipeline(pipe, 10)
    z0 = encode_image(pipe, image, (SIZE, SIZE)).float()
    cond, null = encode_text(pipe, [PROMPT, ""]).float().split(1)
    i = 9
    x = z0 + 0.05 * torch.randn(z0.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        c = unet_out(pipe, x, schedule.timesteps[i], cond)
        u = unet_out(pipe, x, schedule.timesteps[i], null)
    noise = torch.randn(z0.shape, generator=torch.Generator().manual_seed(0))
    target = schedule.step(u + 7.5 * (c - u), i, x) + 3e-3 * noise

    def gradient(p: Any) -> tuple[Any, float, Any]:
        loss_of = StepLoss(p, schedule, i, x, c, target, 7.5)
        emb = null.clone().requires_grad_(True)
        g, loss = null_gradient(loss_of, emb)
        (plain,) = torch.autograd.grad(loss_of(emb), [emb])
        return g, loss, plain

    g32, loss32, plain32 = gradient(pipe)
    half = types.SimpleNamespace(unet=copy.deepcopy(pipe.unet).to(torch.float16))
    g16, loss16, plain16 = gradient(half)
    assert loss32 == pytest.approx(9.5e-6, rel=0.3) and loss16 == pytest.approx(loss32, rel=0.05)
    torch.testing.assert_close(g32, plain32, rtol=1e-5, atol=1e-12)  # scaling changes nothing in float32
    assert float((plain16 == 0).float().mean()) > 0.99  # measured 1.00: the unscaled gradient is gone
    assert float((g16 == 0).float().mean()) < 0.01  # measured 0.00
    assert float((g16 - g32).norm() / g32.norm()) < 0.05  # measured 0.012


@pytest.mark.e2e
def test_the_precision_check_script(pipe: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """scripts/check_null_text_precision.py, the GPU measurement docs/editing.md asks for, on the tiny model (CPU,
    float32 only here: float16 on a CPU is slow, and its gradients are checked above)."""
    import importlib.util
    import json

    from PIL import Image

    pipe.save_pretrained(tmp_path / "sd")
    Image.fromarray(tiny_image(pipe, PROMPT, seed=1)).save(tmp_path / "photo.png")
    spec = importlib.util.spec_from_file_location("check", Path(__file__).parents[1] / "scripts" /
                                                  "check_null_text_precision.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--model", str(tmp_path / "sd"), "--image", str(tmp_path / "photo.png"), "--prompt", PROMPT,
                        "--device", "cpu", "--dtypes", "float32", "--size", str(SIZE), "--steps", "3",
                        "--null-steps", "3", "--null-lr", "0.1"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (r,) = rows
    assert r["dtype"] == "float32" and r["seconds"] > 0
    assert r["null_text_mse"] < 0.5 * r["plain_ddim_mse"], r  # null-text optimisation did its work
    assert r["zero_gradient_share"] < 0.01, r
