"""Counterfactual edits as evidence: only edits that passed their editor's quality filters count, editing is charged
to the image budget at the editor's declared cost (with a cap on pairs for costly editors), and edit outcomes that a
re-run would not repeat are kept and reused (tests/fakeworld.py backends)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from sleuth.tools import investigation_tools
from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.backends.base import EditCost, EditOutcome, Generation
from sleuth.tools.cache import PredictionCache
from sleuth.tools.context import ToolContext
from sleuth.tools.investigation import Budget, Investigation
from sleuth.tools.registry import ToolError
from tests import fakeworld
from tests.fakeworld import FakeClassifier, FakeEditor, FakeGenerator, fake_backends

CAT = "a realistic photograph of a cat"
SAND = "a realistic photograph of a cat. it is on the sand."
GRASS = "a realistic photograph of a cat. it is in the grass."


@pytest.fixture(autouse=True)
def _sand_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """In this module the classifier fails on 60% of fakeworld's sand images (and rarely elsewhere)."""
    monkeypatch.setitem(fakeworld.RATES, "sand", 0.6)
    monkeypatch.setitem(fakeworld.RATES, "snow", 0.03)


class WreckingEditor(FakeEditor):
    """Every edit that makes the classifier fail also fails the image-image check: as if the edit had destroyed the
    object, which an editor's quality filter is there to catch."""

    def edit(self, generation: Generation, source_caption: str, target_caption: str) -> EditOutcome:
        out = super().edit(generation, source_caption, target_caption)
        fails = bool(FakeClassifier().logits([out.image])[0, 0] == 0.0)
        out.passed = {"image_image": not fails, "directional": True}
        return out


class DamagingEditor(FakeEditor):
    """Every pass through this editor, whatever its captions, makes the classifier fail on 30% of images (a fresh
    draw per caption pair): an editor that damages objects in a way its quality filters do not catch."""

    def edit(self, generation: Generation, source_caption: str, target_caption: str) -> EditOutcome:
        out = super().edit(generation, source_caption, target_caption)
        salt = int.from_bytes(target_caption.encode()[-6:], "little")
        if np.random.default_rng([generation.seed, salt]).random() < 0.3:
            out.image[0, 0, 0] = 255
        return out


class CostlyEditor(FakeEditor):
    id = "costly-edit"
    cost = EditCost(inversion=3.0, edit=2.0, max_pairs=10)


class UnrepeatableEditor(FakeEditor):
    """Adds fresh noise to every edit (as a GPU diffusion model does not repeat itself bit for bit) and counts calls."""

    id = "unrepeatable-edit"
    cache_outcomes = True

    def __init__(self) -> None:
        self.calls = 0
        self.rng = np.random.default_rng()

    def edit(self, generation: Generation, source_caption: str, target_caption: str) -> EditOutcome:
        self.calls += 1
        out = super().edit(generation, source_caption, target_caption)
        out.image[1:, 1:] = self.rng.integers(0, 256, out.image[1:, 1:].shape, dtype=np.uint8)
        out.passed = {"image_image": True}
        out.scores = {"clip_image_image": float(self.rng.random())}
        return out


