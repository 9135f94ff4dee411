"""Counterfactual pairs: the same image before and after an edit, both classified.

Two rules hold for every tool that edits (``edit_image``, ``measure_rate(mode="counterfactual")``):

- **Editing is paid for.** An edit costs what its editor declares (``EditCost``: per image inverted, per edit, in
  images), charged to the image budget before the work starts; an editor that declares a cap on counterfactual
  pairs (the Stable Diffusion editor: about a minute per inversion on a GPU) gets at most that many per measurement.
- **Only edits that passed their editor's quality filters count.** An edit that failed a filter (LANCE's CLIP
  checks: the edit no longer looks like the image, does not match its caption or changed the class word; toyworld:
  the edit did not happen or could not be rendered) says nothing about the classifier: a flip there may be the
  editor destroying or replacing the object. Such pairs are left out of the paired test, and how many, by which
  filter, is reported.
- **Edits are compared with a control edit through the same editor**: a *placebo* edit to a caption that changes as
  much text but names nothing new (the source caption and neutral sentences with as many added words, and among
  them as many content words by the editor's own ``is_content``, "it is shown." for "it is daytime.": the editor
  re-weights and blends them as it does the attribute's words), or, where that is no more costly and as valid, a
  *sham* edit with the caption unchanged (for a diffusion editor: inversion and reconstruction; for toyworld: the
  same scene re-rendered).
  ``measure_rate(mode="counterfactual")`` tests the edited image against the control-edited one, pair by pair, by
  the exact McNemar test, so it asks whether the captioned attribute changes failures, not whether editing does,
  nor whether changing the caption does: an editor that damages images whenever their caption changes (prompt-to-
  prompt with any new word does so in part) damages the placebo arm as much. The sham is used only by editors that
  declare ``sham_is_placebo`` (their output depends on a caption only through what it names, so a neutral phrasing
  re-renders the source exactly: toyworld) or when the target adds no word (``measure_rate`` refuses such a
  counterfactual: it adds no content word to test). Each pair records which control it had
  (``Flip.control``); the control's own flips against the originals are reported beside the test. The effect is the
  matched-pairs rate ratio (edited / control) with its paired interval (``stats.paired_rate_ratio``).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Callable
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from sleuth.tools import stats
from sleuth.tools.backends.base import BackendError, EditOutcome, Generation, edit_cost
from sleuth.tools.backends.criteria import failed as failed_by_criterion
from sleuth.tools.backends.sd_edit.p2p import STOP_WORDS
from sleuth.tools.cache import edit_key
from sleuth.tools.defaults import BUDGET_EXHAUSTED
from sleuth.tools.investigation import Investigation, Sample
from sleuth.tools.perturb_caption import FUNCTION_WORDS
from sleuth.tools.registry import ToolError
from sleuth.tools.text import pv

MAX_PAIRS = 200
"""Most images one counterfactual measurement edits, whatever the editor."""

Control = Literal["sham", "placebo"]

NEUTRAL_CONTENT = ("shown", "seen", "taken", "appears", "looking", "photographed")
"""Words that name nothing to draw (no object, attribute, place or style; toyworld's parser reads them as nothing)
but that an editor counts as content words, and so re-weights and blends as it does an attribute's words: the
placebo adds as many of them as the edit adds content words, so that both arms take the same editing path."""
NEUTRAL_FILLER = ("it", "is", "here", "this", "one", "that", "the")
"""Words no editor is expected to count as content (pronouns, auxiliaries, determiners): the rest of the placebo."""
CONTENT_STOP_WORDS = FUNCTION_WORDS | STOP_WORDS
"""Words an editor that declares no ``is_content`` is taken to carry along without naming anything: the project's
function words and prompt-to-prompt's stop words."""


def default_is_content(word: str) -> bool:
    """A word that names something, for an editor that does not say which words it treats as content."""
    return word.lower() not in CONTENT_STOP_WORDS


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def added_words(source: str, target: str) -> int:
    """Words of ``target`` that ``source`` does not have (as a multiset): how much text an edit adds or replaces."""
    return sum((Counter(_words(target)) - Counter(_words(source))).values())


def added_content_words(source: str, target: str, is_content: Callable[[str], bool] = default_is_content) -> int:
    """Content words (by ``is_content``) of ``target`` that ``source`` does not have, as a multiset."""
    new = Counter(_words(target)) - Counter(_words(source))
    return sum(n for w, n in new.items() if is_content(w))


def placebo_caption(source: str, target: str, is_content: Callable[[str], bool] = default_is_content) -> str | None:
    """``source`` with neutral sentences appended that add as many words as ``target`` adds to it, and among them as
    many content words (by the editor's ``is_content``): the same amount of caption change through the same editing
    path, naming nothing new. None when the target adds no word; ValueError when the editor counts every neutral
    content word as a stop word (or every filler as content), so that no placebo can match it."""
    n, c = added_words(source, target), added_content_words(source, target, is_content)
    if n == 0:
        return None
    content = [w for w in NEUTRAL_CONTENT if is_content(w)]
    filler = [w for w in NEUTRAL_FILLER if not is_content(w)]
    if (c and not content) or (n > c and not filler):
        raise ValueError("no neutral phrasing matches this editor's content words: it counts "
                         + ("every neutral word as a stop word" if c and not content else "every filler as content"))
    # A sentence per content word, with up to MOST_FILLERS fillers each; fillers left over make sentences of their own.
    per = _spread(min(n - c, MOST_FILLERS * c), c) if c else []
    left = n - c - sum(per)
    sentences = [_sentence(content[i % len(content)], f, filler) for i, f in enumerate(per)]
    sentences += [_sentence(None, f, filler) for f in [MOST_FILLERS] * (left // MOST_FILLERS) + [left % MOST_FILLERS]
                  if f]
    base = source.rstrip()
    return f"{base}{'' if base.endswith('.') else '.'} {' '.join(sentences)}"


def _spread(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal counts, the larger first."""
    return [total // parts + (i < total % parts) for i in range(parts)]


MOST_FILLERS = 4
"""Most filler words around one neutral content word ("this one is shown here.")."""
PATTERNS = {0: ([], []), 1: ([], ["here"]), 2: (["it", "is"], []), 3: (["it", "is"], ["here"]),
            4: (["this", "one", "is"], ["here"])}
"""Filler words before and after a sentence's content word, by how many fillers it has."""


def _sentence(word: str | None, fillers: int, filler: list[str]) -> str:
    """One neutral sentence: ``word`` (a neutral content word, or none) and ``fillers`` filler words around it ("it is
    shown.", "seen here.", "this one is taken here.", "it is here."), the editor's own fillers in turn where it counts
    one of these as content."""
    before, after = PATTERNS[fillers]
    words = [*before, *([word] if word else []), *after]
    if any(w not in filler for w in [*before, *after]):
        words = [filler[i % len(filler)] for i in range(fillers)] + ([word] if word else [])
    return " ".join(words) + "."


def control_for(editor: object, source: str, target: str) -> tuple[Control, str]:
    """The control edit of ``source`` -> ``target`` through ``editor``, and its caption: the placebo (matched to the
    editor's content words, ``is_content`` where it declares one), unless the editor declares that a neutral
    phrasing renders exactly as the unchanged caption (then the sham is the same control) or the target adds no
    word."""
    if getattr(editor, "sham_is_placebo", False):
        return ("sham", source)
    check = getattr(editor, "is_content", None)
    placebo = placebo_caption(source, target, check if callable(check) else default_is_content)
    return ("sham", source) if placebo is None else ("placebo", placebo)


class Flip(BaseModel):
    original: str = Field(description="Ref of the original image.")
    edited: str = Field(description="Ref of the edited image.")
    before: list[str] = Field(description="Top predictions before the edit.")
    after: list[str] = Field(description="Top predictions after the edit.")
    failed_before: bool
    failed_after: bool
    passed: dict[str, bool] = Field(default_factory=dict, description="Edit-quality filters passed, by name.")
    counted: bool = Field(True, description="Whether the pair counts in the paired test: the edit passed every "
                                            "quality filter.")
    sham: str | None = Field(None, description="Ref of the control-edited image (same editor; see `control`).")
    failed_sham: bool | None = Field(None, description="Whether the control-edited image fails.")
    control: Control | None = Field(None, description="'sham': the control edit kept the caption unchanged; "
                                                      "'placebo': it changed as much text, naming nothing new.")
    control_caption: str | None = Field(None, description="The control edit's target caption.")


class PairedCounts(BaseModel):
    """The counterfactual pairs a paired test may use, and those it may not."""

    pairs: int = Field(description="Pairs whose edit passed every quality filter: the paired test's sample.")
    to_failure: int = Field(description="Counted pairs classified correctly before the edit and wrongly after.")
    to_correct: int = Field(description="Counted pairs classified wrongly before the edit and correctly after.")
    failed_before: int = Field(description="Counted pairs that failed before the edit.")
    failed_after: int = Field(description="Counted pairs that failed after the edit.")
    excluded: int = Field(description="Pairs left out: their edit failed a quality filter.")
    excluded_by: dict[str, int] = Field(default_factory=dict, description="Excluded pairs by filter failed.")
    failed_sham: int | None = Field(None, description="Counted pairs whose sham edit fails.")
    sham_to_failure: int | None = Field(None, description="Counted pairs the sham edit alone turned into failures.")
    sham_to_correct: int | None = Field(None, description="Counted pairs the sham edit alone turned correct.")
    vs_sham_to_failure: int | None = Field(None, description="Counted pairs that fail edited and not sham-edited.")
    vs_sham_to_correct: int | None = Field(None, description="Counted pairs that fail sham-edited and not edited.")
    both_fail: int | None = Field(None, description="Counted pairs that fail both edited and sham-edited.")
    control: Control | None = Field(None, description="The control edit the pairs were compared with.")
    control_caption: str | None = None

    def note(self) -> str | None:
        """What a result says about its pairs beyond the sham: a placebo control, and edits left out."""
        out = []
        if self.excluded:
            by = ", ".join(f"{k} {v}" for k, v in sorted(self.excluded_by.items()))
            out.append(f"{self.excluded} of {self.excluded + self.pairs} edits failed the editor's quality filters "
                       f"({by}) and are left out of the paired test")
        if self.control == "placebo":
            out.append(f"control: a placebo edit, not a sham: each image also edited through the same editor to "
                       f"{self.control_caption!r} (as many words changed, nothing new named), so an editor's "
                       "reaction to any caption change is in both arms; 'sham' figures are this control's")
        return "; ".join(out) or None


def paired_counts(flips: list[Flip]) -> PairedCounts:
    kept = [f for f in flips if f.counted]
    by: dict[str, int] = {}
    for f in flips:
        if not f.counted:
            for name, ok in f.passed.items():
                if not ok:
                    by[name] = by.get(name, 0) + 1
    pc = PairedCounts(pairs=len(kept), to_failure=sum(not f.failed_before and f.failed_after for f in kept),
                      to_correct=sum(f.failed_before and not f.failed_after for f in kept),
                      failed_before=sum(f.failed_before for f in kept),
                      failed_after=sum(f.failed_after for f in kept),
                      excluded=len(flips) - len(kept), excluded_by=by)
    if kept and all(f.failed_sham is not None for f in kept):
        pc.failed_sham = sum(bool(f.failed_sham) for f in kept)
        pc.sham_to_failure = sum(not f.failed_before and bool(f.failed_sham) for f in kept)
        pc.sham_to_correct = sum(f.failed_before and not f.failed_sham for f in kept)
        pc.vs_sham_to_failure = sum(f.failed_after and not f.failed_sham for f in kept)
        pc.vs_sham_to_correct = sum(not f.failed_after and bool(f.failed_sham) for f in kept)
        pc.both_fail = sum(f.failed_after and bool(f.failed_sham) for f in kept)
        controls = {f.control for f in kept}
        if len(controls) == 1:
            pc.control = controls.pop()
            pc.control_caption = kept[0].control_caption
    return pc


# -- cost ---------------------------------------------------------------------------------------------------------


def editing_charge(inv: Investigation, images: list[np.ndarray]) -> int:
    """Images' worth that editing ``images`` (each once) costs: every distinct image inverted, every one edited."""
    cost = edit_cost(inv.backends.editor)
    distinct = len({hashlib.sha256(np.ascontiguousarray(im).tobytes()).digest() + repr(np.shape(im)).encode()
                    for im in images})
    return math.ceil(cost.inversion * distinct + cost.edit * len(images))


def counterfactual_size(inv: Investigation, asked: int, sham: bool = False) -> tuple[int, list[str]]:
    """How many fresh class images a counterfactual measurement edits, and what to say about it.

    Raises when the budget cannot pay for generating and editing them (checked before anything is spent).
    """
    cost = edit_cost(inv.backends.editor)
    n = min(asked, MAX_PAIRS)
    notes = []
    if cost.max_pairs is not None and cost.max_pairs < n:
        notes.append(f"the editor is costly ({cost.inversion:g} images per inversion, {cost.edit:g} per edit): "
                     f"{cost.max_pairs} pairs edited, not {n}")
        n = cost.max_pairs
    if cost.describe():
        notes.append(cost.describe())
    charge = math.ceil((1 + cost.inversion + cost.edit * (2 if sham else 1)) * n)
    if charge > inv.budget.left:
        raise ToolError(f"{BUDGET_EXHAUSTED}: {n} counterfactual pairs cost {charge} images' worth "
                        f"({n} generated, {charge - n} for editing), {inv.budget.left} of {inv.budget.images} left")
    return n, notes


# -- editing ------------------------------------------------------------------------------------------------------


def mcnemar_text(m: stats.McNemar) -> str:
    return f"McNemar: {m.b} flipped to failure, {m.c} back, p={pv(m.p_value)}"


def counterfactual_pairs(inv: Investigation, sample: Sample, source: str, target: str,
                         sham: bool = False) -> tuple[list[Flip], list[bool]]:
    """Edit every valid image of ``sample`` from ``source`` to ``target`` (and, with ``sham``, from ``source`` to
    itself) and classify the edits."""
    idx = [i for i, ok in enumerate(sample.valid) if ok]
    gens = sample.images(idx)
    return edit_and_classify(inv, gens, source, target, before=[sample.topk[i] for i in idx],
                             failed_before=[bool(sample.failed[i]) for i in idx], sham=sham)


def _edit(inv: Investigation, g: Generation, source: str, target: str) -> EditOutcome:
    editor = inv.backends.editor
    # Editors whose outcomes a re-run would not repeat bit for bit (a GPU diffusion model) or that are costly keep
    # them: a resumed run or a verification on this machine gets the same edit back.
    keep = inv.cache if getattr(editor, "cache_outcomes", False) else None
    key = edit_key(editor.id, g.image, source, target) if keep is not None else ""
    if keep is not None:
        hit = keep.get_edit(key)
        if hit is not None:
            return hit
    try:
        out = editor.edit(g, source, target)
    except BackendError as e:
        raise ToolError(f"edit failed: {e}") from None
    if keep is not None:
        keep.put_edit(key, out)
    return out


def edit_and_classify(inv: Investigation, gens: list[Generation], source: str, target: str, *,
                      before: list[list[str]] | None = None,
                      failed_before: list[bool] | None = None,
                      sham: bool = False) -> tuple[list[Flip], list[bool]]:
    """Edit ``gens`` (paid for first, at the editor's declared cost) and classify before and after; with ``sham``,
    also pass each image through the editor to the control caption (``control_for``: a placebo, or the caption
    unchanged), paid for too: one more edit per image."""
    images = [g.image for g in gens]
    try:
        control, control_caption = control_for(inv.backends.editor, source, target)
    except ValueError as e:
        raise ToolError(f"{target!r}: {e}, so its counterfactual has no control to test against") from None
    inv.budget.spend_editing(editing_charge(inv, images + images if sham else images))
    outcomes = []
    shams: list[EditOutcome] = []
    for i, g in enumerate(gens):
        outcomes.append(_edit(inv, g, source, target))
        if sham:
            shams.append(_edit(inv, g, source, control_caption))
        if inv.progress is not None:
            inv.progress("editing", i + 1, len(gens))
    labels = inv.labels
    k = max(inv.top_k, 1)

    def classify(images: list[np.ndarray]) -> tuple[list[list[str]], list[bool]]:
        logits = np.asarray(inv.backends.classifier.logits(images))
        order = np.argsort(-logits, axis=1)[:, :k]
        bad = failed_by_criterion(logits, inv.label, labels, inv.criterion, k=inv.top_k)
        return [[labels.labels[j] for j in row] for row in order], [bool(b) for b in bad]

    if before is None or failed_before is None:
        before, failed_before = classify([g.image for g in gens])
    after, failed_after = classify([o.image for o in outcomes])
    failed_sham: list[bool | None] = [None] * len(gens)
    if sham:
        _, failed_sham_known = classify([o.image for o in shams])
        failed_sham = list(failed_sham_known)
    flips = []
    for i, (g, o, b, a, fb, fa) in enumerate(zip(gens, outcomes, before, after, failed_before, failed_after)):
        original = inv.put_image(g)
        edited = inv.put_image(Generation(image=o.image, prompt=target, seed=g.seed, meta=o.meta))
        sham_ref = None
        if sham:
            s_out = shams[i]
            same = np.array_equal(np.asarray(s_out.image), np.asarray(g.image))
            sham_ref = original if same else inv.put_image(Generation(image=s_out.image, prompt=control_caption,
                                                                      seed=g.seed, meta=s_out.meta))
        flips.append(Flip(original=original, edited=edited, before=b, after=a, failed_before=fb,
                          failed_after=fa, passed=o.passed, counted=all(o.passed.values()),
                          sham=sham_ref, failed_sham=failed_sham[i], control=control if sham else None,
                          control_caption=control_caption if sham else None))
    return flips, failed_after
