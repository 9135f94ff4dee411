"""The ledger an LLM planner is shown at the end of every request: where the investigation stands, from the events.

Small models lose track of ids, verdicts and the budget over a long run (MAIA keeps a running hypothesis list for the
same reason). The ledger lists every test (id, caption, purpose, verdict and its adjusted p over the family as it
stands now), the recorded findings (by failure mode, one short entry a mode), the confirmation attempts used, and the
images used and left, with the rules for stopping. It is appended as the last message and never stored in the
history, so the earlier messages stay byte-identical from one request to the next (a server's prompt cache keeps
them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sleuth.agent.events import Event
from sleuth.agent.llm import summaries as S
from sleuth.agent.view import InvestigationView, caption_key
from sleuth.tools import ladder, measure_rate, record_finding, stats
from sleuth.tools.defaults import BASELINE_N, FIRST_N, MAX_CONFIRMATIONS

MAX_ROWS = 12
"""Tests listed (the newest); older ones are counted. The ledger is read again at every request (it is the prompt's
last message), so each row costs every turn: a small model on a CPU reads about 30-80 prompt tokens a second."""


MAX_PROPOSED = 8
"""Proposed hypotheses listed (the oldest untested first)."""


MAX_SCREENED = 4
"""Captions a screen singles out, listed (surest first)."""


MAX_CALLS = 8
"""Calls one reply may carry in forced-call mode, and so the most calls the ledger suggests at once."""


def _key(caption: str) -> str:
    return caption_key(caption)


def _p(p: float | None) -> str:
    if p is None:
        return "n/a"
    return "< 1e-06" if p < 1e-6 else f"{p:.2g}"


def _test_line(t: measure_rate.Result) -> dict[str, Any]:
    """A test as ``next_step`` reads it."""
    return {"test_id": t.test_id, "caption": t.caption, "purpose": t.purpose, "mode": t.mode, "verdict": t.verdict,
            "p_value": t.p_value, "adjusted_p": t.adjusted_p,
            "rate_ratio": {"low": t.rate_ratio.low} if t.rate_ratio is not None else None,
            "target_label": t.hypothesis.target_label if t.hypothesis is not None else None}


def _finding_line(f: record_finding.Result) -> dict[str, Any]:
    return {"finding_id": f.finding_id, "caption": f.caption}


def _findings_line(view: InvestigationView, findings: Sequence[dict[str, Any]]) -> str:
    """The recorded findings by failure mode, one short entry a mode: its best-evidenced finding and the ids of its
    phrasings (other findings of the same cause); a finding no mode holds is listed on its own."""
    modes = view.mode_claims()
    placed = {f.finding_id for c in modes for f in c.findings}
    parts = [f"{c.mode.mode_id} {c.best.finding_id} {S.quote(c.best.caption)}"
             + (f" (phrasings: {', '.join(f.finding_id for f in c.phrasings)})" if c.phrasings else "")
             for c in modes]
    parts += [f"{f.get('finding_id')} {S.quote(str(f.get('caption', '')))}" for f in findings
              if f.get("finding_id") not in placed]
    return f"- recorded findings ({len(findings)}) by failure mode (one cause, its best finding first): " + "; ".join(
        parts)


def ledger(events: Sequence[Event] | InvestigationView, *, budget: int | None) -> str:
    """The ledger of an investigation (its events, or a view of them)."""
    view = events if isinstance(events, InvestigationView) else InvestigationView.from_events(events)
    m = view.declared_confirmations
    tests = [_test_line(t) for t in view.tests]
    findings = [_finding_line(f) for f in view.recorded]
    used, left = view.images_used, view.images_left
    discovery = [t for t in tests if t.get("purpose") == "discovery"]
    adjusted = stats.adjust_pvalues([float(t.get("p_value", 1.0)) for t in discovery], method="holm") \
        if discovery else []
    now = {id(t): float(a) for t, a in zip(discovery, adjusted)}
    confirmations = sum(1 for t in tests if t.get("purpose") == "confirmation")
    lines = ["Ledger (sleuth's record of this investigation so far; numbers from the tools):"]
    if left is not None:  # what the tools report is the budget in force
        lines.append(f"- images: {used:,} used, {left:,} left of {used + left:,}")
    elif budget is not None:
        lines.append(f"- images: {used:,} used, {budget - used:,} left of {budget:,}")
    lines.append(f"- confirmation attempts: {confirmations} of {m} used (each tested at alpha/{m})")
    if tests:
        lines.append(f"- tests ({len(tests)}; discovery p adjusted by Holm over all {len(discovery)} discovery tests "
                     "so far, confirmations over the declared attempts):")
        if len(tests) > MAX_ROWS:
            lines.append(f"  ... {len(tests) - MAX_ROWS} older tests not listed")
        for t in tests[-MAX_ROWS:]:
            kind = t.get("purpose", "?") + (", counterfactual" if t.get("mode") == "counterfactual" else "")
            p = now.get(id(t), t.get("adjusted_p"))
            lines.append(f"  {t.get('test_id')} {kind} {S.quote(str(t.get('caption', '')))}: {t.get('verdict')}, "
                         f"adjusted p {_p(p)}")
    else:
        lines.append("- tests: none yet")
    screened = view.screened
    untested, to_test = _open(view, tests)
    if screened:
        counts = {v: sum(r.verdict == v for r in screened.values()) for v in ("open", "dropped", "unrendered")}
        lines.append(f"- screened ({len(screened)} captions, latest at {view.screen_effects[-1]:g}x): "
                     + (f"to test ({len(to_test)}): " + "; ".join(f"{S.quote(r.caption)} {r.k}/{r.n}"
                                                                  for r in to_test[:MAX_SCREENED])
                        + ("; ..." if len(to_test) > MAX_SCREENED else "") + "; " if to_test else "none to test; ")
                     + ", ".join(f"{n} {v}" for v, n in counts.items() if n))
    if untested:
        lines.append(f"- proposed and not yet screened or measured ({len(untested)}; from caption_failures and "
                     "perturb_caption): " + "; ".join(S.quote(c) for c in untested[:MAX_PROPOSED])
                     + ("; ..." if len(untested) > MAX_PROPOSED else ""))
    if findings:
        lines.append(_findings_line(view, findings))
    else:
        lines.append("- recorded findings: none")
    pending = view.finish_called
    step, calls, cost = _suggest(view, tests, findings, untested, to_test)
    if step and not pending:
        if len(calls) > 1:
            # Given the first of them in words as well, a small model takes that one and leaves the rest.
            lines.append("Suggested next calls (the protocol's; yours to decide; independent, so one reply may carry "
                         "them all): " + json.dumps(calls, ensure_ascii=False))
        else:
            lines.append(f"Suggested next step (the protocol's; yours to decide): {step}")
            if calls and calls[0]["name"] in ("generate_and_classify", "measure_rate"):
                lines.append("As a call: " + json.dumps(calls, ensure_ascii=False))
    if not pending:
        lines.append("Next: call the tools and wait for their results (never write a result yourself); do not repeat "
                     "a call whose result you have. Call finish when nothing worth testing is left, when all "
                     "confirmation attempts are used, or when the images left cannot pay for a confirmation (at "
                     f"least {cost:,} images: its first look"
                     + (", and the confirmation baseline the first one draws" if not confirmations else "") + ").")
    return "\n".join(lines)


def _suggest(view: InvestigationView, tests: Sequence[dict[str, Any]], findings: Sequence[dict[str, Any]],
             untested: Sequence[str], to_test: Sequence[Any]) -> tuple[str, list[dict[str, Any]], int]:
    """The protocol's next step in words, as calls, and the least a confirmation costs now."""
    m = view.declared_confirmations
    confirmations = sum(1 for t in tests if t.get("purpose") == "confirmation")
    rows = [(r.caption, r.k, r.n, r.wrong_label) for r in to_test]
    sizes = confirmation_sizes(view)
    tests_at = pass_sizes(min(view.screen_effects) if view.screen_effects else 3.0)
    cost = confirmation_cost(confirmations, first_n=sizes["first_n"], baseline_n=sizes["baseline_n"])
    step = next_step(tests, findings, untested, confirmations, view.images_left, declared=m,
                     saw_baseline=bool(view.calls), proposals=bool(view.proposals), to_test=rows,
                     effects=view.screen_effects, cost=cost, test_first=tests_at["first_n"])
    calls = next_calls(tests, findings, untested, confirmations, view.images_left, declared=m, to_test=rows,
                       step=step, effects=view.screen_effects, test_sizes=tests_at, confirm_sizes=sizes,
                       confirm_baseline=sizes["baseline_n"]) if step else []
    return step, calls, cost


