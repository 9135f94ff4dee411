"""The counterfactual test's control edit: a placebo that changes as much caption text as the edit, naming nothing.

An editor that leaves an unchanged caption alone but damages images whenever their caption changes (prompt-to-prompt
with any new word does so in part) makes a null attribute look like a cause against a sham edit. Against the placebo
edit both arms change their caption, so only the attribute is tested.
"""

from __future__ import annotations

import numpy as np
import pytest

from sleuth.tools import investigation_tools, stats
from sleuth.tools.backends.base import EditOutcome, Generation
from sleuth.tools.context import ToolContext
from sleuth.tools.counterfactual import (
    NEUTRAL_CONTENT,
    added_content_words,
    added_words,
    control_for,
    default_is_content,
    placebo_caption,
)
from sleuth.tools.investigation import Budget, Investigation
from sleuth.tools.registry import ToolError
from tests.fakeworld import FakeEditor, fake_backends

CAT = "a realistic photograph of a cat"
DAYTIME = "a realistic photograph of a cat. it is daytime."  # fakeworld draws nothing for it: a null attribute
ALPHA = 0.05


class CaptionChangeEditor(FakeEditor):
    """Damages a share of the images whose caption changes (a fresh draw per image and target caption), so that the
    classifier fails on them; an unchanged caption is left alone."""

    id = "caption-change-edit"

    def __init__(self, share: float = 0.25) -> None:
        self.share = share

    def edit(self, generation: Generation, source_caption: str, target_caption: str) -> EditOutcome:
        out = super().edit(generation, source_caption, target_caption)
        if source_caption.split() != target_caption.split():
            salt = list(target_caption.encode())
            if np.random.default_rng([generation.seed, *salt]).random() < self.share:
                out.image[0, 0, 0] = 255  # fakeworld's classifier fails on it
        return out


class ClaimsShamIsPlacebo(CaptionChangeEditor):
    """The same editor declaring (wrongly) that its sham is as good as a placebo: the sham is then the control."""

    sham_is_placebo = True


def mechanism_runs(editor: FakeEditor, runs: int, pairs: int) -> tuple[int, list[object]]:
    """Counterfactual tests of the null attribute, each on fresh class images: how many rejected at alpha."""
    rejected = 0
    results = []
    for seed in range(runs):
        backends = fake_backends()
        backends.editor = editor  # type: ignore[assignment]
        ctx = ToolContext()
        ctx.investigation = Investigation(backends=backends, label="cat", budget=Budget(images=10_000), seed=seed)
        r = investigation_tools().call("measure_rate", {"caption": DAYTIME, "mode": "counterfactual",
                                                        "max_n": pairs}, ctx)
        rejected += r.p_value <= ALPHA
        results.append(r)
    return rejected, results


def test_placebo_captions_change_as_many_words_and_name_nothing():
    from sleuth.tools.backends.toyworld.config import load_world
    from sleuth.tools.backends.toyworld.parser import parse

    world = load_world(None)
    targets = [DAYTIME, CAT + ". it is in the snow.", CAT + " on a red flower next to a blue net, at night, sketch.",
               CAT + ". " + " ".join(["it is in the snow."] * 4)]
    for target in targets:
        placebo = placebo_caption(CAT, target)
        assert placebo is not None and placebo.startswith(CAT + ". ")
        assert added_words(CAT, placebo) == added_words(CAT, target)
        # toyworld's parser reads nothing into it: the same scene constraints, no word it cannot render.
        parsed, source = parse(placebo, world), parse(CAT, world)
        assert parsed.scene_constraints == source.scene_constraints and not parsed.unrendered
        assert parsed.label == source.label
    assert placebo_caption(CAT, CAT) is None and placebo_caption(DAYTIME, CAT) is None  # nothing added: the sham
    assert control_for(CaptionChangeEditor(), CAT, DAYTIME) == ("placebo", CAT + ". it is shown.")
    assert control_for(ClaimsShamIsPlacebo(), CAT, DAYTIME) == ("sham", CAT)


