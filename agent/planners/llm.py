"""The LLM planner: any litellm model with tool calling plans the investigation.

Each turn the transcript's events become chat messages (see ``agent.llm.context``), the model answers with
reasoning and tool calls, and the calls go back to the loop as they are. Problems are handled where they belong:

- invalid JSON arguments and unknown tools are passed on unchanged; the loop's registry turns them into tool
  errors the model reads on its next turn. Turns whose every call fails are counted: in an investigation, the turn
  before the last the count allows runs the ledger's suggested calls in the model's place (when it has some); after
  ``max_failed_turns`` in a row the planner gives up (``PlannerError``), so a confused model cannot burn the budget
  on errors;
- an empty reply (no text, no call) is asked again within the turn, at most ``max_empty_retries`` times;
- rate limits and timeouts are retried by the client with backoff; a request too long for the model's context is
  rebuilt with a smaller budget;
- token use and cost of every request of a turn (retries included) are summed into the turn.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from importlib import resources
from string import Template
from typing import Any, Literal

from sleuth.agent.errors import PlannerError
from sleuth.agent.events import Event, PlannerTurn, ToolCall, ToolReturned, Usage, UserMessage
from sleuth.agent.llm.client import ContextTooLong, LLMClient, LLMError, LLMReply
from sleuth.agent.llm.context import ContextConfig, build_messages, estimate_tokens
from sleuth.agent.llm.ledger import MAX_CALLS, ledger, suggestion
from sleuth.agent.llm.summaries import expand_refs
from sleuth.agent.llm.toolcalls import extract_tool_calls
from sleuth.agent.runner import Turn
from sleuth.agent.view import InvestigationView, caption_key
from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.defaults import ALPHA, MAX_CONFIRMATIONS
from sleuth.tools.registry import Registry

Mode = Literal["investigate", "chat"]

INVESTIGATE_TASK = (
    "Investigate the class \"$label\": find the conditions under which the classifier fails on it, test them, "
    "confirm them on fresh seeds and record the confirmed findings. Act through the tools; when you are done, call "
    "finish with your summary."
)
MODE_NOTES = {
    "investigate": "Work through the tools until you call finish. Say briefly, in each turn, what you do and why.",
    "chat": "You are in a conversation with a user who audits this classifier. Answer their messages; run tools "
            "when an answer needs evidence, and cite the evidence (k/n with intervals, ratios, adjusted p). When you "
            "have answered, reply in words without a tool call and wait for the next message.",
}
EMPTY_NUDGE = "Your reply was empty. Call one of the tools, or answer in words."
REPEAT_NUDGE = ("Your reply repeats your previous calls exactly, and their results are above. Do not run them again: "
                "take the next step (the ledger suggests one), or call finish.")
ACT_NUDGE = "Continue the investigation through the tools; call finish with your summary when you are done."


def load_prompt(name: str) -> str:
    return resources.files("sleuth.prompts").joinpath(name).read_text(encoding="utf-8")


def system_prompt(*, label: str, class_prompt: str, labels: Sequence[str], budget: int | None, alpha: float,
                  mode: Mode, confirmations: int = MAX_CONFIRMATIONS) -> str:
    text = Template(load_prompt("system.md")).safe_substitute(
        label=label, class_prompt=class_prompt, labels=", ".join(labels),
        budget=f"{budget:,}" if budget is not None else "not set", alpha=alpha, mode_notes=MODE_NOTES[mode],
        confirmations=confirmations)
    tools = Template(load_prompt("tools.md")).safe_substitute(confirmations=confirmations)
    return text.rstrip() + "\n\n" + tools.rstrip() + "\n"


def parse_arguments(raw: str, known_refs: list[str]) -> dict[str, Any] | str:
    """Arguments as a dict when they are a JSON object (also when the model encoded the JSON twice), with short
    image refs made whole; otherwise the raw text, which the registry reports back as an error."""
    if not raw.strip():
        return {}
    try:
        data: Any = json.loads(raw)
        if isinstance(data, str):
            data = json.loads(data)
    except json.JSONDecodeError:
        return raw
    if not isinstance(data, dict):
        return raw
    return expand_refs(data, known_refs)


NOTE_CHARS = 160
"""Longest note after a call in forced-call mode: a free text field that comes first, or runs long, fills with
results nobody measured (docs/llm.md)."""


ARGUMENT_CHARS = 600
"""Longest free-text argument in forced-call mode (a caption, finish's summary): the grammar then makes the model
close the string. Unbounded, a small model at temperature 0 can repeat itself until the reply's token cap (seen: a
finish summary past 950 tokens, over three minutes on a CPU)."""


def bounded(schema: Any) -> Any:
    """``schema`` with ``maxLength`` on every string that has none (ARGUMENT_CHARS)."""
    if isinstance(schema, list):
        return [bounded(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: bounded(v) for k, v in schema.items()}
    if out.get("type") == "string" and "maxLength" not in out and "enum" not in out and "const" not in out:
        out["maxLength"] = ARGUMENT_CHARS
    return out


def call_response_format(tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A JSON schema for one reply: the calls first (1 to ``MAX_CALLS``, one object per tool, its name a constant and
    its arguments that tool's schema, every free string bounded), then a short note."""
    options = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                                 "arguments": bounded(t["function"]["parameters"])},
                "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    schema = {"type": "object",
              "properties": {"calls": {"type": "array", "items": {"oneOf": options}, "minItems": 1,
                                       "maxItems": MAX_CALLS},
                             "note": {"type": "string", "maxLength": NOTE_CHARS}},
              "required": ["calls", "note"], "additionalProperties": False}
    return {"type": "json_schema", "json_schema": {"name": "tool_calls", "schema": schema}}