def suggestion(events: Sequence[Event] | InvestigationView) -> tuple[str, list[dict[str, Any]]]:
    """The protocol's next step for an investigation, in words and as calls to copy (as the ledger shows them)."""
    view = events if isinstance(events, InvestigationView) else InvestigationView.from_events(events)
    tests = [_test_line(t) for t in view.tests]
    step, calls, _ = _suggest(view, tests, [_finding_line(f) for f in view.recorded], *_open(view, tests))
    return step, calls


def _open(view: InvestigationView, tests: Sequence[dict[str, Any]]) -> tuple[list[str], list[Any]]:
    """The proposed captions neither screened to a verdict nor measured (a caption a screen left open at its
    max_images is still to screen: proposed=true takes it again), and the screened captions to test."""
    measured = {_key(str(t.get("caption", ""))) for t in tests}
    decided = {k for k, r in view.screened.items() if r.verdict != "open"}
    untested = list(dict.fromkeys(p.caption for p in view.proposals
                                  if p.caption and _key(p.caption) not in measured and _key(p.caption) not in decided))
    to_test = [r for r in view.screened.values() if r.verdict == "test" and _key(r.caption) not in measured]
    return untested, to_test


def confirmation_cost(attempts: int, *, first_n: int = FIRST_N, baseline_n: int | None = None) -> int:
    """The least a confirmation costs: its first look, and the confirmation baseline that the first attempt draws
    (measure_rate's defaults unless told)."""
    return first_n + ((BASELINE_N if baseline_n is None else baseline_n) if attempts == 0 else 0)


