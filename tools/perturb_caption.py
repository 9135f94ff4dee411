"""Perturb a caption into new hypotheses that keep the class (LANCE), and refine it (Wiles et al.).

LANCE edit types: subject (how the class object looks), object (another object in the scene), background,
adjective (colours), domain (image style). Refinements: each sentence alone with the class prompt, and the caption
with its adjectives dropped — the shortest caption that keeps an effect is the clearest finding. Offline the edits
come from a vocabulary (the backend set's, or a built-in one modelled on the Dataset Interfaces shifts); with an LLM
configured they come from the LLM and are validated. Edits that drop the class or name another class are rejected.
"""

from __future__ import annotations

import hashlib
import json
import re
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from sleuth.tools.backends.base import Vocabulary
from sleuth.tools.common import investigation
from sleuth.tools.context import ToolContext
from sleuth.tools.investigation import join_sentences, split_sentences
from sleuth.tools.registry import ToolError
from sleuth.tools.text import MAX_ITEMS, Line, quote

NAME = "perturb_caption"

EditType = Literal["subject", "object", "background", "adjective", "domain"]
ALL_TYPES: tuple[EditType, ...] = ("subject", "object", "background", "adjective", "domain")


class Args(BaseModel):
    caption: str = Field(description="The caption to perturb; it must name the class under audit.")
    types: list[EditType] = Field(default_factory=lambda: list(ALL_TYPES), description="LANCE edit types wanted.")
    n: int = Field(2, ge=1, le=20, description="Most edits per type.")
    refinements: bool = Field(True, description="Also return Wiles et al.'s refinements (single sentences, "
                                                "adjectives dropped).")


class Edit(BaseModel):
    type: str = Field(description="LANCE type, or 'single_sentence' / 'drop_adjectives' for refinements.")
    edit: str = Field(description="What changed, e.g. 'snow -> sand'.")
    caption: str


class Result(BaseModel):
    caption: str
    edits: list[Edit]
    refinements: list[Edit]
    rejected: list[str] = Field(default_factory=list, description="Proposed captions refused, with the reason.")
    source: str = Field(description="'vocabulary' or 'llm'.")


def builtin_vocabulary() -> Vocabulary:
    data = json.loads(resources.files("sleuth.prompts").joinpath("perturbations.json").read_text())
    return Vocabulary(**{k: v for k, v in data.items() if not k.startswith("_")})


def _rotation(caption: str, kind: str, words: list[str]) -> list[str]:
    """The vocabulary in a stable, caption-dependent order, so different captions try different words."""
    if not words:
        return []
    h = int(hashlib.sha256(f"{kind}|{caption}".encode()).hexdigest(), 16) % len(words)
    return words[h:] + words[:h]


def _find(words: list[str], text: str) -> str | None:
    for w in sorted(words, key=len, reverse=True):
        if re.search(rf"\b{re.escape(w)}\b", text, flags=re.IGNORECASE):
            return w
    return None


def _swap(caption: str, old: str, new: str) -> str:
    return re.sub(rf"\b{re.escape(old)}\b", new, caption, count=1, flags=re.IGNORECASE)


def vocabulary_edits(caption: str, label: str, vocab: Vocabulary, types: list[EditType], n: int) -> list[Edit]:
    sentences = split_sentences(caption)
    edits: list[Edit] = []

    def swap_or_add(kind: str, words: list[str], add: str) -> None:
        present = _find(words, caption)
        made = 0
        for w in _rotation(caption, kind, [w for w in words if w != present]):
            if made == n:
                break
            if present is not None:
                edits.append(Edit(type=kind, edit=f"{present} -> {w}", caption=_swap(caption, present, w)))
            else:
                edits.append(Edit(type=kind, edit=f"+ {w}", caption=join_sentences([*sentences, add.format(w=w)])))
            made += 1

    for kind in types:
        if kind == "background":
            swap_or_add(kind, vocab.background + vocab.lighting, "it is {w}")
        elif kind == "object":
            swap_or_add(kind, vocab.object, "there is {w} next to it")
        elif kind == "adjective":
            present = _find(vocab.adjective, caption)
            for w in _rotation(caption, kind, [w for w in vocab.adjective if w != present])[:n]:
                new = (_swap(caption, present, w) if present is not None
                       else re.sub(rf"\b(a|an|the) {re.escape(label)}\b", rf"\1 {w} {label}", caption, count=1))
                edits.append(Edit(type=kind, edit=f"{present or ''} -> {w}".strip(), caption=new))
        elif kind == "domain":
            present = _find(vocab.domain + ["realistic photograph", "photograph", "photo"], sentences[0])
            for w in _rotation(caption, kind, [w for w in vocab.domain if w != present])[:n]:
                if present is None:
                    new = join_sentences([f"a {w} of {sentences[0]}", *sentences[1:]])
                else:
                    new = _swap(caption, present, w)
                edits.append(Edit(type=kind, edit=f"{present or ''} -> {w}".strip(), caption=new))
        elif kind == "subject":
            for w in _rotation(caption, kind, vocab.subject)[:n]:
                new = re.sub(rf"\b(a|an|the) {re.escape(label)}\b", rf"\1 {w} {label}", caption, count=1)
                edits.append(Edit(type=kind, edit=f"+ {w}", caption=new))
    return [e for e in edits if e.caption != caption]


