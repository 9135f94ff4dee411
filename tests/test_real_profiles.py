"""Real checkpoints' settings: seeded stochastic schedulers, SDXL refused by the editor, the editing profile a
generator and an editor on the same weights share, distilled models' defaults, and edits charged in generator
images. On tiny random-weight pipelines built from configs (tests/sd_tiny.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from sleuth.tools.backends.base import BackendError
from sleuth.tools.backends.diffusers_generator import DiffusersGenerator
from sleuth.tools.backends.sd_edit import SDEditor
from sleuth.tools.backends.specs import BackendSpecs
from tests.sd_tiny import SIZE, tiny_sd, tiny_sdxl
from tests.test_real_diffusers import fake_toyworld  # noqa: F401 - a fixture

torch.set_num_threads(1)

PROMPTS = ["a photo of a cat", "a photo of a cat in the snow", "a photo of a dog"]
SEEDS = [3, 4, 2**40 + 3]


@pytest.fixture(scope="module")
def tokenizer_folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = getattr(request.config, "cache", None)
    return Path(cache.mkdir("sd-tiny")) if cache is not None else tmp_path_factory.mktemp("sd")


@pytest.fixture(scope="module")
def sd15_folder(tokenizer_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny SD 1.x pipeline saved as Stable Diffusion 1.5 ships: with a PNDM scheduler."""
    from diffusers import PNDMScheduler

    pipe = tiny_sd(tokenizer_folder)
    pipe.scheduler = PNDMScheduler.from_config({**pipe.scheduler.config, "skip_prk_steps": True})
    folder = tmp_path_factory.mktemp("sd15") / "sd15"
    pipe.save_pretrained(folder)
    return folder


def same(a: list[Any], b: list[Any]) -> int:
    return max(int(np.abs(x.image.astype(int) - y.image.astype(int)).max()) for x, y in zip(a, b))


@pytest.mark.parametrize("scheduler", ["EulerAncestralDiscreteScheduler", "LCMScheduler", "DDPMScheduler"])
def test_a_stochastic_scheduler_draws_the_same_image_whatever_the_batch(tokenizer_folder: Path,
                                                                       scheduler: str) -> None:
    import diffusers

    pipe = tiny_sd(tokenizer_folder)
    pipe.scheduler = getattr(diffusers, scheduler).from_config(pipe.scheduler.config)
    three = DiffusersGenerator(pipeline=pipe, num_inference_steps=4, height=SIZE, width=SIZE, batch_size=3)
    one = DiffusersGenerator(pipeline=pipe, num_inference_steps=4, height=SIZE, width=SIZE, batch_size=1)
    a, b = three.generate(PROMPTS, SEEDS), one.generate(PROMPTS, SEEDS)
    assert same(a, b) <= 1 and same(a, three.generate(PROMPTS, SEEDS)) == 0
    # Only the seed's: the same prompt on a seed 2**40 higher is another image.
    other = one.generate(PROMPTS[:1], [SEEDS[2]])
    assert np.abs(a[0].image.astype(int) - other[0].image.astype(int)).mean() > 1


def test_sdxl_is_refused_when_the_editor_is_built_and_draws_reproducibly(tokenizer_folder: Path,
                                                                          tmp_path: Path) -> None:
    pipe = tiny_sdxl(tokenizer_folder)
    with pytest.raises(BackendError, match="SDXL.*SD 1.x/2.x checkpoint"):
        SDEditor(pipeline=pipe)
    pipe.save_pretrained(tmp_path / "xl")
    with pytest.raises(BackendError, match=r"StableDiffusionXLPipeline \(.*xl\)"):
        SDEditor(str(tmp_path / "xl"))  # from the folder's index, before any weights load
    # As a generator (SDXL-Turbo's settings: Euler ancestral, one step, no guidance) it draws by seed alone.
    two = DiffusersGenerator(pipeline=pipe, num_inference_steps=1, guidance_scale=0.0, height=SIZE, width=SIZE,
                             batch_size=2)
    one = DiffusersGenerator(pipeline=pipe, num_inference_steps=1, guidance_scale=0.0, height=SIZE, width=SIZE,
                             batch_size=1)
    assert same(two.generate(PROMPTS[:2], SEEDS[:2]), one.generate(PROMPTS[:2], SEEDS[:2])) <= 1