def next_step(tests: Sequence[dict[str, Any]], findings: Sequence[dict[str, Any]], untested: Sequence[str],
              confirmations: int, left: int | None, *, saw_baseline: bool, proposals: bool,
              declared: int = MAX_CONFIRMATIONS, to_test: Sequence[tuple[str, int, int, str | None]] = (),
              effects: Sequence[float] = (), cost: int | None = None, test_first: int = FIRST_N) -> str:
    """What the protocol would do next, in words with the ids to use: record a confirmed test, confirm a supported
    discovery, test what a screen singled out, screen what was proposed, screen again for weaker effects, or ask for
    proposals. A small model follows the ids it is given. ``cost``: the least a confirmation costs now (default:
    with measure_rate's default sizes); ``test_first``: a test's first look."""
    recorded = {_key(str(f.get("caption", ""))) for f in findings}
    confirmed = {_key(str(t.get("caption", ""))): t for t in tests
                 if t.get("purpose") == "confirmation" and t.get("verdict") == "supported"}
    discovered = [t for t in tests if t.get("purpose") == "discovery" and t.get("mode") != "counterfactual"
                  and t.get("verdict") == "supported"]
    for t in discovered:
        key = _key(str(t.get("caption", "")))
        if key in confirmed and key not in recorded:
            c = confirmed[key]
            return (f"record_finding with caption {S.quote(str(t.get('caption')))}, discovery_test "
                    f"{t.get('test_id')!r}, confirmation_test {c.get('test_id')!r} and a one-sentence summary.")
    tested = {_key(str(t.get("caption", ""))) for t in tests if t.get("purpose") == "discovery"}
    orphans = [c for key, c in confirmed.items() if key not in tested and key not in recorded]
    if orphans and (left is None or left >= test_first):
        c = orphans[0]
        return (f"measure_rate with caption {S.quote(str(c.get('caption')))} and confirm=false: it was confirmed "
                f"({c.get('test_id')}) without a discovery test, which record_finding also needs.")
    if confirmations >= declared:
        return (f"finish: all {declared} confirmation attempts are used, so nothing more can be confirmed; "
                "summarise the recorded findings.")
    cost = confirmation_cost(confirmations) if cost is None else cost
    if left is not None and left < cost:
        return (f"finish: {left:,} images are left, too few for a confirmation (at least {cost:,}); summarise the "
                "recorded findings.")
    tried = {_key(str(t.get("caption", ""))) for t in tests if t.get("purpose") == "confirmation"}
    fresh = [t for t in discovered if _key(str(t.get("caption", ""))) not in tried]
    if fresh:
        best = max(fresh, key=lambda t: (t.get("rate_ratio") or {}).get("low") or 0.0)
        return (f"confirm {S.quote(str(best.get('caption')))} (supported as {best.get('test_id')}) with "
                "measure_rate(caption=..., confirm=true).")
    if to_test:
        caption, k, n, wrong = to_test[0]
        return (f"measure_rate with caption {S.quote(caption)}, which the screen singles out ({k}/{n} failed)"
                + (f", and target_label {S.quote(wrong)}, the wrong label its failures got most." if wrong else "."))
    if untested:
        return (f"screen the {len(untested)} proposed captions not yet screened in one call: generate_and_classify "
                "with proposed=true (and prompts=[captions of your own], if you have any).")
    if not saw_baseline:
        return "generate_and_classify of the class prompt (the baseline), then caption_failures of its measurement."
    if not proposals:
        return "perturb_caption of the class prompt with n=100 (every phrase of the vocabulary), to screen them."
    weaker = [e for e in (2.0, 1.5) if not effects or e < min(effects)]
    if effects and weaker and (left is None or left >= 2000):
        return (f"screen again for weaker failures: generate_and_classify with proposed=true and effect={weaker[0]:g} "
                "(earlier images count), or finish if nothing else is worth testing.")
    return "finish with a summary of the recorded findings, if nothing else is worth testing."