def test_toyworld_placebo_edits_are_its_sham_edits_so_it_keeps_the_sham():
    """toyworld declares ``sham_is_placebo``: a placebo edit re-renders the same image as the sham, bit for bit."""
    from sleuth.tools.backends.toyworld import load_backends

    toy = load_backends()
    assert toy.editor.sham_is_placebo
    prompt = toy.class_prompt("cat") if callable(toy.class_prompt) else CAT
    target = prompt + ". it is in the snow, at night, next to a red flower."
    placebo = placebo_caption(prompt, target)
    assert placebo is not None
    for g in toy.generator.generate([prompt] * 6, list(range(6))):
        sham, plac = toy.editor.edit(g, prompt, prompt), toy.editor.edit(g, prompt, placebo)
        assert np.array_equal(sham.image, plac.image) and np.array_equal(plac.image, g.image)


@pytest.mark.parametrize("pairs,placebo,sham", [pytest.param(20, 9, 203, marks=pytest.mark.e2e),
                                                pytest.param(100, 11, 400, marks=pytest.mark.slow)])
def test_a_caption_change_editor_no_longer_passes_a_null_attribute_as_a_cause(pairs, placebo, sham):
    runs = 400
    rejected, results = mechanism_runs(CaptionChangeEditor(), runs, pairs)
    rate = stats.binomial_rate(rejected, runs, method="clopper-pearson")
    assert rate.high <= ALPHA, rate  # 9/400 = 2.2% [1.0%, 4.2%] at 20 pairs, 11/400 = 2.8% [1.4%, 4.9%] at 100
    assert rejected == placebo  # the runs are seeded: the numbers docs/statistics.md states
    # The result says which control it used, and the placebo arm shows the editor's damage beside the test.
    r = results[0]
    assert any("control: a placebo edit" in n and "it is shown." in n for n in r.notes)
    shams = [x.sham for x in results]
    assert sum(s.b for s in shams) > 0.15 * sum(x.original.n for x in results)  # ~25% flipped by the placebo edit alone
    assert all(f.control == "placebo" and f.control_caption == CAT + ". it is shown." for x in results
               for f in x.flips)
    # The same editor against a sham edit: the leak the placebo closes.
    leaky, sham_results = mechanism_runs(ClaimsShamIsPlacebo(), runs, pairs)
    leak = stats.binomial_rate(leaky, runs, method="clopper-pearson")
    assert leak.low > 8 * ALPHA and leaky == sham, leak  # 203/400 = 50.7% [45.7%, 55.8%] at 20 pairs
    assert not any("placebo" in n for n in sham_results[0].notes)
    assert all(f.control == "sham" for x in sham_results for f in x.flips)


@pytest.mark.parametrize("target", ["a photograph of a cat", "a cat, a realistic photograph of", CAT + ". it is."])
def test_a_counterfactual_that_adds_no_word_is_refused_before_it_edits_anything(target):
    # Dropping or reordering words leaves nothing for a placebo to match, and against the sham an editor that damages
    # images whenever their caption changes passes such an edit as a cause about half the time at 20 pairs.
    backends = fake_backends()
    backends.editor = CaptionChangeEditor()  # type: ignore[assignment]
    ctx = ToolContext()
    ctx.investigation = Investigation(backends=backends, label="cat", budget=Budget(images=10_000))
    with pytest.raises(ToolError, match="adds no word to the class prompt"):
        investigation_tools().call("measure_rate", {"caption": target, "mode": "counterfactual", "max_n": 20}, ctx)
    assert ctx.investigation.budget.used == 0 and not ctx.investigation.tests


class ContentWordEditor(FakeEditor):
    """Redraws (damages) a share of the images whose caption gains a content word, by the content words it declares
    (as prompt-to-prompt re-weights and blends only those), and leaves any other caption change alone: against a
    placebo without content words, a null attribute would pass as a cause."""

    id = "content-word-edit"

    def __init__(self, share: float = 0.25, stop: frozenset[str] = frozenset()) -> None:
        self.share = share
        self.stop = stop

    def is_content(self, word: str) -> bool:
        return default_is_content(word) and word not in self.stop

    def edit(self, generation: Generation, source_caption: str, target_caption: str) -> EditOutcome:
        out = super().edit(generation, source_caption, target_caption)
        if added_content_words(source_caption, target_caption, self.is_content):
            salt = list(target_caption.encode())
            if np.random.default_rng([generation.seed, *salt]).random() < self.share:
                out.image[0, 0, 0] = 255  # fakeworld's classifier fails on it
        return out