class DistinctGenerator(FakeGenerator):
    """fakeworld's images, each made unique by its seed in a corner no model reads (fakeworld's images repeat)."""

    def generate(self, prompts: Sequence[str], seeds: Sequence[int]) -> list[Generation]:
        out = super().generate(prompts, seeds)
        for g in out:
            g.image[7, 7, :2] = (g.seed % 256, g.seed // 256 % 256)
        return out


def context(editor: object, budget: int = 50_000, cache: PredictionCache | None = None,
            store: Path | None = None) -> ToolContext:
    backends = fake_backends()
    backends.generator = DistinctGenerator()
    backends.editor = editor  # type: ignore[assignment]
    artifacts = ArtifactStore(store) if store is not None else None  # refs are then content hashes
    c = ToolContext(artifacts=artifacts)
    c.investigation = Investigation(backends=backends, label="cat", budget=Budget(images=budget), cache=cache,
                                    artifacts=artifacts)
    return c


def call(ctx: ToolContext, name: str, **args: object) -> object:
    return investigation_tools().call(name, args, ctx)


def test_edits_that_fail_a_quality_filter_are_not_counted() -> None:
    ctx = context(FakeEditor())
    honest = call(ctx, "measure_rate", caption=SAND, mode="counterfactual", max_n=200)
    assert honest.mcnemar.b > 50 and honest.verdict == "supported"  # the same images, edits that pass
    r = call(context(WreckingEditor()), "measure_rate", caption=SAND, mode="counterfactual", max_n=200)
    # The flips to failure all came with a failed filter: none is evidence.
    assert r.mcnemar.b == 0 and r.mcnemar.c == 0 and r.p_value == 1.0 and r.verdict != "supported"
    excluded = ctx.investigation.tests[-1].k1  # every edit after which the image fails
    note = next(n for n in r.notes if "quality filters" in n)
    assert note.startswith(f"{excluded} of 200 edits failed") and "(image_image " in note
    assert all(f.counted for f in r.flips)
    # The rate ratio compares the same counted images before and after their edits (none fails either time).
    assert (r.baseline.k, r.baseline.n) == (0, 200 - excluded)


def test_edit_image_counts_only_edits_that_passed() -> None:
    ctx = context(WreckingEditor())
    base = call(ctx, "generate_and_classify", prompt=CAT + " in the grass", n=60)
    e = call(ctx, "edit_image", images=base.success_images, source_caption=GRASS, target_caption=SAND)
    wrecked = [f for f in e.edits if not f.counted]
    assert wrecked and all(f.failed_after and f.passed["image_image"] is False for f in wrecked)
    assert e.to_failure == 0 and e.excluded == len(wrecked) and e.notes
    with pytest.raises(ToolError, match="none of the 200 edits passed"):
        all_fail = context(WreckingEditor())
        all_fail.investigation.backends.editor.edit = lambda g, s, t: EditOutcome(  # type: ignore[method-assign]
            image=g.image, source_caption=s, target_caption=t, passed={"directional": False})
        call(all_fail, "measure_rate", caption=SAND, mode="counterfactual", max_n=200)


def test_editing_is_charged_at_the_declared_cost_and_costly_editors_are_capped() -> None:
    ctx = context(CostlyEditor())
    inv = ctx.investigation
    r = call(ctx, "measure_rate", caption=SAND, mode="counterfactual", max_n=200)
    assert len(r.flips) <= 10 and r.baseline.n == 10
    assert any("10 pairs edited, not 200" in n for n in r.notes)
    # 10 class images generated; each inverted (3) once, edited (2) and sham-edited (2).
    assert (inv.budget.used, inv.budget.editing) == (10 + 10 * 7, 70)
    base = call(ctx, "generate_and_classify", prompt=CAT, n=20)
    refs = base.success_images[:2]
    e = call(ctx, "edit_image", images=[refs[0], refs[0], refs[1]], source_caption=CAT, target_caption=SAND)
    assert e.budget_charged == 2 * 3 + 3 * 2  # two distinct images inverted, three edits
    # Not enough left for 10 pairs (10 * 8 = 80): refused before anything is spent.
    poor = context(CostlyEditor(), budget=79)
    with pytest.raises(ToolError, match="image budget exhausted: 10 counterfactual pairs cost 80"):
        call(poor, "measure_rate", caption=SAND, mode="counterfactual", max_n=200)
    assert poor.investigation.budget.used == 0
    # An editor that declares nothing pays one image per edit (toyworld declares the same), sham edits included.
    plain = context(FakeEditor())
    call(plain, "measure_rate", caption=SAND, mode="counterfactual", max_n=50)
    assert (plain.investigation.budget.used, plain.investigation.budget.editing) == (150, 100)


def test_outcomes_a_rerun_would_not_repeat_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "predictions.sqlite"
    first_editor = UnrepeatableEditor()
    first = call(context(first_editor, cache=PredictionCache(path), store=tmp_path / "a"), "measure_rate",
                 caption=SAND, mode="counterfactual", max_n=40)
    assert first_editor.calls == 80  # each image edited and sham-edited
    # Another process (a resumed run, a verification) on the same machine: the same edits, not new ones.
    again_editor = UnrepeatableEditor()
    ctx = context(again_editor, cache=PredictionCache(path), store=tmp_path / "b")
    again = call(ctx, "measure_rate", caption=SAND, mode="counterfactual", max_n=40)
    assert again_editor.calls == 0
    assert again.model_dump() == first.model_dump()
    assert ctx.investigation.budget.editing == 80  # the charge does not depend on what the cache holds
    # Without the cache each run edits anew, and the edited images differ.
    fresh_editor = UnrepeatableEditor()
    fresh = call(context(fresh_editor, store=tmp_path / "c"), "measure_rate", caption=SAND, mode="counterfactual",
                 max_n=40)
    assert fresh_editor.calls == 80 and first.flips
    assert [f.original for f in fresh.flips] == [f.original for f in first.flips]  # the same images...
    assert not {f.edited for f in fresh.flips} & {f.edited for f in first.flips}  # ...edited anew, differently


def test_sd_editor_declared_cost() -> None:
    from sleuth.tools.backends.sd_edit import EditSettings, InversionSettings
    from sleuth.tools.backends.sd_edit.editor import default_cost
    from sleuth.tools.backends.sd_edit.options import _cost

    # Per step: DDIM inversion 1 row pass; null-text 1 conditional + 10 x (forward + backward ~ 3) + 1 step: 33
    # row passes against 2 for a guided image; an edit with a 5-schedule sweep is 6 rows.
    cost = default_cost(InversionSettings(), EditSettings(), sweep=True)
    assert (cost.inversion, cost.edit, cost.max_pairs) == (16.5, 6.0, 20)
    assert "editor's pipeline" in cost.describe() and EditCost().describe() == ""
    assert default_cost(InversionSettings(), EditSettings(), sweep=False).edit == 2.0
    assert default_cost(InversionSettings(guidance=1.0), EditSettings(), sweep=False).inversion == 1.0
    over = _cost({"inversion_cost": "300", "edit_cost": "40", "pairs": "8"}, cost)
    assert (over.inversion, over.edit, over.max_pairs) == (300.0, 40.0, 8)
    from sleuth.tools.backends.base import BackendError

    with pytest.raises(BackendError, match="pairs must be at least 1"):
        _cost({"pairs": "0"}, cost)


def test_the_counterfactual_test_holds_the_editors_own_effect_fixed_with_a_sham_edit() -> None:
    """An editor that makes images fail by itself: against the unedited images every edit 'causes' failures, so a
    test of edited against original would support any caption. Against the sham edit (same editor, caption
    unchanged) only the attribute counts."""
    from sleuth.tools import stats

    ctx = context(DamagingEditor())
    r = call(ctx, "measure_rate", caption=GRASS, mode="counterfactual", max_n=200)
    assert r.original is not None and r.edited is not None and r.sham is not None
    assert r.sham.b > 30 and r.sham.c == 0  # the editor alone flips ~30% of the images to failure
    naive = stats.compare_rates(r.edited.k, r.edited.n, r.original.k, r.original.n)
    assert naive.p_value < 1e-3  # edited against as generated: "significant" for a harmless attribute
    assert r.verdict != "supported" and r.p_value > 0.5  # edited against sham-edited: grass does no harm
    assert r.baseline.k == ctx.investigation.tests[-1].k0 > r.original.k and r.rate_ratio.ratio < 1.0
    assert r.rate_ratio.method.startswith("matched-pairs")
    # A caption that does cause failures is still found through the same editor.
    s_ = call(ctx, "measure_rate", caption=SAND, mode="counterfactual", max_n=200)
    assert s_.verdict == "supported" and s_.rate_ratio.low > 1.2


def test_with_a_faithful_editor_the_sham_changes_nothing() -> None:
    ctx = context(FakeEditor())
    r = call(ctx, "measure_rate", caption=SAND, mode="counterfactual", max_n=200)
    assert r.sham is not None and (r.sham.b, r.sham.c) == (0, 0)
    assert r.baseline.k == r.original.k  # the sham-edited images are the originals
    assert r.flips and all(f.sham is not None and f.failed_sham == f.failed_before for f in r.flips)


def test_toyworld_sham_edits_are_the_images_themselves() -> None:
    from sleuth.tools.backends.toyworld import load_backends

    backends = load_backends()
    c = ToolContext()
    c.investigation = Investigation(backends=backends, label="cat", budget=Budget(images=5_000))
    r = call(c, "measure_rate", caption="a realistic photograph of a cat. it is at night.", mode="counterfactual",
             max_n=60)
    assert r.sham is not None and (r.sham.b, r.sham.c) == (0, 0) and r.baseline.k == r.original.k
    assert r.flips and all(f.sham == f.original for f in r.flips)  # re-rendered unchanged: nothing new stored