SIZES = ("first_n", "max_n", "baseline_n", "spending")
"""The arguments of a suggested test that say its sizes."""


def pass_sizes(effect: float) -> dict[str, Any]:
    """The sizes of the protocol planner's tests in the screening pass at ``effect`` (tools/ladder.py): a discovery
    test the screen singled out at 3x starts at 30 images against a baseline of 300, where measure_rate's defaults
    are 100 against 1,000. With the defaults, the two baselines took a third of a 6,000-image budget and each test
    100 images, and a 1.5B model reached 15 of the 38 captions a screen singled out."""
    t = min(ladder.PASSES, key=lambda p: abs(p.ratio - effect))
    return {"first_n": t.first_n, "max_n": t.test_n, "baseline_n": t.baseline_n, "spending": t.spending}


def confirmation_sizes(view: InvestigationView) -> dict[str, Any]:
    """The sizes a confirmation must use: without declared designs the first attempt's serve every attempt, so the
    first confirmation that ran fixes them; before any, the 3x pass's (the first attempt declares them)."""
    for r in view.returned:
        if r.event.name == "measure_rate" and r.arguments.get("confirm") is True and r.event.ok:
            given = {k: r.arguments[k] for k in SIZES if k in r.arguments}
            fields = measure_rate.Args.model_fields
            return {k: given.get(k, fields[k].default) for k in SIZES}
    return pass_sizes(3.0)


def _measure(caption: str, label: str | None, sizes: dict[str, Any] | None = None, *,
             confirm: bool = False) -> dict[str, Any]:
    args: dict[str, Any] = {"caption": caption}
    if label:
        args["target_label"] = label
    if confirm:
        args["confirm"] = True
    return {"name": "measure_rate", "arguments": {**args, **(sizes or {})}}