def test_placebos_match_the_editors_content_words():
    # As many words as the edit adds, and among them as many content words by the editor's own definition.
    snow = CAT + " in a fishing net next to the snow."
    for editor in (ContentWordEditor(), ContentWordEditor(stop=frozenset({"shown", "seen"})), CaptionChangeEditor()):
        check = getattr(editor, "is_content", default_is_content)
        for target in (DAYTIME, snow, CAT + ". " + " ".join(["it is in the snow."] * 4)):
            control, placebo = control_for(editor, CAT, target)
            assert control == "placebo"
            assert added_words(CAT, placebo) == added_words(CAT, target)
            assert added_content_words(CAT, placebo, check) == added_content_words(CAT, target, check) > 0
    assert control_for(ContentWordEditor(stop=frozenset({"shown"})), CAT, DAYTIME) == ("placebo", CAT + ". it is seen.")
    with pytest.raises(ValueError, match="no neutral phrasing"):
        placebo_caption(CAT, DAYTIME, lambda w: w == "daytime")


class HiddenContentWordEditor(ContentWordEditor):
    """The same editor, its content words not declared: the placebo is matched by the default content words, which
    count "shown" as one, while the editor does not."""

    is_content = None  # type: ignore[assignment]

    def edit(self, generation: Generation, source_caption: str, target_caption: str) -> EditOutcome:
        out = FakeEditor.edit(self, generation, source_caption, target_caption)
        if added_content_words(source_caption, target_caption, lambda w: default_is_content(w) and w not in self.stop):
            salt = list(target_caption.encode())
            if np.random.default_rng([generation.seed, *salt]).random() < self.share:
                out.image[0, 0, 0] = 255
        return out


@pytest.mark.parametrize("pairs,runs,expected,hidden", [pytest.param(20, 400, 5, 203, marks=pytest.mark.e2e),
                                                        pytest.param(100, 1000, 36, 400, marks=pytest.mark.slow)])
def test_an_editor_that_redraws_on_new_content_words_does_not_pass_a_null_attribute(pairs, runs, expected, hidden):
    # The editor counts "shown" as no content word (as a verb, say) and declares so: the placebo adds "seen" instead.
    rejected, results = mechanism_runs(ContentWordEditor(stop=frozenset({"shown"})), runs, pairs)
    rate = stats.binomial_rate(rejected, runs, method="clopper-pearson")
    assert rate.high <= ALPHA, rate  # 5/400 = 1.2% [0.4%, 2.9%] at 20 pairs, 36/1,000 = 3.6% [2.5%, 4.9%] at 100
    assert rejected == expected  # the runs are seeded: the numbers docs/statistics.md states
    assert all(f.control == "placebo" and f.control_caption == CAT + ". it is seen." for x in results
               for f in x.flips)
    # Its placebo arm is redrawn as often as its edit arm: the editor's own damage is in both.
    assert sum(x.sham.b for x in results) > 0.15 * sum(x.original.n for x in results)
    # Undeclared, its rule tells the placebo ("it is shown.") from the edit: the leak the declaration closes.
    leaky, _ = mechanism_runs(HiddenContentWordEditor(stop=frozenset({"shown"})), 400, pairs)
    leak = stats.binomial_rate(leaky, 400, method="clopper-pearson")
    assert leak.low > 8 * ALPHA and leaky == hidden, leak


def test_a_counterfactual_no_placebo_can_match_is_refused_before_it_edits_anything():
    backends = fake_backends()
    backends.editor = ContentWordEditor(stop=frozenset(NEUTRAL_CONTENT))  # type: ignore[assignment]
    ctx = ToolContext()
    ctx.investigation = Investigation(backends=backends, label="cat", budget=Budget(images=10_000))
    with pytest.raises(ToolError, match="no neutral phrasing"):
        investigation_tools().call("measure_rate", {"caption": DAYTIME, "mode": "counterfactual", "max_n": 20}, ctx)
    assert ctx.investigation.budget.used == 0 and not ctx.investigation.tests
