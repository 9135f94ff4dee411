"""Slash commands of `sleuth chat`: parsed into tool calls, so a typed command is recorded like a planner's turn.

Syntax: ``/name [key=value ...] [flag ...] text [flag ...]``. Options (``n=800``) may stand anywhere in the line;
flags (``confirm``) before or after the text, not inside it; the rest of the line is the text (a prompt, a caption,
an id). Quotes keep words as text: ``/measure "a cat that will not confirm"``; a quote opens a quoted span only at
the start of a word (or after ``key=``), so apostrophes (``cat's``) need none. Defaults come from the session so far:
``/caption`` captions the latest measurement, ``/edit`` edits the latest generated images.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel

from sleuth.agent.events import Event, ToolCall
from sleuth.agent.view import InvestigationView
from sleuth.tools import generate_and_classify, measure_rate

R = TypeVar("R", bound=BaseModel)

FLAGS: dict[str, frozenset[str]] = {"measure": frozenset({"confirm", "counterfactual"})}
"""The bare-word flags of each command; a command not listed takes none."""
_OPTION = re.compile(r"^([a-z_]+)=(.+)$", re.S)

HELP: list[tuple[str, str]] = [
    ("/generate [n=100] [target=LABEL] [PROMPT]", "generate and classify images of PROMPT (default: the class "
                                                  "prompt); failures k/n with a 95% interval"),
    ("/caption [MEASUREMENT]", "caption the failures of a measurement (default: the latest) into hypotheses"),
    ("/perturb [types=background,domain] [n=2] [CAPTION]", "LANCE edits of a caption that keep the class, "
                                                           "plus refinements"),
    ("/screen [effect=3] [max=IMAGES] [CAPTION; CAPTION; ...]", "screen captions on the ladder in one call "
                                                               "(default: everything proposed and not yet screened); "
                                                               "ranked, with what to test next"),
    ("/edit [m=MEASUREMENT] [k=8] TARGET CAPTION", "edit generated images (default: the latest) so they match "
                                                   "TARGET CAPTION; paired before/after predictions"),
    ("/measure [n=800] [target=LABEL] [confirm] [counterfactual] CAPTION", "failure rate of a hypothesis vs the "
                                                                          "baseline: ratio, adjusted p, verdict"),
    ("/record DISCOVERY_TEST CONFIRMATION_TEST [COUNTERFACTUAL_TEST] [SUMMARY]",
     "record a confirmed finding (e.g. /record t1 t3, or /record t1 t3 t4 with a counterfactual test)"),
    ("/findings", "the failure modes, the findings and every hypothesis tested so far"),
    ("/auto", "hand over to the protocol planner until it finishes (Ctrl-C stops it)"),
    ("/help", "this list; options (n=800) go anywhere, flags (confirm) before or after the text; quote text that "
              "holds such a word: /measure \"a cat that will not confirm\""),
    ("/quit", "leave (Ctrl-D too); the transcript stays in the run directory"),
]

TOOL_COMMANDS = ("generate", "caption", "perturb", "screen", "edit", "measure", "record")
OTHER_COMMANDS = ("findings", "auto", "help", "quit", "exit")


class CommandError(Exception):
    """A slash command that cannot become a tool call (unknown, malformed, missing text); shown to the user."""


@dataclass
class Parsed:
    name: str
    options: dict[str, str] = field(default_factory=dict)
    flags: set[str] = field(default_factory=set)
    text: str = ""


@dataclass
class Word:
    text: str
    quoted: bool = False
    """Quoted as a whole: always text, never an option or a flag."""


def _close(line: str, quote: str, start: int) -> int:
    """Index of the quote that closes a span opened before ``start``: the next one at the end of a word."""
    for m in re.finditer(re.escape(quote), line[start:]):
        end = start + m.start()
        if end + 1 == len(line) or line[end + 1].isspace():
            return end
    raise CommandError(f"unclosed {quote} in the command; close it, or write the text without quotes")


def split_words(line: str) -> list[Word]:
    """Whitespace-separated words; a quote at the start of a word (or after ``key=``) runs to the matching quote at
    the end of a word, whitespace included, so ``"a cat, confirm"`` is one word and ``cat's`` is plain."""
    words: list[Word] = []
    i, n = 0, len(line)
    while i < n:
        if line[i].isspace():
            i += 1
            continue
        buf, whole = "", False
        while i < n and not line[i].isspace():
            c = line[i]
            if c in "\"'" and (not buf or re.fullmatch(r"[a-z_]+=", buf)):
                end = _close(line, c, i + 1)
                whole = whole or not buf
                buf += line[i + 1:end]
                i = end + 1
            else:
                buf += c
                i += 1
        words.append(Word(buf, whole))
    return words


