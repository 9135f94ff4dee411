"""Slash commands of `sleuth chat`: parsed into tool calls, so a typed command is recorded like a planner's turn.

Syntax: ``/name [key=value ...] [flag ...] text``. Options come first; the rest of the line is the text (a prompt,
a caption, an id). Defaults come from the session so far: ``/caption`` captions the latest measurement, ``/edit``
edits the latest generated images.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel

from sleuth.agent.events import Event, ToolCall, ToolReturned
from sleuth.tools import generate_and_classify, investigation_tools, measure_rate

R = TypeVar("R", bound=BaseModel)

FLAGS = frozenset({"confirm", "counterfactual"})
_OPTION = re.compile(r"^([a-z_]+)=(\S+)$")

HELP: list[tuple[str, str]] = [
    ("/generate [n=100] [target=LABEL] [PROMPT]", "generate and classify images of PROMPT (default: the class "
                                                  "prompt); failures k/n with a 95% interval"),
    ("/caption [MEASUREMENT]", "caption the failures of a measurement (default: the latest) into hypotheses"),
    ("/perturb [types=background,domain] [n=2] [CAPTION]", "LANCE edits of a caption that keep the class, "
                                                           "plus refinements"),
    ("/edit [m=MEASUREMENT] [k=8] TARGET CAPTION", "edit generated images (default: the latest) so they match "
                                                   "TARGET CAPTION; paired before/after predictions"),
    ("/measure [n=800] [target=LABEL] [confirm] [counterfactual] CAPTION", "failure rate of a hypothesis vs the "
                                                                          "baseline: ratio, adjusted p, verdict"),
    ("/record DISCOVERY_TEST CONFIRMATION_TEST [COUNTERFACTUAL_TEST] [SUMMARY]",
     "record a confirmed finding (e.g. /record t1 t3, or /record t1 t3 t4 with a counterfactual test)"),
    ("/findings", "the findings and every hypothesis tested so far"),
    ("/auto", "hand over to the protocol planner until it finishes (Ctrl-C stops it)"),
    ("/help", "this list"),
    ("/quit", "leave (Ctrl-D too); the transcript stays in the run directory"),
]

TOOL_COMMANDS = ("generate", "caption", "perturb", "edit", "measure", "record")
OTHER_COMMANDS = ("findings", "auto", "help", "quit", "exit")


class CommandError(Exception):
    """A slash command that cannot become a tool call (unknown, malformed, missing text); shown to the user."""


@dataclass
class Parsed:
    name: str
    options: dict[str, str] = field(default_factory=dict)
    flags: set[str] = field(default_factory=set)
    text: str = ""


def parse(line: str) -> Parsed:
    if not line.startswith("/"):
        raise CommandError("slash commands start with /")
    words = line[1:].split()
    if not words:
        raise CommandError("empty command; /help lists them")
    name, rest = words[0].lower(), words[1:]
    if name not in TOOL_COMMANDS + OTHER_COMMANDS:
        raise CommandError(f"unknown command /{name}; /help lists them")
    p = Parsed(name)
    while rest:
        m = _OPTION.match(rest[0])
        if m:
            p.options[m.group(1)] = m.group(2)
        elif rest[0].lower() in FLAGS:
            p.flags.add(rest[0].lower())
        else:
            break
        rest = rest[1:]
    p.text = " ".join(rest)
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
    for f in p.flags:
        if f not in flags:
            raise CommandError(f"/{p.name}: {f} is not an option of this command")


def _results(events: Sequence[Event], kind: type[R]) -> list[R]:
    """The successful results of one tool, typed, oldest first."""
    reg = investigation_tools()
    out = []
    for e in events:
        if isinstance(e, ToolReturned) and e.ok:
            r = reg.result(e.name, e.result)
            if isinstance(r, kind):
                out.append(r)
    return out


def latest_measurement(events: Sequence[Event]) -> str | None:
    reg = investigation_tools()
    for e in reversed(events):
        if isinstance(e, ToolReturned) and e.ok:
            mid = getattr(reg.result(e.name, e.result), "measurement_id", None)
            if mid:
                return str(mid)
    return None


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