def refinements(caption: str, vocab: Vocabulary) -> list[Edit]:
    """Wiles et al.'s rewrites: each sentence alone with the class sentence; adjectives dropped."""
    sentences = split_sentences(caption)
    out: list[Edit] = []
    if len(sentences) > 2:
        for s in sentences[1:]:
            out.append(Edit(type="single_sentence", edit=f"keep only {s!r}", caption=join_sentences([sentences[0], s])))
    stripped = caption
    for adj in vocab.adjective:
        stripped = re.sub(rf"\b{re.escape(adj)}\s+", "", stripped, flags=re.IGNORECASE)
    if stripped != caption:
        out.append(Edit(type="drop_adjectives", edit="adjectives dropped", caption=stripped))
    return out


def check(caption: str, label: str, labels: tuple[str, ...]) -> str | None:
    """Why an edited caption is refused, or None."""
    text = caption.lower()
    if not re.search(rf"\b{re.escape(label.lower())}\b", text):
        return f"drops the class {label!r}"
    for other in labels:
        named = re.search(rf"\b{re.escape(other.lower())}\b", text)
        if other != label and other.lower() not in label.lower() and named:
            return f"names another class {other!r}"
    return None


class _LLMReply(BaseModel):
    edits: list[Edit]


def llm_edits(llm: Any, caption: str, label: str, labels: tuple[str, ...], types: list[EditType], n: int) -> list[Edit]:
    template = resources.files("sleuth.prompts").joinpath("perturb_caption.md").read_text()
    # The caption is model-written data: it must not be able to close its own delimiter in the prompt.
    caption = caption.replace("CAPTION>>>", "CAPTION> > >").replace("<<<CAPTION", "< < <CAPTION")
    prompt = template.format(label=label, n=n, types=", ".join(types), caption=caption,
                             other_labels=", ".join(x for x in labels if x != label))
    reply = llm(prompt)
    text = reply.strip()
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    try:
        return _LLMReply.model_validate_json(text).edits
    except ValidationError as e:
        raise ToolError("the LLM's perturbations were not valid JSON of the expected form: "
                        f"{e.errors()[0]['msg']}") from None


def summary(r: Result) -> str:
    edits = [quote(e.caption) for e in [*r.edits, *r.refinements][:6]]
    return f"{len(r.edits) + len(r.refinements)} rewrites of {quote(r.caption)}: {'; '.join(edits) or 'none'}"


def render(r: Result) -> list[Line]:
    both = [*r.edits, *r.refinements]
    lines: list[Line] = [[(f"{len(r.edits)} edits, {len(r.refinements)} refinements ({r.source})", "bold")]]
    lines += [[(f"{e.type}: ", "key"), (e.edit, "")] for e in both[:MAX_ITEMS]]
    if len(both) > MAX_ITEMS:
        lines.append([(f"… +{len(both) - MAX_ITEMS}", "dim")])
    if r.rejected:
        lines.append([(f"{len(r.rejected)} refused (dropped the class or named another)", "dim")])
    return lines


def replayable(r: Result) -> bool:
    """Edits a language model proposed cannot be made again offline (they change no state, so they need not be)."""
    return r.source != "llm"


def run(args: Args, ctx: ToolContext) -> Result:
    inv = investigation(ctx)
    label = inv.label
    labels = inv.labels.labels
    if check(args.caption, label, labels) is not None:
        raise ToolError(f"the caption must name the class {label!r} and no other class: {args.caption!r}")
    vocab = inv.backends.vocabulary
    if not any([vocab.background, vocab.object, vocab.adjective, vocab.domain, vocab.subject]):
        vocab = builtin_vocabulary()
    llm = ctx.llm
    if llm is not None:
        proposed, source = llm_edits(llm, args.caption, label, labels, args.types, args.n), "llm"
    else:
        proposed, source = vocabulary_edits(args.caption, label, vocab, args.types, args.n), "vocabulary"
    kept: list[Edit] = []
    rejected: list[str] = []
    for e in proposed:
        why = check(e.caption, label, labels)
        if why is None:
            kept.append(e)
        else:
            rejected.append(f"{e.caption!r}: {why}")
    refs = refinements(args.caption, vocab) if args.refinements else []
    return Result(caption=args.caption, edits=kept, refinements=refs, rejected=rejected, source=source)