def parse(line: str) -> Parsed:
    if not line.startswith("/"):
        raise CommandError("slash commands start with /")
    head = line[1:].split(maxsplit=1)
    if not head:
        raise CommandError("empty command; /help lists them")
    name = head[0].lower()
    if name not in TOOL_COMMANDS + OTHER_COMMANDS:
        near = difflib.get_close_matches(name, TOOL_COMMANDS + OTHER_COMMANDS, n=1, cutoff=0.6)
        raise CommandError(f"unknown command /{name}" + (f"; did you mean /{near[0]}?" if near else "")
                           + " (/help lists them)")
    p = Parsed(name)
    flags = FLAGS.get(name, frozenset())
    rest: list[Word] = []
    for w in split_words(head[1] if len(head) > 1 else ""):
        m = None if w.quoted else _OPTION.match(w.text)
        if m:
            if m.group(1) in p.options:
                raise CommandError(f"/{name}: {m.group(1)}= given twice")
            p.options[m.group(1)] = m.group(2)
        else:
            rest.append(w)

    def is_flag(w: Word) -> bool:
        return not w.quoted and w.text.lower() in flags

    while rest and is_flag(rest[0]):
        p.flags.add(rest.pop(0).text.lower())
    while rest and is_flag(rest[-1]):
        p.flags.add(rest.pop().text.lower())
    inside = [w.text for w in rest if is_flag(w)]
    if inside:
        raise CommandError(f"/{name}: {inside[0]!r} inside the text: as a flag, put it before or after the text; "
                           f"as a word of the text, quote the text")
    p.text = " ".join(w.text for w in rest if w.text)
    return p


def _int(p: Parsed, key: str) -> int | None:
    if key not in p.options:
        return None
    try:
        return int(p.options[key])
    except ValueError:
        raise CommandError(f"/{p.name}: {key} must be a whole number, got {p.options[key]!r}") from None


def _known(p: Parsed, keys: Sequence[str], flags: Sequence[str] = ()) -> None:
    for k in p.options:
        if k not in keys:
            raise CommandError(f"/{p.name}: unknown option {k}= (known: {', '.join(keys) or 'none'})")
    for f in p.flags:  # the parser only takes a command's own flags; kept for commands called with Parsed directly
        if f not in flags:
            raise CommandError(f"/{p.name}: {f} is not an option of this command")


def _results(events: Sequence[Event], kind: type[R]) -> list[R]:
    """The successful results of one tool, typed, oldest first."""
    return InvestigationView.from_events(events).results(kind)


def latest_measurement(events: Sequence[Event]) -> str | None:
    return InvestigationView.from_events(events).latest_measurement


def _label(value: str, labels: Sequence[str]) -> str:
    """Options hold no spaces: ``target=snow_leopard`` names the label "snow leopard" unless the underscore is real."""
    if value in labels or value.replace("_", " ") not in labels:
        return value
    return value.replace("_", " ")


