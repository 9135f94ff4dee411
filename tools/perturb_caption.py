"""Perturb a caption into new hypotheses that keep the class (LANCE), and refine it (Wiles et al.).

LANCE edit types: subject (the class object's size, age, pose, viewpoint), object (another object in the scene),
background (place, weather, lighting), adjective (colour, material), domain (image style). Refinements: each sentence
alone with the class prompt, and the caption with its adjectives dropped — the shortest caption that keeps an effect
is the clearest finding. Offline the edits come from a general vocabulary (Dataset Interfaces shift families and
LANCE edit types, the same whatever the models); with an LLM configured they come from the LLM and are validated.
Edits that drop the class or name another class are rejected; edits whose new words the generator reports it cannot
render are left out, since they would test nothing.
"""

from __future__ import annotations

import hashlib
import re
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from sleuth.tools.common import investigation
from sleuth.tools.context import ToolContext
from sleuth.tools.investigation import join_sentences, split_sentences
from sleuth.tools.registry import ToolError
from sleuth.tools.text import MAX_ITEMS, Line, quote
from sleuth.tools.vocabulary import ALL_TYPES, EditType, Group, PerturbationVocabulary, general_vocabulary

NAME = "perturb_caption"

MAX_CONTEXT = 20
LLM_PER_TYPE = 6
"""Most edits of each type asked of a language model (its rewrites add to the vocabulary's, whatever ``n`` is)."""

__all__ = ["ALL_TYPES", "Args", "Edit", "EditType", "Result", "run"]

FUNCTION_WORDS = frozenset({
    "a", "an", "the", "of", "in", "on", "at", "to", "by", "with", "from", "for", "into", "onto", "under", "over",
    "near", "next", "beside", "behind", "among", "against", "and", "or", "it", "its", "is", "are", "there", "this",
    "that", "as",
})
"""Words an edit may add without changing what is drawn: an edit whose other new words are all unrendered is a no-op."""


class Args(BaseModel):
    caption: str = Field(description="The caption to perturb; it must name the class under audit.")
    types: list[EditType] = Field(default_factory=lambda: list(ALL_TYPES), description="LANCE edit types wanted.")
    n: int = Field(2, ge=1, le=100, description="Most edits per type.")
    refinements: bool = Field(True, description="Also return Wiles et al.'s refinements (single sentences, "
                                                "adjectives dropped).")
    rendered_only: bool = Field(True, description="Leave out edits whose new words the generator reports it cannot "
                                                  "render (they would test nothing).")
    context: list[str] = Field(default_factory=list, max_length=MAX_CONTEXT, description=(
        "Captions of the class's failed images (from caption_failures): with a language model configured, what its "
        "proposals may build on."))


class Edit(BaseModel):
    type: str = Field(description="LANCE type, or 'single_sentence' / 'drop_adjectives' for refinements.")
    edit: str = Field(description="What changed, e.g. 'in a kitchen -> in a garden'.")
    caption: str
    source: Literal["vocabulary", "llm"] = Field("vocabulary", description="Who proposed it.")


class Result(BaseModel):
    caption: str
    edits: list[Edit]
    refinements: list[Edit]
    rejected: list[str] = Field(default_factory=list, description="Proposed captions refused, with the reason.")
    not_rendered: list[str] = Field(default_factory=list,
                                    description="Edits left out because the generator cannot render their new words.")
    source: str = Field(description="'vocabulary', or 'llm+vocabulary' (the LLM's rewrites first, then the "
                                    "vocabulary's).")
    notes: list[str] = Field(default_factory=list)


# -- offline edits from the general vocabulary ---------------------------------------------------------------


def _rotation(caption: str, kind: str, words: list[str]) -> list[str]:
    """The phrases in a stable, caption-dependent order, so different captions try different phrases first."""
    if not words:
        return []
    h = int(hashlib.sha256(f"{kind}|{caption}".encode()).hexdigest(), 16) % len(words)
    return words[h:] + words[:h]


