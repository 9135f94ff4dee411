"""Backend interfaces: the only things tools know about models.

A backend turns prompts into images, images into labels, captions and features, or an image
and a caption change into an edited image. Backends know nothing of planning or transcripts.
Images cross this boundary as ``uint8`` RGB arrays of shape ``(H, W, 3)``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

Image = np.ndarray
"""An RGB image, ``uint8``, shape ``(H, W, 3)``."""


class BackendError(Exception):
    """A problem the user can fix (missing weights, unknown model, image a backend cannot edit).

    The message is one or two plain sentences naming the model and the remedy.
    """


@dataclass(frozen=True)
class LabelSpace:
    """The classifier's labels and their parent groups (a small hierarchy)."""

    labels: tuple[str, ...]
    parents: dict[str, str] = field(default_factory=dict)

    def index(self, label: str) -> int:
        try:
            return self.labels.index(label)
        except ValueError:
            raise BackendError(self.unknown_message(label)) from None

    def parent(self, label: str) -> str | None:
        return self.parents.get(label)

    def same_parent(self, a: str, b: str) -> bool:
        pa = self.parents.get(a)
        return a == b or (pa is not None and pa == self.parents.get(b))

    def closest(self, name: str, n: int = 3) -> list[str]:
        return difflib.get_close_matches(name, self.labels, n=n, cutoff=0.4)

    def unknown_message(self, label: str) -> str:
        near = self.closest(label)
        hint = f" Did you mean: {', '.join(near)}?" if near else ""
        if len(self.labels) <= 30:  # a toy world's classes fit on the line; ImageNet's thousand do not
            hint += f" Classes: {', '.join(self.labels)}."
        return f"unknown class {label!r}.{hint}"


@dataclass
class Generation:
    """One generated image and what the generator can say about it."""

    image: Image
    prompt: str
    seed: int
    valid: bool = True
    """False when the image is unusable (e.g. blacked out by a safety checker): not a failure."""
    unrendered: tuple[str, ...] = ()
    """Words of the prompt the generator could not render (its prompt adherence)."""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class EditOutcome:
    """A counterfactual edit of one image."""

    image: Image
    source_caption: str
    target_caption: str
    scores: dict[str, float] = field(default_factory=dict)
    """Quality scores (e.g. CLIP image-image, image-text, directional similarity)."""
    passed: dict[str, bool] = field(default_factory=dict)
    """Which quality filters the edit passed, by name."""
    unrendered: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Generator(Protocol):
    id: str

    def generate(self, prompts: Sequence[str], seeds: Sequence[int]) -> list[Generation]:
        """One image per (prompt, seed) pair; the same pair always gives the same image."""
        ...


@runtime_checkable
class Classifier(Protocol):
    id: str
    labels: LabelSpace

    def logits(self, images: Sequence[Image]) -> np.ndarray:
        """Float array ``(N, len(labels))``."""
        ...


@runtime_checkable
class Captioner(Protocol):
    id: str

    def captions(self, images: Sequence[Image], class_prompt: str) -> list[list[str]]:
        """Candidate caption sentences for each image, conditioned on the class prompt."""
        ...

    def sentence_loglik(self, images: Sequence[Image], sentence: str, class_prompt: str) -> np.ndarray:
        """Log-likelihood of ``sentence`` for each image, shape ``(N,)``."""
        ...


@runtime_checkable
class Embedder(Protocol):
    id: str

    def embed(self, images: Sequence[Image]) -> np.ndarray:
        """L2-normalised features, shape ``(N, D)``."""
        ...


@dataclass(frozen=True)
class EditCost:
    """What an editor's work costs, in images (one generated image = 1), declared by the editor and charged to the
    investigation's image budget before the work starts.

    The charge depends on the call only (how many images, how many edits), never on what a cache holds: a
    resumed or re-verified run must spend exactly what the original did.
    """

    inversion: float = 0.0
    """Per distinct image a call edits (the Stable Diffusion editor inverts each one first)."""
    edit: float = 1.0
    """Per edit (toyworld renders one image)."""
    max_pairs: int | None = None
    """Most images a counterfactual measurement edits; None: the measurement's own limit."""
    basis: str = ""
    """What one image is, when it is not simply one image the editor renders (e.g. "images of the generator: 50
    UNet passes each"); results that charge editing say it."""

    def describe(self) -> str:
        """The charges in words, for results: empty for an editor that charges one rendered image per edit."""
        if not self.basis:
            return ""
        return f"editing is charged {self.inversion:g} per inversion and {self.edit:g} per edit, {self.basis}"


def edit_cost(editor: Editor) -> EditCost:
    """The editor's declared ``cost``; one image per edit when it declares none."""
    cost = getattr(editor, "cost", None)
    return cost if isinstance(cost, EditCost) else EditCost()


@runtime_checkable
class Editor(Protocol):
    """Edits an image into a counterfactual. May declare ``cost`` (an :class:`EditCost`) and ``cache_outcomes``
    (True: its outcomes are not bit-reproducible, e.g. a GPU diffusion model, or are costly, so the investigation
    keeps them by image and captions and a re-run reuses them), and ``sham_is_placebo`` (True: its output depends on
    a caption only through what the caption names, so an edit to a neutral rephrasing gives the image an unchanged
    caption gives, and the counterfactual test may use the sham edit as its control; see tools/counterfactual.py),
    and ``is_content(word)`` (the words it treats as naming something, re-weighting or blending them: the placebo
    control adds as many of those as the edit does)."""

    id: str

    def edit(self, generation: Generation, source_caption: str, target_caption: str) -> EditOutcome:
        """Edit the same image so that it matches ``target_caption`` instead of ``source_caption``."""
        ...