def test_a_generator_and_an_editor_on_the_same_weights_draw_and_edit_alike(sd15_folder: Path,
                                                                            fake_toyworld: Any) -> None:  # noqa: F811
    """Stable Diffusion 1.5 ships PNDM: next to an editor on its weights the generator draws with DDIM at the
    editor's steps and guidance, so every counterfactual edits from the seed, with no inversion."""
    size = f"height={SIZE},width={SIZE}"
    alone = BackendSpecs(generator=f"diffusers:{sd15_folder},{size}").build_parts()["generator"]
    assert (alone.scheduler, alone.num_inference_steps, alone.guidance_scale) == (None, 30, 7.5)
    parts = BackendSpecs(generator=f"diffusers:{sd15_folder},{size}", editor=f"sd-edit:{sd15_folder}").build_parts()
    gen, editor = parts["generator"], parts["editor"]
    assert (gen.scheduler, gen.num_inference_steps, gen.guidance_scale) == ("ddim", 50, 7.5)
    assert (editor.inversion_settings.steps, editor.inversion_settings.guidance) == (50, 7.5)
    assert ":scheduler=ddim" in gen.id and ":scheduler=" not in alone.id
    g = gen.generate([PROMPTS[0]], [SEEDS[0]])[0]
    assert g.meta["drawn"]["scheduler"] == "DDIMScheduler"
    out = editor.edit(g, PROMPTS[0], PROMPTS[1])
    assert out.meta["start"] == "seed" and out.meta["start_psnr"] >= 35 and editor.inversions_run == 0
    # A setting given to one is taken by the other.
    parts = BackendSpecs(generator=f"diffusers:{sd15_folder},steps=20,guidance=5", editor=f"sd-edit:{sd15_folder}",
                         ).build_parts()
    assert parts["editor"].inversion_settings.steps == 20 and parts["editor"].inversion_settings.guidance == 5
    parts = BackendSpecs(generator=f"diffusers:{sd15_folder}", editor=f"sd-edit:{sd15_folder},steps=10").build_parts()
    assert parts["generator"].num_inference_steps == 10
    with pytest.raises(BackendError, match="unknown scheduler 'heun2'"):
        BackendSpecs(generator=f"diffusers:{sd15_folder},scheduler=heun2").build_parts()


def test_distilled_models_get_their_steps(sd15_folder: Path, tmp_path: Path,
                                                                         fake_toyworld: Any) -> None:  # noqa: F811
    turbo = tmp_path / "stabilityai" / "sd-turbo"
    shutil.copytree(sd15_folder, turbo)
    gen = BackendSpecs(generator=f"diffusers:{turbo}").build_parts()["generator"]
    assert (gen.num_inference_steps, gen.guidance_scale) == (1, 0.0)
    assert BackendSpecs(generator=f"diffusers:{turbo},steps=2").build_parts()["generator"].num_inference_steps == 2
    lcm = tmp_path / "SimianLuo" / "LCM_Dreamshaper_v7"
    shutil.copytree(sd15_folder, lcm)
    gen = BackendSpecs(generator=f"diffusers:{lcm}").build_parts()["generator"]
    assert (gen.num_inference_steps, gen.guidance_scale) == (4, 8.0)


def test_edits_are_charged_in_generator_images(sd15_folder: Path, tmp_path: Path,
                                               fake_toyworld: Any) -> None:  # noqa: F811
    turbo = tmp_path / "stabilityai" / "sd-turbo"
    shutil.copytree(sd15_folder, turbo)
    # An inversion is 50 steps of (1 DDIM pass + null-text's 1 + 2 + 3 x 10 row passes): 1650 one-step images,
    # an edit without a sweep 50 steps x 2 rows x 2 halves: 200; the editor's own images count 16.5 and 2.
    parts = BackendSpecs(generator=f"diffusers:{turbo}", editor=f"sd-edit:{sd15_folder}").build_parts()
    cost = parts["editor"].cost
    assert (cost.inversion, cost.edit) == (1650.0, 200.0) and parts["generator"].num_inference_steps == 1
    assert "images of the generator (1 UNet passes each; the editor's image is 100)" in cost.describe()
    own = SDEditor(str(sd15_folder)).cost
    assert (own.inversion, own.edit) == (16.5, 2.0)
    # On the same weights at the same settings (as toyworld-sd draws and edits) the charges do not move.
    same_weights = BackendSpecs(generator=f"diffusers:{sd15_folder},steps=25",
                                editor=f"sd-edit:{sd15_folder}").build_parts()["editor"].cost
    assert (same_weights.inversion, same_weights.edit) == (16.5, 2.0)
    # Overrides are in generator images.
    assert BackendSpecs(generator=f"diffusers:{turbo}", editor=f"sd-edit:{sd15_folder},inversion_cost=90",
                        ).build_parts()["editor"].cost.inversion == 90
