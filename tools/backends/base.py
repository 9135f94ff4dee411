"""Backend interfaces: the only things tools know about models.

A backend turns prompts into images, images into labels, captions and features, or an image
and a caption change into an edited image. Backends know nothing of planning or transcripts.
Images cross this boundary as ``uint8`` RGB arrays of shape ``(H, W, 3)``.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
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


def edit_cost(editor: Editor) -> EditCost:
    """The editor's declared ``cost``; one image per edit when it declares none."""
    cost = getattr(editor, "cost", None)
    return cost if isinstance(cost, EditCost) else EditCost()


@runtime_checkable
class Editor(Protocol):
    """Edits an image into a counterfactual. May declare ``cost`` (an :class:`EditCost`) and ``cache_outcomes``
    (True: its outcomes are not bit-reproducible, e.g. a GPU diffusion model, or are costly, so the investigation
    keeps them by image and captions and a re-run reuses them)."""

    id: str

    def edit(self, generation: Generation, source_caption: str, target_caption: str) -> EditOutcome:
        """Edit the same image so that it matches ``target_caption`` instead of ``source_caption``."""
        ...


@dataclass
class Vocabulary:
    """Words the offline caption perturbations may use, by LANCE edit type."""

    subject: list[str] = field(default_factory=list)
    object: list[str] = field(default_factory=list)
    background: list[str] = field(default_factory=list)
    adjective: list[str] = field(default_factory=list)
    domain: list[str] = field(default_factory=list)
    lighting: list[str] = field(default_factory=list)


@dataclass
class Backends:
    """The set of models one investigation runs on."""

    generator: Generator
    classifier: Classifier
    captioner: Captioner
    embedder: Embedder
    editor: Editor
    vocabulary: Vocabulary = field(default_factory=Vocabulary)
    class_prompt: str = "a realistic photograph of a {label}"
    """Template of the prompt that asks the generator for a class."""

    @property
    def ids(self) -> dict[str, str]:
        return {
            "generator": self.generator.id,
            "classifier": self.classifier.id,
            "captioner": self.captioner.id,
            "embedder": self.embedder.id,
            "editor": self.editor.id,
        }

    def prompt_for(self, label: str) -> str:
        return self.class_prompt.format(label=label)