class GeneratorView:
    """A generator as tools hold it: its id, ``generate``, and the prompt words it cannot render.

    The views below keep the implementation in the closures of their callables, never in an attribute, so nothing
    reachable from a tool's context leads to what stands behind an interface (for toyworld: the world config with its
    priors and planted bugs). ``unrendered`` is the text-side feedback a text encoder gives without drawing anything;
    a generator that cannot tell reports no word.
    """

    __slots__ = ("cacheable", "generate", "id", "unrendered")

    def __init__(self, impl: Generator) -> None:
        self.id: str = impl.id
        self.cacheable: bool = bool(getattr(impl, "cacheable", True))
        self.generate: Callable[[Sequence[str], Sequence[int]], list[Generation]] = (
            lambda prompts, seeds: impl.generate(prompts, seeds))
        check = getattr(impl, "unrendered", None)
        if callable(check):
            self.unrendered: Callable[[Sequence[str]], list[tuple[str, ...]]] = (
                lambda prompts: [tuple(words) for words in check(prompts)])
        else:
            self.unrendered = lambda prompts: [() for _ in prompts]


class ClassifierView:
    """A classifier as tools hold it: id, labels and logits."""

    __slots__ = ("cacheable", "id", "labels", "logits")

    def __init__(self, impl: Classifier) -> None:
        self.id: str = impl.id
        self.labels: LabelSpace = impl.labels
        self.cacheable: bool = bool(getattr(impl, "cacheable", True))
        self.logits: Callable[[Sequence[Image]], np.ndarray] = lambda images: impl.logits(images)


class CaptionerView:
    """A captioner as tools hold it: id, captions and sentence log-likelihoods."""

    __slots__ = ("captions", "id", "sentence_loglik")

    def __init__(self, impl: Captioner) -> None:
        self.id: str = impl.id
        self.captions: Callable[[Sequence[Image], str], list[list[str]]] = (
            lambda images, class_prompt: impl.captions(images, class_prompt))
        self.sentence_loglik: Callable[[Sequence[Image], str, str], np.ndarray] = (
            lambda images, sentence, class_prompt: impl.sentence_loglik(images, sentence, class_prompt))


class EmbedderView:
    """An embedder as tools hold it: id and embed."""

    __slots__ = ("embed", "id")

    def __init__(self, impl: Embedder) -> None:
        self.id: str = impl.id
        self.embed: Callable[[Sequence[Image]], np.ndarray] = lambda images: impl.embed(images)


class EditorView:
    """An editor as tools hold it: id, edit, and what it declares (its cost, whether its outcomes are kept, whether
    its sham edit is as good a control as a placebo)."""

    __slots__ = ("cache_outcomes", "cost", "edit", "id", "is_content", "sham_is_placebo")

    def __init__(self, impl: Editor) -> None:
        self.id: str = impl.id
        self.cost: EditCost = edit_cost(impl)
        self.cache_outcomes: bool = bool(getattr(impl, "cache_outcomes", False))
        self.sham_is_placebo: bool = bool(getattr(impl, "sham_is_placebo", False))
        check = getattr(impl, "is_content", None)
        self.is_content: Callable[[str], bool] | None = (lambda word: bool(check(word))) if callable(check) else None
        self.edit: Callable[[Generation, str, str], EditOutcome] = (
            lambda generation, source, target: impl.edit(generation, source, target))


_VIEWS: dict[str, type] = {"generator": GeneratorView, "classifier": ClassifierView, "captioner": CaptionerView,
                           "embedder": EmbedderView, "editor": EditorView}
COMPONENTS = tuple(_VIEWS)


def view(slot: str, impl: Any) -> Any:
    """``impl`` behind the interface view of ``slot`` (a view already is one)."""
    cls = _VIEWS[slot]
    return impl if isinstance(impl, cls) else cls(impl)


class Backends:
    """The set of models one investigation runs on, as tools see them: every component is a view (above).

    Built in one place for every backend kind (toyworld, real models, test fakes): whatever is passed in or assigned
    later is wrapped, so a tool never holds an implementation. Benchmarks and the oracle that need a world's ground
    truth load the world themselves.
    """

    __slots__ = ("captioner", "class_prompt", "classifier", "editor", "embedder", "generator")
    generator: GeneratorView
    classifier: ClassifierView
    captioner: CaptionerView
    embedder: EmbedderView
    editor: EditorView
    class_prompt: str
    """Template of the prompt that asks the generator for a class."""

    def __init__(self, generator: Any, classifier: Any, captioner: Any, embedder: Any, editor: Any,
                 class_prompt: str = "a realistic photograph of a {label}") -> None:
        for slot, impl in zip(COMPONENTS, (generator, classifier, captioner, embedder, editor)):
            setattr(self, slot, impl)
        self.class_prompt = class_prompt

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, view(name, value) if name in _VIEWS else value)

    def __repr__(self) -> str:
        return f"Backends({', '.join(f'{k}={v!r}' for k, v in self.ids.items())})"

    @property
    def ids(self) -> dict[str, str]:
        return {slot: getattr(self, slot).id for slot in COMPONENTS}

    def prompt_for(self, label: str) -> str:
        return self.class_prompt.format(label=label)