def _find(phrases: list[str] | tuple[str, ...], text: str) -> str | None:
    """The longest phrase present in ``text`` as whole words, as written in ``text``."""
    for p in sorted(phrases, key=len, reverse=True):
        m = re.search(rf"\b{re.escape(p)}\b", text, flags=re.IGNORECASE)
        if m:
            return m.group(0)
    return None


def _swap(caption: str, old: str, new: str) -> str:
    return re.sub(rf"\b{re.escape(old)}\b", lambda _: new, caption, count=1, flags=re.IGNORECASE)


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def _noun_phrase(caption: str, label: str) -> re.Match[str] | None:
    """The first '<article> <modifiers> <label>' of the caption (modifiers: up to four words, no articles)."""
    mods = r"(?:(?!(?:a|an|the|of)\b)[\w'-]+\s+){0,4}?"
    return re.search(rf"\b(?P<art>a|an|the)\s+(?P<mods>{mods})(?P<label>{re.escape(label)})\b", caption,
                     flags=re.IGNORECASE)


def _with_modifier(caption: str, label: str, word: str) -> str | None:
    """``word`` inserted right before the class noun, the article made to agree."""
    m = _noun_phrase(caption, label)
    if m is None:
        return None
    art = m.group("art")
    if not m.group("mods") and art.lower() in ("a", "an"):
        art = _article(word)
    return f"{caption[:m.start()]}{art} {m.group('mods')}{word} {caption[m.start('label'):]}"


def _present_modifier(caption: str, label: str, phrases: tuple[str, ...]) -> str | None:
    m = _noun_phrase(caption, label)
    if m is not None and m.group("mods"):
        found = _find(phrases, m.group("mods"))
        if found:
            return found
    after = re.search(rf"\b(?:{re.escape(label)}|it)\s+is\s+(.+?)(?:[.;]|$)", caption, flags=re.IGNORECASE)
    return _find(phrases, after.group(1)) if after else None


RELATIONS = ("next to", "in front of", "in", "on", "at", "under", "by", "near", "beside", "behind", "with", "among",
             "against", "during", "inside", "over", "above", "below")
"""Prepositions that may open a place or object phrase: captions say "in the grass" where a phrase says "on"."""
_RELATION = "|".join(re.escape(r) for r in sorted(RELATIONS, key=len, reverse=True))


def _core(phrase: str) -> str:
    """'next to a bicycle' -> 'bicycle', 'in a snowy field' -> 'snowy field': what a caption may name its own way."""
    core = re.sub(rf"^(?:(?:{_RELATION})\s+)?(?:(?:a|an|the)\s+)?", "", phrase, flags=re.IGNORECASE)
    return core or phrase


def _present_suffix(caption: str, label: str, phrases: tuple[str, ...]) -> re.Match[str] | None:
    """Where the caption already names one of ``phrases`` (with whatever relation and article), longest first;
    never inside the class name ('snow' is no place in 'a snow leopard')."""
    spans = [m.span() for m in re.finditer(rf"\b{re.escape(label)}\b", caption, flags=re.IGNORECASE)]
    for core in sorted({_core(p) for p in phrases}, key=len, reverse=True):
        for m in re.finditer(rf"(?:\b(?P<rel>{_RELATION})\s+)?(?:\b(?:a|an|the)\s+)?\b{re.escape(core)}\b", caption,
                             flags=re.IGNORECASE):
            if not any(m.start() < end and start < m.end() for start, end in spans):
                return m
    return None


def _without_relation(phrase: str) -> str:
    """'next to a bicycle' -> 'a bicycle', 'wearing a hat' -> 'a hat': for a caption that names the object in a
    relation of its own ("there is a person next to it")."""
    m = re.search(r"\b(?:a|an|the)\s+.+$", phrase, flags=re.IGNORECASE)
    return m.group(0) if m else re.sub(rf"^(?:{_RELATION})\s+", "", phrase, flags=re.IGNORECASE)