def bare(schema: Any) -> Any:
    """``schema`` without its descriptions and titles: the prompt's tool guide says what each argument is for, and
    every request's prompt is shorter by about a thousand tokens (on a CPU, a prompt is read at 30-80 tokens/s)."""
    if isinstance(schema, list):
        return [bare(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    return {k: bare(v) for k, v in schema.items() if k not in ("description", "title") or not isinstance(v, str)}


def json_call_guide(tools: Sequence[dict[str, Any]]) -> str:
    """The tool list written into the system prompt for forced-call mode."""
    listing = "\n".join(json.dumps({"name": t["function"]["name"], "description": t["function"]["description"],
                                     "arguments": bare(t["function"]["parameters"])}, ensure_ascii=False)
                         for t in tools)
    return ("\n## How to call tools\n\nAnswer every turn with exactly one JSON object: "
            '{"calls": [{"name": TOOL, "arguments": {...}}, ...], "note": "why, in one sentence"}, with 1 to '
            f"{MAX_CALLS} independent calls (they run in order). The calls come first; their results arrive in the "
            "next message (never write them yourself). The tools and their arguments:\n" + listing + "\n")


def reply_calls(data: Any) -> list[dict[str, Any]] | None:
    """The calls of a forced-call reply: ``{"calls": [...]}``, or one ``{"call": {...}}`` (the earlier form)."""
    if not isinstance(data, dict):
        return None
    raw = data.get("calls")
    if raw is None and isinstance(data.get("call"), dict):
        raw = [data["call"]]
    if not isinstance(raw, list):
        return None
    calls = [c for c in raw if isinstance(c, dict) and isinstance(c.get("name"), str)]
    return calls or None


def _signature(call: ToolCall) -> str:
    return call.name + "\0" + (call.arguments if isinstance(call.arguments, str)
                               else json.dumps(call.arguments, sort_keys=True))


class LLMPlanner:
    """Plans with a language model reached through ``LLMClient``."""

    name = "llm"

    deterministic = False
    """Its turns come from a model: resume and fork reuse the recorded turns instead of asking again."""

    def __init__(self, client: LLMClient, registry: Registry, *, label: str, class_prompt: str,
                 labels: Sequence[str], budget: int | None = None, alpha: float = ALPHA, mode: Mode = "investigate",
                 context: ContextConfig | None = None, artifacts: ArtifactStore | None = None,
                 max_failed_turns: int = 3, max_empty_retries: int = 2, max_text_turns: int = 3,
                 confirmations: int = MAX_CONFIRMATIONS) -> None:
        self.client = client
        self.registry = registry
        self.model = client.config.model
        self.name = f"llm:{self.model}"
        self.mode = mode
        self.label = label
        self.context = context or ContextConfig()
        self.artifacts = artifacts
        """Where thumbnails come from when the model sees images; set it once the run's store exists."""
        self.max_failed_turns = max_failed_turns
        self.max_empty_retries = max_empty_retries
        self.max_text_turns = max_text_turns
        self.system = system_prompt(label=label, class_prompt=class_prompt, labels=labels, budget=budget,
                                    alpha=alpha, mode=mode, confirmations=confirmations)
        self.task = Template(INVESTIGATE_TASK).substitute(label=label) if mode == "investigate" else None
        self._tools = registry.schemas()
        self.json_calls = client.config.call_format == "json" and mode == "investigate"
        """Forced-call mode: no tools in the request; a response_format grammar makes every reply one call."""
        self._format: dict[str, Any] | None = None
        if self.json_calls:
            self.system += json_call_guide(self._tools)
            self._format = call_response_format(self._tools)
        self.budget = budget
        self.ledger = mode == "investigate"
        """Append the ledger (tests, findings, images left, when to stop) to every request."""

    # -- what the recent turns say about the model ---------------------------------------------------------

    def _own_turns(self, events: Sequence[Event]) -> list[tuple[PlannerTurn, list[ToolReturned]]]:
        """This planner's turns since the user last spoke, newest first, each with its results."""
        out: list[tuple[PlannerTurn, list[ToolReturned]]] = []
        results: list[ToolReturned] = []
        for e in reversed(events):
            if isinstance(e, UserMessage):
                break
            if isinstance(e, ToolReturned):
                results.append(e)
            elif isinstance(e, PlannerTurn):
                if e.model == self.model:
                    out.append((e, results))
                results = []
        return out

    def _check_failures(self, events: Sequence[Event]) -> int:
        """The turns in a row, the latest first, whose every call failed; too many end the run (PlannerError)."""
        streak = 0
        last_error = ""
        for turn, results in self._own_turns(events):
            if not turn.tool_calls or not results or any(r.ok for r in results):
                break
            streak += 1
            last_error = last_error or (results[0].error or "")
        if streak >= self.max_failed_turns:
            raise PlannerError(f"{self.model}: the last {streak} turns had only failed tool calls; the last error: "
                               f"{last_error[:300]}")
        return streak

    def _text_streak(self, events: Sequence[Event]) -> int:
        streak = 0
        for turn, _ in self._own_turns(events):
            if turn.tool_calls:
                break
            streak += 1
        return streak

    # -- the turn --------------------------------------------------------------------------------------------

    def _messages(self, events: Sequence[Event], context: ContextConfig) -> list[dict[str, Any]]:
        note = ledger(events, budget=self.budget) if self.ledger else ""
        messages = build_messages(events, system=self.system, own_model=self.model, task=self.task, config=context,
                                  artifacts=self.artifacts, tools=None if self.json_calls else self._tools,
                                  reserve=estimate_tokens([{"content": note}]))
        # Appended after the history, never stored in it: the earlier messages stay byte-identical across turns.
        if note:
            messages.append({"role": "user", "content": note})
        own = self._own_turns(events)
        if self.mode == "investigate" and own and not own[0][0].tool_calls:
            messages.append({"role": "user", "content": ACT_NUDGE})
        return messages

    def _ask(self, events: Sequence[Event], nudges: Sequence[dict[str, Any]] = ()
             ) -> tuple[LLMReply, Usage, float | None, int]:
        context = self.context.model_copy()
        usage = Usage()
        cost: float | None = None
        nudges = list(nudges)
        empty = 0
        requests = 0
        # A forced tool call suits an investigation; in chat the model must be free to answer in words.
        choice = None if self.mode == "investigate" else ""
        while True:
            messages = self._messages(events, context) + nudges
            try:
                requests += 1
                if self.json_calls:
                    reply = self.client.complete(messages, None, response_format=self._format)
                else:
                    reply = self.client.complete(messages, self._tools, tool_choice=choice)
                requests += reply.attempts - 1
            except ContextTooLong as e:
                if context.max_tokens <= 2000:
                    raise PlannerError(str(e)) from None
                context = context.model_copy(update={"max_tokens": context.max_tokens // 2})
                continue
            except LLMError as e:
                raise PlannerError(str(e)) from None
            usage = Usage(prompt_tokens=usage.prompt_tokens + reply.usage.prompt_tokens,
                          completion_tokens=usage.completion_tokens + reply.usage.completion_tokens)
            if reply.cost_usd is not None:
                cost = (cost or 0.0) + reply.cost_usd
            if reply.content.strip() or reply.tool_calls:
                return reply, usage, cost, requests
            empty += 1
            if empty > self.max_empty_retries:
                raise PlannerError(f"{self.model} sent {empty} empty replies in a row")
            nudges = [{"role": "assistant", "content": ""}, {"role": "user", "content": EMPTY_NUDGE}]

    def _read(self, reply: LLMReply, events: Sequence[Event]) -> tuple[list[ToolCall], str]:
        """The calls of a reply (exact repeats within it dropped) and its words."""
        known = [r for e in events if isinstance(e, ToolReturned) for r in e.artifacts]
        calls: list[ToolCall] = []
        seen: set[str] = set()
        for i, raw in enumerate(reply.tool_calls):
            call_id = raw.id or f"call_{len(events)}_{i}"
            while call_id in seen:  # some servers repeat or omit ids; results are matched by id
                call_id += "_"
            seen.add(call_id)
            calls.append(ToolCall(id=call_id, name=raw.name.strip(), arguments=parse_arguments(raw.arguments, known)))
        text = reply.content.strip()
        if not calls and text and self.json_calls:
            # Forced-call mode: the reply is {"calls": [...], "note": "..."}; the note is the turn's reasoning.
            try:
                data = json.loads(text)
            except json.JSONDecodeError:
                data = None
            found_calls = reply_calls(data)
            if found_calls is not None:
                for i, call in enumerate(found_calls):
                    args = call.get("arguments")
                    calls.append(ToolCall(id=f"json_{len(events)}" + (f"_{i}" if i else ""), name=call["name"].strip(),
                                          arguments=parse_arguments(json.dumps(args if args is not None else {}),
                                                                    known)))
                note = data.get("note") if isinstance(data, dict) else None
                text = note.strip() if isinstance(note, str) else ""
        if not calls and text:
            # Many local models write their calls in the text (fenced JSON, <tool_call> tags) and go on to invent
            # the result: read the calls, keep the words before any invented result, and drop the rest.
            found = extract_tool_calls(text, self.registry.names())
            for i, c in enumerate(found.calls):
                calls.append(ToolCall(id=f"text_{len(events)}_{i}", name=c.name,
                                      arguments=parse_arguments(c.arguments, known)))
            text = found.text.strip()
            if found.stripped:
                text += ("\n[sleuth removed text that imitated a tool result: results come only from the tools; "
                         "call a tool and wait for its result]")
        # The same call twice in one reply would run twice for nothing (a small model sometimes fills its list so).
        unique: dict[str, ToolCall] = {}
        for call_ in calls:
            unique.setdefault(_signature(call_), call_)
        return list(unique.values()), text

    def _repeats(self, calls: Sequence[ToolCall], events: Sequence[Event]) -> bool:
        """In an investigation: every call of this reply is one the model's previous turn made word for word, and
        ran (a failed call repeated is the failure streak's business)."""
        own = self._own_turns(events)
        if self.mode != "investigate" or not calls or not own or not own[0][0].tool_calls:
            return False
        ran = {r.call_id for r in own[0][1] if r.ok}
        before = {_signature(c) for c in own[0][0].tool_calls if c.id in ran}
        return all(_signature(c) in before and c.name != "finish" for c in calls)

    def _suggested(self, events: Sequence[Event]) -> list[ToolCall]:
        """The ledger's suggested calls (the protocol's next step), or finish when that step is to finish."""
        step, suggested = suggestion(events)
        if not suggested and step.startswith("finish"):
            suggested = [{"name": "finish", "arguments": {
                "summary": "Ended by sleuth in the planner's place, as the protocol's next step was to finish. The "
                           "recorded findings stand as listed."}}]
        known = [r for e in events if isinstance(e, ToolReturned) for r in e.artifacts]
        return [ToolCall(id=f"ledger_{len(events)}_{i}", name=c["name"],
                         arguments=parse_arguments(json.dumps(c["arguments"]), known))
                for i, c in enumerate(suggested)]

    def _instead(self, calls: list[ToolCall], events: Sequence[Event], text: str) -> tuple[list[ToolCall], str]:
        """What runs in place of a second word-for-word repeat: the ledger's suggested calls (or finish); the
        repeat itself when the ledger has nothing else to suggest."""
        instead = self._suggested(events)
        if not instead or {_signature(c) for c in instead} <= {_signature(c) for c in calls}:
            return calls, text
        names = ", ".join(c.name for c in instead)
        return instead, (text + "\n" if text else "") + (
            f"[sleuth ran the ledger's suggested calls ({names}) in place of a second repeat of the previous "
            "turn's calls]")

    def _prune(self, calls: list[ToolCall], events: Sequence[Event], text: str) -> tuple[list[ToolCall], str]:
        """In an investigation, call by call: a call that repeats one the previous turn ran word for word is not run
        again, nor a confirmation of a caption already confirmed (it would spend an attempt to learn nothing); a
        record_finding whose ids are not the pair the ledger suggests for its caption is given that pair. When
        nothing is left, the ledger's suggested calls run. The turn says what changed.

        Seen: a 1.5B model, four findings in, ran the same look, perturbation and re-confirmation of one caption
        seven turns running, each with a record_finding naming ids that were not the caption's tests; every turn had
        calls that succeeded and ids that changed, so neither the failed-turn rule nor the repeat rule applied."""
        if self.mode != "investigate" or not calls:
            return calls, text
        own = self._own_turns(events)
        before: set[str] = set()
        if own and own[0][0].tool_calls:
            ran = {r.call_id for r in own[0][1] if r.ok}
            before = {_signature(c) for c in own[0][0].tool_calls if c.id in ran}
        view = InvestigationView.from_events(events)
        confirmed = {caption_key(t.caption) for t in view.tests
                     if t.purpose == "confirmation" and t.verdict == "supported"}
        records = [c for c in suggestion(view)[1] if c["name"] == "record_finding"]
        # A caption's record is fixed to the ledger's pair; a record of a caption the ledger does not suggest (one
        # already recorded, given a counterfactual; a refinement of its own) runs as written.
        kept: list[ToolCall] = []
        dropped: list[str] = []
        fixed: list[str] = []
        for c in calls:
            args = c.arguments if isinstance(c.arguments, dict) else {}
            caption = str(args.get("caption", ""))
            if c.name != "finish" and _signature(c) in before:
                dropped.append(f"{c.name} (a repeat of the previous turn's call)")
                continue
            if c.name == "measure_rate" and args.get("confirm") is True and caption_key(caption) in confirmed:
                dropped.append(f"measure_rate confirm=true of {caption!r} (already confirmed)")
                continue
            same = [r for r in records if caption_key(str(r["arguments"]["caption"])) == caption_key(caption)]
            if c.name == "record_finding" and same and (args.get("discovery_test"), args.get("confirmation_test")) \
                    != (same[0]["arguments"]["discovery_test"], same[0]["arguments"]["confirmation_test"]):
                pick = same[0]
                records.remove(pick)
                known = [r for e in events if isinstance(e, ToolReturned) for r in e.artifacts]
                pick_args = {**{k: v for k, v in args.items() if k in ("summary", "counterfactual_test")},
                             **pick["arguments"]}
                c = ToolCall(id=c.id, name=c.name, arguments=parse_arguments(json.dumps(pick_args), known))
                fixed.append(f"record_finding of {pick['arguments']['caption']!r} given the ledger's test ids "
                             f"({pick['arguments']['discovery_test']}, {pick['arguments']['confirmation_test']})")
            kept.append(c)
        notes = []
        if dropped:
            notes.append("did not run " + "; ".join(dropped))
        if fixed:
            notes.append("; ".join(fixed))
        if not kept:
            instead = self._suggested(events)
            if not instead:
                return calls, text
            kept = instead
            notes.append("ran the ledger's suggested calls (" + ", ".join(c.name for c in instead) + ") instead")
        if not notes:
            return calls, text
        return kept, (text + "\n" if text else "") + "[sleuth " + "; ".join(notes) + "]"

    def next_turn(self, events: Sequence[Event]) -> Turn:
        streak = self._check_failures(events)
        t0 = time.perf_counter()
        if self.mode == "investigate" and 0 < streak == self.max_failed_turns - 1:
            # Seen: a 1.5B model wrote record_finding with captions and test ids of its own (the screen's next
            # captions, ids of confirmations), read the errors, and wrote the same again until the run ended as an
            # error with four confirmed findings unrecorded. Before the turn that would end the run, the ledger's
            # suggested calls run in the model's place, if it has any; the model has the turn after.
            instead = self._suggested(events)
            if instead:
                names = ", ".join(c.name for c in instead)
                return Turn(reasoning=f"[sleuth ran the ledger's suggested calls ({names}) in the planner's place: "
                                      f"its last {streak} turns had only failed tool calls]",
                            tool_calls=instead, model=self.model, usage=Usage(prompt_tokens=0, completion_tokens=0),
                            latency_s=round(time.perf_counter() - t0, 3), requests=0)
        reply, usage, cost, requests = self._ask(events)
        calls, text = self._read(reply, events)
        if self._repeats(calls, events):
            # A small model can fall into repeating its last call (seen: one discovery test three times over, each
            # supported, while the ledger asked for record_finding). It is asked once again; a second repeat runs.
            echo = {"role": "assistant", "content": reply.content or json.dumps([c.name for c in calls])}
            again, more, more_cost, more_requests = self._ask(events, [echo, {"role": "user", "content": REPEAT_NUDGE}])
            usage = Usage(prompt_tokens=usage.prompt_tokens + more.prompt_tokens,
                          completion_tokens=usage.completion_tokens + more.completion_tokens)
            cost = None if cost is None and more_cost is None else (cost or 0.0) + (more_cost or 0.0)
            requests += more_requests
            calls, text = self._read(again, events)
            if self._repeats(calls, events):
                # Seen: a second repeat after the note, then the same two turns again until the budget ran out, with
                # four confirmed findings unrecorded. A third look at the same calls is not run: the protocol's next
                # calls (the ledger's suggestion) run in its place, and the turn says so.
                calls, text = self._instead(calls, events, text)
        if not self._repeats(calls, events):  # a repeat that survived the rules above has nothing else to run
            calls, text = self._prune(calls, events, text)
        latency = round(time.perf_counter() - t0, 3)
        final: str | None = None
        if not calls:
            # In chat a reply in words answers the user. In an investigation the model must act and end with
            # finish; words alone are kept as reasoning and it is asked to go on, and a model that keeps talking
            # ends the run as a planner error (not as a completed investigation).
            if self.mode == "chat":
                final = text
            elif self._text_streak(events) + 1 >= self.max_text_turns:
                raise PlannerError(f"{self.model} wrote {self.max_text_turns} turns in words without a tool call and "
                                   "never called finish")
        return Turn(reasoning=text if final is None else "", tool_calls=calls, final=final, model=self.model,
                    usage=usage, cost_usd=cost, latency_s=latency, requests=requests)
