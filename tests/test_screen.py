"""Screening several captions in one call (generate_and_classify with prompts) and the ladder's rules behind it."""

from __future__ import annotations

import pytest

from sleuth.tools import investigation_tools as registry
from sleuth.tools import ladder
from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.context import ToolContext
from sleuth.tools.investigation import Budget, Investigation
from sleuth.tools.registry import ToolError
from tests.fakeworld import fake_backends

CAT = "a realistic photograph of a cat"
SNOW = "a realistic photograph of a cat in the snow"
GRASS = "a realistic photograph of a cat on the grass"
SAND = "a realistic photograph of a cat on the sand"
KITCHEN = "a realistic photograph of a cat in a kitchen"


@pytest.fixture()
def ctx(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")
    inv = Investigation(backends=fake_backends(), label="cat", artifacts=store, budget=Budget(images=20_000))
    return ToolContext(investigation=inv, artifacts=store)


def call(ctx, **args):
    return registry().call("generate_and_classify", args, ctx)


def test_a_screen_ranks_captions_and_singles_out_the_failing_one(ctx):
    # The fake world fails 60% of snow images and 3% of grass and sand ones; the class prompt ~9% (mostly grass).
    inv = ctx.investigation
    r = call(ctx, prompts=[GRASS, KITCHEN, SNOW, SAND])
    sc = r.screen
    assert sc is not None and sc.effect == 3.0 and sc.stopped == "done"
    by = {c.caption: c for c in sc.captions}
    assert [c.caption for c in sc.captions][0] == SNOW and by[SNOW].verdict == "test"
    assert sc.to_test == [SNOW]
    assert by[GRASS].verdict == by[SAND].verdict == "dropped"
    assert by[KITCHEN].verdict == "unrendered" and by[KITCHEN].n == 0  # the parser says so: no image spent on it
    assert sc.captions[-1].caption == KITCHEN
    # Every caption stopped on a rung of the 3x ladder (3, 12, 32 images); snow's screen fails well over the 27% it
    # must plausibly reach (3x a class failing 9%).
    assert all(by[c].n in ladder.PASSES[0].ladder for c in (GRASS, SAND, SNOW))
    assert by[SNOW].k / by[SNOW].n > 0.4
    # The baseline is the 3x target's 300 images; the screen's own images are exactly the captions' looks.
    assert sc.class_rate.n == 300
    assert sc.images == sum(c.n for c in sc.captions)
    assert inv.budget.used == 300 + sc.images
    # A screen is a look: no test, no family member.
    assert inv.tests == []
    # The result's sample is the top caption's pooled screen, with its images for caption_failures.
    assert r.summary.prompt == SNOW and r.summary.failures.n == by[SNOW].n
    assert by[SNOW].measurement_id == r.measurement_id and r.failure_images
    assert by[SNOW].wrong_label == "snow leopard"
    assert 0.9 <= by[SNOW].plausible <= 1 and by[GRASS].plausible < ladder.DROP_BELOW


def test_a_second_screen_starts_from_the_images_of_the_first(ctx):
    first = call(ctx, prompts=[GRASS, SNOW]).screen
    before = {c.caption: c.n for c in first.captions}
    again = call(ctx, prompts=[GRASS, SNOW], effect=2.0).screen
    after = {c.caption: c.n for c in again.captions}
    # The 2x ladder starts at 12 images and drops nothing under its floor: both captions grew from where they were.
    assert after[GRASS] >= max(before[GRASS], ladder.PASSES[1].floor)
    assert again.images == sum(after[c] - before[c] for c in after)
    assert again.class_rate.n == ladder.PASSES[1].baseline_n  # the 2x target's baseline: topped up to 800
    # A single-prompt look at a caption counts too.
    call(ctx, prompt=SAND, n=40)
    third = call(ctx, prompts=[SAND], effect=2.0).screen
    assert third.captions[0].n >= 40


def test_a_screen_stops_at_max_images_and_says_so(ctx):
    r = call(ctx, prompts=[GRASS, SAND, SNOW], effect=1.5, max_images=100)
    sc = r.screen
    assert sc.stopped == "max_images"
    assert 0 < sc.images <= 100
    assert any(c.verdict == "open" for c in sc.captions)


def test_screen_arguments_are_checked(ctx):
    with pytest.raises(ToolError, match=r"give prompt \(one caption\), or prompts \(captions to screen\) and/or "
                                        "proposed=true"):
        call(ctx)
    with pytest.raises(ToolError, match="the class prompt"):  # a prompt given with prompts is screened with them
        call(ctx, prompt=CAT, prompts=[SNOW])
    with pytest.raises(ToolError, match="effect must be one of 3, 2, 1.5"):
        call(ctx, prompts=[SNOW], effect=4)
    with pytest.raises(ToolError, match="must name the class"):
        call(ctx, prompts=[SNOW, "a realistic photograph of a dog"])
    with pytest.raises(ToolError, match="the class prompt"):
        call(ctx, prompts=[CAT])
    assert ctx.investigation.budget.used == 0  # refused before any image


def test_the_ladder_climbs_rung_by_rung_and_judges_like_the_protocol_planner():
    t = ladder.PASSES[0]
    p0 = 0.02
    # A look that always fails a fixed share: the rungs are 3, 12, 32 images.
    shares = {"never": 0.0, "always": 1.0, "sometimes": 0.25}
    seen: list[tuple[str, int]] = []

    def look(caption: str, n: int) -> tuple[int, int, bool]:
        seen.append((caption, n))
        return n, round(shares[caption] * n), True

    cands = [ladder.Screened(c) for c in shares]
    spent, stopped = ladder.screen(cands, p0, t, look, 10_000)
    by = {c.caption: c for c in cands}
    assert stopped == "done" and spent == sum(n for _, n in seen)
    assert by["always"].verdict == "test" and by["always"].n == 3  # 3/3 is sure enough at the top of nothing
    assert by["never"].verdict == "dropped" and by["never"].n == 3
    assert by["sometimes"].looks == [3, 9] and by["sometimes"].verdict == "test"
    assert seen[:3] == [("never", 3), ("always", 3), ("sometimes", 3)]  # every first look before any climb
    # The same rule the protocol planner judges with.
    assert ladder.judge(3, 12, p0, t) == "test" and ladder.judge(0, 3, p0, t) == "dropped"
    assert ladder.next_look(0, t) == 3 and ladder.next_look(3, t) == 9 and ladder.next_look(32, t) == 0
    assert ladder.next_look(12, ladder.PASSES[1]) == 20  # to the 2x ladder's next rung (32)
    with pytest.raises(ValueError, match="no screening target at 4x"):
        ladder.target_for(4.0)


def test_proposed_screens_what_the_tools_proposed_and_not_yet_screened(ctx):
    inv = ctx.investigation
    pert = registry().call("perturb_caption", {"caption": CAT, "types": ["background"], "n": 10}, ctx)
    proposed = [e.caption for e in [*pert.edits, *pert.refinements]]
    assert proposed and set(inv.proposed.values()) >= set(proposed)
    # As a small model fills every field of a forced call: the prompt is screened with the proposals.
    first = call(ctx, proposed=True, prompt=SAND, n=100, prompts=None).screen
    screened = {c.caption for c in first.captions}
    assert SAND in screened and set(proposed) <= screened
    # At the same effect nothing is left; at a smaller one every proposal is screened again from where it was.
    with pytest.raises(ToolError, match="nothing proposed is left to screen at effect 3"):
        call(ctx, proposed=True)
    again = call(ctx, proposed=True, effect=2.0).screen
    assert {c.caption for c in again.captions} == set(proposed)
    before = {c.caption: c.n for c in first.captions}
    assert all(c.n >= before[c.caption] for c in again.captions)


def test_proposed_takes_up_again_what_a_screen_left_open_at_max_images(ctx):
    """A screen capped too low leaves captions open; proposed=true goes on with them from where they stopped, and
    what it decided is not screened again (a small model was seen capping a 138-caption screen at 100 images)."""
    pert = registry().call("perturb_caption", {"caption": CAT, "types": ["background"], "n": 10}, ctx)
    proposed = {e.caption for e in [*pert.edits, *pert.refinements]}
    first = call(ctx, proposed=True, max_images=10).screen
    assert first.stopped == "max_images" and first.images <= 10
    open_ = {c.caption: c.n for c in first.captions if c.verdict == "open"}
    decided = {c.caption for c in first.captions if c.verdict != "open"}
    assert open_ and set(open_) | decided == proposed
    second = call(ctx, proposed=True).screen
    assert second.stopped == "done" and {c.caption for c in second.captions} == set(open_)
    assert all(c.verdict != "open" and c.n >= open_[c.caption] for c in second.captions)
    with pytest.raises(ToolError, match="nothing proposed is left to screen at effect 3"):
        call(ctx, proposed=True)