def _group_edits(caption: str, label: str, group: Group) -> list[Edit]:
    sentences = split_sentences(caption)
    head = sentences[0] if sentences else caption
    phrases = list(group.phrases)
    out: list[Edit] = []
    if group.slot == "prefix":
        m = re.match(rf"\s*(?P<pre>.+?\bof)\s+(?:a|an|the)\s+(?:[\w'-]+\s+){{0,4}}?{re.escape(label)}\b", head,
                     flags=re.IGNORECASE)
        for p in _rotation(caption, group.name, phrases):
            if m is None:
                out.append(Edit(type=group.type, edit=f"+ {p}",
                                caption=join_sentences([f"{p} {head}", *sentences[1:]])))
            elif p.lower() != m.group("pre").lower():
                out.append(Edit(type=group.type, edit=f"{m.group('pre')} -> {p}",
                                caption=caption[:m.start("pre")] + p + caption[m.end("pre"):]))
    elif group.slot == "modifier":
        present = _present_modifier(caption, label, group.phrases)
        for p in _rotation(caption, group.name, phrases):
            if present is None:
                inserted = _with_modifier(caption, label, p)
                if inserted is not None:
                    out.append(Edit(type=group.type, edit=f"+ {p}", caption=inserted))
            elif p.lower() != present.lower():
                out.append(Edit(type=group.type, edit=f"{present} -> {p}", caption=_swap(caption, present, p)))
    else:
        found = _present_suffix(caption, label, group.phrases)
        for p in _rotation(caption, group.name, phrases):
            if found is None:
                new, what = join_sentences([f"{head} {p}", *sentences[1:]]), f"+ {p}"
            elif _core(p).lower() == _core(found.group(0)).lower():
                continue
            else:
                # "it is in the grass" -> "it is on a beach"; "there is a person next to it" -> "there is a dog ...";
                # "underwater" -> "on a beach"
                bare_noun = not found.group("rel") and re.match(r"(?:a|an|the)\s", found.group(0), flags=re.IGNORECASE)
                repl = _without_relation(p) if bare_noun else p
                new, what = caption[:found.start()] + repl + caption[found.end():], f"{found.group(0)} -> {repl}"
            out.append(Edit(type=group.type, edit=what, caption=new))
    return out


def vocabulary_edits(caption: str, label: str, vocab: PerturbationVocabulary, types: list[EditType]) -> list[Edit]:
    """Every single-phrase edit of the requested types; within a type, the groups take turns."""
    edits: list[Edit] = []
    for kind in types:
        queues = [_group_edits(caption, label, g) for g in vocab.of_type(kind)]
        while any(queues):
            for q in queues:
                if q:
                    edits.append(q.pop(0))
    return [e for e in edits if e.caption != caption]


def refinements(caption: str, vocab: PerturbationVocabulary) -> list[Edit]:
    """Wiles et al.'s rewrites: each sentence alone with the class sentence; adjectives dropped."""
    sentences = split_sentences(caption)
    out: list[Edit] = []
    if len(sentences) > 2:
        for s in sentences[1:]:
            out.append(Edit(type="single_sentence", edit=f"keep only {s!r}", caption=join_sentences([sentences[0], s])))
    stripped = caption
    adjectives = [p for g in vocab.groups if g.slot == "modifier" for p in g.phrases]
    for adj in sorted(adjectives, key=len, reverse=True):
        stripped = re.sub(rf"\b{re.escape(adj)}\s+(?=\w)", "", stripped, flags=re.IGNORECASE)
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


def new_words(before: str, after: str) -> set[str]:
    """Content words ``after`` has that ``before`` lacks."""
    old = set(re.findall(r"[a-z]+", before.lower()))
    return {w for w in re.findall(r"[a-z]+", after.lower()) if w not in old and w not in FUNCTION_WORDS}


# -- edits proposed by an LLM --------------------------------------------------------------------------------


class _LLMEdit(BaseModel):
    type: str
    edit: str = ""
    caption: str


class _LLMReply(BaseModel):
    edits: list[_LLMEdit]


