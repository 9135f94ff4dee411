"""LANCE's quality controls on counterfactual edits (Prabhu et al.), scored with CLIP.

For each candidate edit (one per attention-injection schedule of the sweep), with CLIP features of the
reconstruction ``I1`` (the source row of the same prompt-to-prompt run: as LANCE does, the edit is judged against
what the inversion reproduces, so the inversion's own error is not counted as the edit's), the edit ``I2``, the
source caption ``T1`` and the target caption ``T2``:

- ``image_image``: cos(I1, I2) >= 0.7 — the edit is still the same picture;
- ``image_text``: cos(I1, T1) >= 0.2 and cos(I2, T2) >= 0.2 — each caption describes its image;
- ``directional``: cos(I2 - I1, T2 - T1) >= 0.2 — the image moved the way the caption moved;
- ``consistent``: the edit is closer to the words put in than to the words taken out (to the empty text when
  the edit only adds words, as LANCE's ``pred_consistency`` compares with an empty "original");
- ``class_word``: the words the edit replaces are not too close to the class name (CLIP text similarity
  below 0.5), else the edit may change the class itself instead of its context.

The sweep keeps the candidate with the highest directional similarity among those passing every filter
(the highest overall when none passes), and the outcome reports which filters it passed.

The thresholds are LANCE's, chosen with OpenAI's CLIP ViT-L/14; another CLIP model's similarities sit elsewhere
(docs/editing.md says how to check them).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sleuth.tools.backends.base import Image


class Scorer(Protocol):
    """What the controls need of a CLIP model (``tools.backends.clip.OpenClipModel`` is one)."""

    def encode_images(self, images: Sequence[Image]) -> np.ndarray:
        """L2-normalised image features ``(N, D)``."""
        ...

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        """L2-normalised text features ``(N, D)``."""
        ...


class QualityThresholds(BaseModel):
    """LANCE's filter thresholds (its defaults)."""

    model_config = ConfigDict(frozen=True)

    image_image: float = Field(0.7, description="Minimum CLIP similarity of the edit to the original image.")
    image_text: float = Field(0.2, description="Minimum CLIP similarity of each image to its caption.")
    directional: float = Field(0.2, description="Minimum CLIP directional similarity of the edit.")
    class_word: float = Field(0.5, description="Maximum CLIP text similarity of the replaced words to the class "
                                               "name.")


class EditScores(BaseModel):
    """CLIP's view of one candidate edit."""

    image_image: float
    source_text: float
    target_text: float
    directional: float
    consistency: float | None = Field(None, description="cos(I2, added words) - cos(I2, removed words); the removed "
                                                         "words of a pure addition are the empty text.")

    def passed(self, th: QualityThresholds) -> dict[str, bool]:
        out = {"image_image": self.image_image >= th.image_image,
               "image_text": min(self.source_text, self.target_text) >= th.image_text,
               "directional": self.directional >= th.directional}
        if self.consistency is not None:
            out["consistent"] = self.consistency > 0
        return out


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return 0.0 if na < 1e-12 or nb < 1e-12 else float(a @ b / (na * nb))


def score_edits(scorer: Scorer, reference: Image, edits: Sequence[Image], source: str, target: str,
                removed: Sequence[str] = (), added: Sequence[str] = ()) -> list[EditScores]:
    """CLIP scores of each candidate edit from caption ``source`` to ``target``; ``reference`` is the image the
    edits are compared with (the reconstruction of the original)."""
    imgs = scorer.encode_images([reference, *edits])
    words = [" ".join(removed), " ".join(added)] if removed or added else []
    txt = scorer.encode_texts([source, target, *words])
    i1, t1, t2 = imgs[0], txt[0], txt[1]
    out = []
    for i2 in imgs[1:]:
        out.append(EditScores(image_image=_cos(i1, i2), source_text=_cos(i1, t1), target_text=_cos(i2, t2),
                              directional=_cos(i2 - i1, t2 - t1),
                              consistency=_cos(i2, txt[3]) - _cos(i2, txt[2]) if words else None))
    return out


def choose(scores: Sequence[EditScores], th: QualityThresholds) -> int:
    """Index of the sweep's pick: best directional similarity among full passes, else overall."""
    if not scores:
        raise ValueError("no candidate edits to choose from")
    passing = [i for i, s in enumerate(scores) if all(s.passed(th).values())]
    pool = passing or list(range(len(scores)))
    return max(pool, key=lambda i: scores[i].directional)


def find_class(caption: str, class_names: Sequence[str]) -> str | None:
    """The class named in ``caption`` (the longest name that appears as whole words), if any."""
    low = caption.lower()
    for name in sorted(class_names, key=len, reverse=True):
        if re.search(rf"(?<![\w-]){re.escape(name.lower())}(?![\w-])", low):
            return name
    return None


def class_word_check(removed: Sequence[str], class_name: str | None, th: QualityThresholds,
                     scorer: Scorer | None = None) -> tuple[bool | None, float | None]:
    """(passed, similarity) of the class-word filter; ``(None, None)`` when it does not apply.

    Pure additions (nothing replaced) pass, as in LANCE. Without a CLIP model only an exact word overlap
    with the class name fails.
    """
    if class_name is None or not removed:
        return None, None
    phrase = " ".join(removed).strip(" ,.").lower()
    if scorer is None:
        overlap = set(re.findall(r"[\w-]+", phrase)) & set(re.findall(r"[\w-]+", class_name.lower()))
        return not overlap, None
    f = scorer.encode_texts([phrase, class_name.lower()])
    sim = _cos(f[0], f[1])
    return sim < th.class_word, sim
