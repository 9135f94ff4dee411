"""A finding's discovery test must be of its caption or of a caption it narrows, not of a catalogue caption."""

from __future__ import annotations

import pytest

from sleuth.tools import investigation_tools
from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.context import ToolContext
from sleuth.tools.investigation import Budget, Investigation
from sleuth.tools.record_finding import MAX_EXTRA_WORDS, extra_words, refines
from sleuth.tools.registry import ToolError
from tests.fakeworld import fake_backends

CAT = "a realistic photograph of a cat"
SNOW = CAT + ". it is in the snow."
COLOURS = ("red orange yellow green blue purple pink brown black white grey gold silver beige").split()
CATALOGUE = CAT + ". it is " + ", ".join(COLOURS) + " or in the snow."


@pytest.fixture()
def ctx(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")
    inv = Investigation(backends=fake_backends(), label="cat", artifacts=store, budget=Budget(images=60_000),
                        max_confirmations=3)
    return ToolContext(investigation=inv, artifacts=store)


def call(ctx, name, **args):
    return investigation_tools().call(name, args, ctx)


def test_which_captions_a_caption_narrows():
    assert len(COLOURS) == 14
    assert refines(SNOW, SNOW) and extra_words(SNOW, SNOW) == frozenset()
    assert refines(SNOW, SNOW + " it is daytime. the cat is grey.")  # two sentences left out: 2 words
    assert refines(SNOW, SNOW + " it is daytime, grey and small.")  # 3 words: the most left out
    assert extra_words(SNOW, SNOW + " it is daytime, grey, small and old.") == {"daytime", "grey", "small", "old"}
    assert not refines(SNOW, SNOW + " it is daytime, grey, small and old.")
    assert not refines(SNOW, CATALOGUE) and len(extra_words(SNOW, CATALOGUE) or ()) == 14
    assert not refines(SNOW + " the cat is red.", SNOW) and extra_words(SNOW + " it is red.", SNOW) is None
    assert MAX_EXTRA_WORDS == 3


def test_a_catalogue_caption_is_not_the_discovery_of_each_entry(ctx):
    catalogue = call(ctx, "measure_rate", caption=CATALOGUE)
    assert catalogue.verdict == "supported"  # the fake generator draws the snow it names
    conf = call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=200)
    assert conf.adjusted_p <= 0.05
    with pytest.raises(ToolError, match=r"names 14 content words .* more than the 3 a refinement may leave out"):
        call(ctx, "record_finding", caption=SNOW, discovery_test=catalogue.test_id, confirmation_test=conf.test_id)
    # A discovery of the caption narrowed by a few words does serve, and so does the caption's own.
    near = call(ctx, "measure_rate", caption=SNOW + " it is daytime, grey and small.")
    f = call(ctx, "record_finding", caption=SNOW, discovery_test=near.test_id, confirmation_test=conf.test_id)
    assert f.confirmed and f.discovery.test_id == near.test_id
    # A counterfactual cited must be of the caption or one it narrows too.
    cf = call(ctx, "measure_rate", caption=CATALOGUE, mode="counterfactual", max_n=50)
    conf2 = call(ctx, "measure_rate", caption=CAT + ". it is in the snow. it is daytime.", confirm=True, max_n=200)
    with pytest.raises(ToolError, match="not a counterfactual measurement of"):
        call(ctx, "record_finding", caption=CAT + ". it is in the snow. it is daytime.", discovery_test=near.test_id,
             confirmation_test=conf2.test_id, counterfactual_test=cf.test_id)