def arguments(p: Parsed, events: Sequence[Event], class_prompt: str,
              labels: Sequence[str] = ()) -> tuple[str, dict[str, Any]]:
    """The tool and its arguments for a tool command."""
    if p.name == "generate":
        _known(p, ("n", "target"))
        args: dict[str, Any] = {"prompt": p.text or class_prompt, "n": _int(p, "n") or 100}
        if "target" in p.options:
            args["target_label"] = _label(p.options["target"], labels)
        return "generate_and_classify", args
    if p.name == "caption":
        _known(p, ("clusters", "sentences"))
        mid = p.text or latest_measurement(events)
        if not mid:
            raise CommandError("/caption: nothing measured yet; /generate first")
        args = {"measurement_id": mid}
        if "clusters" in p.options:
            args["max_clusters"] = _int(p, "clusters")
        if "sentences" in p.options:
            args["max_sentences"] = _int(p, "sentences")
        return "caption_failures", args
    if p.name == "perturb":
        _known(p, ("types", "n"))
        args = {"caption": p.text or class_prompt}
        if "types" in p.options:
            args["types"] = [t for t in p.options["types"].split(",") if t]
        if "n" in p.options:
            args["n"] = _int(p, "n")
        return "perturb_caption", args
    if p.name == "screen":
        _known(p, ("effect", "max"))
        captions = [c.strip() for c in p.text.split(";") if c.strip()]
        args = {"prompts": captions} if captions else {"proposed": True}
        if "effect" in p.options:
            try:
                args["effect"] = float(p.options["effect"].rstrip("x"))
            except ValueError:
                raise CommandError(f"/screen: effect must be 3, 2 or 1.5, got {p.options['effect']!r}") from None
        if "max" in p.options:
            args["max_images"] = _int(p, "max")
        return "generate_and_classify", args
    if p.name == "edit":
        _known(p, ("m", "k"))
        if not p.text:
            raise CommandError("usage: /edit [m=MEASUREMENT] [k=8] TARGET CAPTION")
        gens = _results(events, generate_and_classify.Result)
        if "m" in p.options:
            gens = [g for g in gens if g.measurement_id == p.options["m"]]
        if not gens:
            raise CommandError("/edit: no generated images to edit; /generate first")
        g = gens[-1]
        images = (g.success_images + g.failure_images)[: _int(p, "k") or 8]
        if not images:
            raise CommandError(f"/edit: measurement {g.measurement_id} kept no images")
        return "edit_image", {"images": images, "source_caption": g.summary.prompt, "target_caption": p.text}
    if p.name == "measure":
        _known(p, ("n", "first", "baseline", "target"), ("confirm", "counterfactual"))
        if not p.text:
            raise CommandError("usage: /measure [n=800] [target=LABEL] [confirm] [counterfactual] CAPTION")
        args = {"caption": p.text, "confirm": "confirm" in p.flags,
                "mode": "counterfactual" if "counterfactual" in p.flags else "sample"}
        for key, arg in (("n", "max_n"), ("first", "first_n"), ("baseline", "baseline_n")):
            if key in p.options:
                args[arg] = _int(p, key)
        if "target" in p.options:
            args["target_label"] = _label(p.options["target"], labels)
        return "measure_rate", args
    if p.name == "record":
        _known(p, ())
        words = p.text.split(maxsplit=2)
        if len(words) < 2:
            raise CommandError("usage: /record DISCOVERY_TEST CONFIRMATION_TEST [COUNTERFACTUAL_TEST] [SUMMARY]  "
                               "(e.g. /record t1 t3)")
        tests = {r.test_id: r for r in _results(events, measure_rate.Result)}
        if words[0] not in tests:
            raise CommandError(f"/record: no test {words[0]!r} (known: {', '.join(tests) or 'none yet'})")
        args = {"caption": tests[words[0]].caption, "discovery_test": words[0], "confirmation_test": words[1]}
        rest = words[2] if len(words) > 2 else ""
        first, _, after = rest.partition(" ")
        if first in tests and tests[first].mode == "counterfactual":  # an optional counterfactual test id
            args["counterfactual_test"], rest = first, after
        return "record_finding", {**args, "summary": rest}
    raise CommandError(f"/{p.name} does not call a tool")


def tool_call(p: Parsed, events: Sequence[Event], class_prompt: str, call_id: str,
              labels: Sequence[str] = ()) -> ToolCall:
    name, args = arguments(p, events, class_prompt, labels)
    return ToolCall(id=call_id, name=name, arguments=args)