def next_calls(tests: Sequence[dict[str, Any]], findings: Sequence[dict[str, Any]], untested: Sequence[str],
               confirmations: int, left: int | None, *, declared: int = MAX_CONFIRMATIONS,
               to_test: Sequence[tuple[str, int, int, str | None]] = (), step: str = "",
               effects: Sequence[float] = (), test_sizes: dict[str, Any] | None = None,
               confirm_sizes: dict[str, Any] | None = None, confirm_baseline: int | None = None
               ) -> list[dict[str, Any]]:
    """The protocol's next step as calls a small model can copy, several at once where they are independent: every
    confirmed test not yet recorded, every supported discovery not yet confirmed (while attempts and images last),
    then discovery tests of what the screen singled out, in its order, while the images left still pay for a
    confirmation after them; at most ``MAX_CALLS``. A screen step is its one call (proposed=true at the pass's
    effect, with no cap but the tool's own: a small model was seen capping a 138-caption screen at 100 images).
    Empty when the step is the baseline, perturbations or finish: the words say it. Tests carry ``test_sizes`` and
    confirmations ``confirm_sizes`` (none: measure_rate's defaults); ``confirm_baseline`` is what the first
    confirmation draws."""
    test_first = (test_sizes or {}).get("first_n", FIRST_N)
    conf_first = (confirm_sizes or {}).get("first_n", FIRST_N)

    def cost(attempts: int) -> int:
        return confirmation_cost(attempts, first_n=conf_first, baseline_n=confirm_baseline)

    recorded = {_key(str(f.get("caption", ""))) for f in findings}
    confirmed = {_key(str(t.get("caption", ""))): t for t in tests
                 if t.get("purpose") == "confirmation" and t.get("verdict") == "supported"}
    discovered = [t for t in tests if t.get("purpose") == "discovery" and t.get("mode") != "counterfactual"
                  and t.get("verdict") == "supported"]
    calls: list[dict[str, Any]] = []
    for t in discovered:
        key = _key(str(t.get("caption", "")))
        if key in confirmed and key not in recorded and len(calls) < MAX_CALLS:
            recorded.add(key)
            calls.append({"name": "record_finding", "arguments": {
                "caption": t.get("caption"), "discovery_test": t.get("test_id"),
                "confirmation_test": confirmed[key].get("test_id")}})
    tested = {_key(str(t.get("caption", ""))) for t in tests if t.get("purpose") == "discovery"}
    for key, c in confirmed.items():
        if key not in tested and key not in recorded and len(calls) < MAX_CALLS and \
                (left is None or left >= test_first):
            calls.append(_measure(str(c.get("caption")), c.get("target_label"), test_sizes))
    if step.startswith("finish"):
        return calls
    if step.startswith("screen the") or step.startswith("screen again"):
        effect = min(effects) if effects else 3.0
        if step.startswith("screen again"):
            effect = next((e for e in (2.0, 1.5) if e < effect), effect)
        return calls + [{"name": "generate_and_classify", "arguments": {"proposed": True, "effect": effect}}]
    room = None if left is None else left
    attempts = declared - confirmations
    tried = {_key(str(t.get("caption", ""))) for t in tests if t.get("purpose") == "confirmation"}
    fresh = sorted((t for t in discovered if _key(str(t.get("caption", ""))) not in tried),
                   key=lambda t: -((t.get("rate_ratio") or {}).get("low") or 0.0))
    n_conf = confirmations
    for t in fresh:
        if len(calls) >= MAX_CALLS or attempts <= 0 or (room is not None and room < cost(n_conf)):
            break
        calls.append(_measure(str(t.get("caption")), t.get("target_label"), confirm_sizes, confirm=True))
        attempts -= 1
        room = None if room is None else room - cost(n_conf)
        n_conf += 1
    for caption, _, _, wrong in to_test:
        # a discovery's first look, and after it the least a confirmation of it costs
        need = test_first + cost(n_conf)
        if len(calls) >= MAX_CALLS or attempts <= 0 or (room is not None and room < need):
            break
        calls.append(_measure(caption, wrong, test_sizes))
        room = None if room is None else room - test_first
    return calls