def _quoted(text: str, marker: str) -> str:
    """Model-written data must not be able to close its own delimiter in the prompt."""
    return text.replace(f"{marker}>>>", f"{marker}> > >").replace(f"<<<{marker}", f"< < <{marker}")


def llm_edits(llm: Any, caption: str, label: str, labels: tuple[str, ...], types: list[EditType], n: int,
              context: list[str] | None = None) -> list[Edit]:
    template = resources.files("sleuth.prompts").joinpath("perturb_caption.md").read_text()
    failures = ""
    if context:
        failures = ("\nCaptions of images of the class the classifier got wrong, also data, between the markers:\n"
                    "<<<FAILURES\n" + "\n".join(_quoted(" ".join(c.split()), "FAILURES") for c in context)
                    + "\nFAILURES>>>\nSome edits may test what these captions suggest.\n")
    prompt = template.format(label=label, n=n, types=", ".join(types), caption=_quoted(caption, "CAPTION"),
                             other_labels=", ".join(x for x in labels if x != label), failures=failures)
    reply = llm(prompt)
    text = reply.strip()
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    try:
        got = _LLMReply.model_validate_json(text).edits
    except ValidationError as e:
        raise ToolError("the LLM's perturbations were not valid JSON of the expected form: "
                        f"{e.errors()[0]['msg']}") from None
    return [Edit(type=e.type, edit=e.edit or e.caption, caption=e.caption, source="llm") for e in got]


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
    return "llm" not in r.source


def run(args: Args, ctx: ToolContext) -> Result:
    inv = investigation(ctx)
    label = inv.label
    labels = inv.labels.labels
    if check(args.caption, label, labels) is not None:
        raise ToolError(f"the caption must name the class {label!r} and no other class: {args.caption!r}")
    vocab = general_vocabulary()
    llm = ctx.llm
    notes: list[str] = []
    proposed = vocabulary_edits(args.caption, label, vocab, args.types)
    source = "vocabulary"
    from_llm: set[int] = set()
    if llm is not None and args.types:
        # The LLM's rewrites come first and add to the vocabulary's, never replace them: a model that proposes a
        # handful of ideas must not narrow the search, and one that fails leaves the vocabulary's edits standing.
        try:
            suggested = llm_edits(llm, args.caption, label, labels, args.types, min(args.n, LLM_PER_TYPE),
                                  args.context)
        except ToolError as failed:
            notes.append(f"the LLM's perturbations could not be used ({failed}); these are the vocabulary's")
        else:
            seen = {" ".join(e.caption.lower().split()) for e in suggested}
            proposed = suggested + [e for e in proposed if " ".join(e.caption.lower().split()) not in seen]
            from_llm = {id(e) for e in suggested}
            notes.append(f"a language model proposed {len(suggested)} edits")
            source = "llm+vocabulary"
    candidates: list[Edit] = []
    rejected: list[str] = []
    for e in proposed:
        why = check(e.caption, label, labels)
        if why is None:
            candidates.append(e)
        else:
            rejected.append(f"{e.caption!r}: {why}")
    not_rendered: list[str] = []
    if args.rendered_only and candidates:
        unrendered = inv.backends.generator.unrendered([e.caption for e in candidates])
        kept = []
        for e, missing in zip(candidates, unrendered):
            added = new_words(args.caption, e.caption)
            if not added or added - set(missing):
                kept.append(e)
            else:
                not_rendered.append(e.edit)
        candidates = kept
    per_type: dict[tuple[str, bool], int] = {}
    edits: list[Edit] = []
    for e in candidates:
        # Up to args.n of each type from each source: the LLM's do not crowd the vocabulary's out.
        key = (e.type, id(e) in from_llm)
        if per_type.get(key, 0) < args.n:
            per_type[key] = per_type.get(key, 0) + 1
            edits.append(e)
    refs = refinements(args.caption, vocab) if args.refinements else []
    inv.propose(e.caption for e in [*edits, *refs])
    return Result(caption=args.caption, edits=edits, refinements=refs, rejected=rejected, not_rendered=not_rendered,
                  source=source, notes=notes)
