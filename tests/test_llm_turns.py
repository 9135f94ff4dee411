"""What the LLM planner sends and records per turn, against the scripted OpenAI-compatible stub: the ledger, a prompt
prefix that stays byte-identical across turns (a server's prompt cache keeps it), the forced-call setting, timeouts
retried once, and each turn's latency and request count."""

from __future__ import annotations

import json
import os
import time
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from fakeworld import fake_backends
from llm_stub import HttpError, StubServer, text_reply, tool_call, tool_reply

from sleuth.agent.events import PlannerTurn
from sleuth.agent.llm import LLMClient, LLMConfig
from sleuth.agent.llm.context import whole_results
from sleuth.agent.planners.llm import LLMPlanner
from sleuth.agent.transcript import read_transcript
from sleuth.tools import investigation_tools as registry
from sleuth.tools.cache import PredictionCache
from tests.fakeworld import new_session

KEY_ENV = "SLEUTH_STUB_API_KEY"
CAT = "a realistic photograph of a cat"
SNOW = CAT + ". it is in the snow."


def make(stub: StubServer, tmp_path, *, mode: str = "investigate", confirmations: int = 10,
         **config: Any) -> tuple[Any, LLMPlanner]:
    sess = new_session(fake_backends(), tmp_path / "run", cache=PredictionCache(), confirmations=confirmations)
    cfg = LLMConfig(model="openai/stub-model", api_base=stub.api_base, api_key_env=KEY_ENV, retries=3,
                    backoff_s=0.0, **config)
    client = LLMClient(cfg, sleep=lambda s: None, environ={KEY_ENV: "sk-stub-not-a-real-key-000000"})
    planner = LLMPlanner(client, registry(), label="cat", class_prompt=CAT,
                         labels=sess.backends.classifier.labels.labels, budget=20_000, artifacts=sess.artifacts,
                         mode=mode)  # type: ignore[arg-type]
    return sess, planner


def measure(i: int, caption: str = SNOW, **extra: Any) -> dict[str, Any]:
    return tool_call("measure_rate", {"caption": caption, "max_n": 100, **extra}, f"m{i}")


def test_the_ledger_lists_tests_findings_attempts_and_images(tmp_path):
    script = [tool_reply(measure(1)), tool_reply(measure(2, confirm=True)),
              tool_reply(tool_call("finish", {"summary": "done"}, "f"))]
    with StubServer(script) as stub:
        sess, planner = make(stub, tmp_path, confirmations=7)
        assert sess.run(planner).status == "completed"
    first, second, third = (r.messages[-1]["content"] for r in stub.requests)
    # The attempts are the run's declared family (recorded in run_started), each tested at alpha over it.
    assert first.startswith("Ledger") and "tests: none yet" in first and "0 of 7 used (each tested at alpha/7)" in first
    # After the discovery test: its id, caption, verdict and adjusted p, and the images it used.
    t1 = next(e for e in read_transcript(sess.transcript) if e.kind == "tool_returned").result
    assert f"t1 discovery \"{SNOW}\": {t1['verdict']}" in second
    used = t1["hypothesis"]["failures"]["n"] + t1["baseline"]["n"]
    assert f"- images: {used:,} used, {20_000 - used:,} left of 20,000" in second
    assert "1 of 7 used" in third and "t2 confirmation" in third
    assert "recorded findings: none" in third and "Call finish when" in third
    # The protocol's next step, with the ids to use: confirm the supported discovery, then record it.
    assert t1["verdict"] == "supported"
    assert f'Suggested next step (the protocol\'s; yours to decide): confirm "{SNOW}" (supported as t1)' in second
    assert f"record_finding with caption \"{SNOW}\", discovery_test 't1', confirmation_test 't2'" in third


def test_the_ledger_lists_what_was_proposed_and_not_yet_measured(tmp_path):
    script = [tool_reply(tool_call("perturb_caption", {"caption": CAT, "types": ["background"]}, "p")),
              tool_reply(measure(1, caption=CAT + " in the snow.")),
              tool_reply(tool_call("finish", {"summary": "done"}, "f"))]
    with StubServer(script) as stub:
        sess, planner = make(stub, tmp_path)
        sess.run(planner)
    edits = next(e for e in read_transcript(sess.transcript) if e.kind == "tool_returned").result["edits"]
    captions = [e["caption"] for e in edits]
    assert CAT + " in the snow." in captions and len(captions) >= 2
    after_proposal, after_test = stub.requests[1].messages[-1]["content"], stub.requests[2].messages[-1]["content"]
    assert f"proposed and not yet screened or measured ({len(captions)};" in after_proposal
    assert f"proposed and not yet screened or measured ({len(captions) - 1};" in after_test
    listed = after_test.split("proposed and not yet screened or measured")[1].split("\n")[0]
    first_untested = next(c for c in captions if c != CAT + " in the snow.")
    assert f'"{CAT} in the snow."' not in listed and f'"{first_untested}"' in listed
    # The suggested step screens them all in one call.
    assert (f"screen the {len(captions)} proposed captions not yet screened in one call: generate_and_classify "
            "with proposed=true") in after_proposal
    assert 'As a call: [{"name": "generate_and_classify", "arguments": {"proposed": true, "effect": 3.0}}]' \
        in after_proposal


def test_the_ledger_shows_the_screen_and_suggests_testing_what_it_singles_out(tmp_path):
    grass = CAT + " in the grass."
    script = [tool_reply(tool_call("generate_and_classify", {"prompts": [grass, SNOW]}, "s")),
              tool_reply(measure(1, caption=SNOW)),
              tool_reply(tool_call("finish", {"summary": "done"}, "f"))]
    with StubServer(script) as stub:
        sess, planner = make(stub, tmp_path)
        sess.run(planner)
    screen = next(e for e in read_transcript(sess.transcript) if e.kind == "tool_returned").result["screen"]
    rows = {r["caption"]: r for r in screen["captions"]}
    assert rows[SNOW]["verdict"] == "test" and rows[grass]["verdict"] == "dropped"
    after_screen, after_test = stub.requests[1].messages[-1]["content"], stub.requests[2].messages[-1]["content"]
    snow = rows[SNOW]
    assert (f'- screened (2 captions, latest at 3x): to test (1): "{SNOW}" {snow["k"]}/{snow["n"]}; 1 dropped'
            in after_screen)
    assert (f'measure_rate with caption "{SNOW}", which the screen singles out ({snow["k"]}/{snow["n"]} failed), '
            'and target_label "snow leopard"') in after_screen
    # Once tested, it leaves the list, and the next step follows the test.
    assert "- screened (2 captions, latest at 3x): none to test; 1 dropped" in after_test
    assert "which the screen singles out" not in after_test


def test_the_prompt_prefix_is_byte_identical_across_turns(tmp_path):
    """Between the ledger's updates only new messages are added: every request starts with the previous request's
    messages (less its ledger), byte for byte, so a server's prompt cache keeps them."""
    script = [tool_reply(measure(i, caption=f"{CAT}. it is in the snow. number {i}.")) for i in range(5)]
    script.append(tool_reply(tool_call("finish", {"summary": "done"}, "f")))
    with StubServer(script) as stub:
        sess, planner = make(stub, tmp_path)
        sess.run(planner)
    requests = [r.messages for r in stub.requests]
    assert len(requests) == 6
    for before, after in zip(requests, requests[1:]):
        stable = before[:-1]  # the ledger is last and changes
        assert json.dumps(after[:len(stable)]) == json.dumps(stable)
        assert len(after) > len(before)


def test_older_results_shrink_in_blocks_not_one_per_turn():
    ids = [f"c{i}" for i in range(20)]
    # The newest 6 to 11 results stay whole; the boundary moves 6 at a time.
    assert whole_results(ids[:6], 6) == set(ids[:6])
    assert whole_results(ids[:11], 6) == set(ids[:11])
    assert whole_results(ids[:12], 6) == set(ids[6:12])
    assert whole_results(ids[:17], 6) == set(ids[6:17])
    assert whole_results(ids[:18], 6) == set(ids[12:18])


def test_tool_choice_is_sent_in_investigations_only(tmp_path):
    with StubServer([tool_reply(tool_call("finish", {"summary": "done"}, "f"))]) as stub:
        sess, planner = make(stub, tmp_path / "required", tool_choice="required")
        sess.run(planner)
    assert stub.requests[0].body["tool_choice"] == "required"
    with StubServer([tool_reply(tool_call("finish", {"summary": "done"}, "f"))]) as stub:
        sess, planner = make(stub, tmp_path / "default")
        sess.run(planner)
    assert "tool_choice" not in stub.requests[0].body
    # In chat the model must be free to answer in words: the forced call is not sent.
    with StubServer([text_reply("Cats fail in snow, I would test that.")]) as stub:
        sess, planner = make(stub, tmp_path / "chat", mode="chat", tool_choice="required")
        turn = planner.next_turn([])
    assert "tool_choice" not in stub.requests[0].body and turn.final


def slow(reply: Any, seconds: float) -> Any:
    def step(body: dict[str, Any]) -> Any:
        time.sleep(seconds)
        return reply
    return step


def test_a_timeout_is_retried_once_then_the_run_says_what_to_change(tmp_path):
    finish = tool_reply(tool_call("finish", {"summary": "done"}, "f"))
    with StubServer([slow(finish, 1.5), finish]) as stub:
        sess, planner = make(stub, tmp_path / "once", timeout_s=0.5)
        result = sess.run(planner)
    assert result.status == "completed" and len(stub.requests) == 2
    turn = next(e for e in read_transcript(sess.transcript) if isinstance(e, PlannerTurn))
    assert turn.requests == 2 and turn.latency_s is not None and turn.latency_s >= 0.5
    with StubServer([slow(finish, 1.5), slow(finish, 1.5), finish]) as stub:
        sess, planner = make(stub, tmp_path / "twice", timeout_s=0.5)
        result = sess.run(planner)
    # Not retried a third time (retries=3 would allow it for other failures): the same request would time out again.
    assert result.status == "error" and len(stub.requests) == 2
    error = next(e for e in read_transcript(sess.transcript) if e.kind == "error")
    assert "timed out 2 times after 0.5 s" in error.message and "--llm-timeout" in error.message


def test_each_turn_records_its_latency_and_requests(tmp_path):
    script = [HttpError(503, "busy"), tool_reply(measure(1)), tool_reply(tool_call("finish", {"summary": "x"}, "f"))]
    with StubServer(script) as stub:
        sess, planner = make(stub, tmp_path)
        sess.run(planner)
    turns = [e for e in read_transcript(sess.transcript) if isinstance(e, PlannerTurn)]
    assert [t.requests for t in turns] == [2, 1]
    assert all(t.latency_s is not None and 0 <= t.latency_s < 30 for t in turns)


def test_forced_call_mode_sends_a_grammar_instead_of_tools_and_reads_the_calls(tmp_path):
    def reply(calls: list[dict[str, Any]], note: str) -> Any:
        return text_reply(json.dumps({"calls": calls, "note": note}))

    look = {"name": "generate_and_classify", "arguments": {"prompt": CAT, "n": 20}}
    other = {"name": "generate_and_classify", "arguments": {"prompt": SNOW, "n": 10}}
    # several calls in one reply, one of them twice (run once); then the earlier one-call form
    script = [reply([look, other, look], "the baseline first"),
              text_reply(json.dumps({"call": {"name": "finish", "arguments": {"summary": "nothing confirmed"}},
                                     "note": "done"}))]
    with StubServer(script) as stub:
        sess, planner = make(stub, tmp_path, call_format="json")
        result = sess.run(planner)
    assert result.status == "completed"
    body = stub.requests[0].body
    assert "tools" not in body and "tool_choice" not in body
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["calls", "note"] and list(schema["properties"]) == ["calls", "note"]
    calls = schema["properties"]["calls"]
    assert (calls["minItems"], calls["maxItems"]) == (1, 8)
    names = [o["properties"]["name"]["const"] for o in calls["items"]["oneOf"]]
    assert set(names) == set(registry().names()) and schema["properties"]["note"]["maxLength"] == 160
    # The tools are described in the system prompt instead, their arguments without the schema's descriptions (the
    # prompt's tool guide says what they are for, and every request is shorter for it).
    guide = body["messages"][0]["content"].split("## How to call tools")[1]
    assert '"name": "measure_rate"' in guide and '"first_n": {"default": 100' in guide
    assert "Images at the first look." not in guide and guide.count('"description"') == len(registry().names())
    turns = [e for e in read_transcript(sess.transcript) if isinstance(e, PlannerTurn)]
    assert [[c.name for c in t.tool_calls] for t in turns] == [["generate_and_classify"] * 2, ["finish"]]
    assert [c.arguments["prompt"] for c in turns[0].tool_calls] == [CAT, SNOW]
    assert turns[0].reasoning == "the baseline first"
    returned = [e for e in read_transcript(sess.transcript) if e.kind == "tool_returned"]
    assert [r.ok for r in returned] == [True, True, True]


def test_a_reply_that_repeats_the_previous_calls_is_asked_again_once(tmp_path):
    """A small model can loop on its last call; it is told so once, and a second repeat runs as asked."""
    look = tool_call("generate_and_classify", {"prompt": CAT, "n": 20}, "g")
    finish = tool_reply(tool_call("finish", {"summary": "x"}, "f"))
    with StubServer([tool_reply(look), tool_reply(dict(look, id="g2")), finish]) as stub:
        sess, planner = make(stub, tmp_path / "once")
        sess.run(planner)
    turns = [e for e in read_transcript(sess.transcript) if isinstance(e, PlannerTurn)]
    assert [[c.name for c in t.tool_calls] for t in turns] == [["generate_and_classify"], ["finish"]]
    assert turns[1].requests == 2 and len(stub.requests) == 3
    assert "repeats your previous calls exactly" in stub.requests[2].messages[-1]["content"]
    with StubServer([tool_reply(look), tool_reply(dict(look, id="g2")), tool_reply(dict(look, id="g3")), finish]) \
            as stub:
        sess, planner = make(stub, tmp_path / "twice")
        sess.run(planner)
    turns = [e for e in read_transcript(sess.transcript) if isinstance(e, PlannerTurn)]
    assert [[c.name for c in t.tool_calls] for t in turns] == [["generate_and_classify"]] * 2 + [["finish"]]


def test_a_second_repeat_runs_the_ledgers_suggested_calls_instead(tmp_path):
    """Seen with a 1.5B model: confirmed findings left unrecorded while it re-ran the same calls turn after turn.
    A second word-for-word repeat is replaced by the ledger's calls, here the record_finding it suggested."""
    confirm = measure(2, confirm=True)
    script = [tool_reply(measure(1)), tool_reply(confirm), tool_reply(dict(confirm, id="m3")),
              tool_reply(dict(confirm, id="m4"))]
    with StubServer(script, fallback=tool_reply(tool_call("finish", {"summary": "x"}, "f"))) as stub:
        sess, planner = make(stub, tmp_path)
        assert sess.run(planner).status == "completed"
    events = read_transcript(sess.transcript)
    turns = [e for e in events if isinstance(e, PlannerTurn)]
    returned = [e for e in events if e.kind == "tool_returned"]
    assert [r.result["verdict"] for r in returned[:2]] == ["supported", "supported"]
    assert [[c.name for c in t.tool_calls] for t in turns] == [["measure_rate"], ["measure_rate"], ["record_finding"],
                                                               ["finish"]]
    record = turns[2].tool_calls[0].arguments
    assert (record["discovery_test"], record["confirmation_test"]) == ("t1", "t2") and record["caption"] == SNOW
    assert "in place of a second repeat" in turns[2].reasoning and turns[2].requests == 2
    assert [r.name for r in returned if r.ok] == ["measure_rate", "measure_rate", "record_finding", "finish"]


def test_before_failed_turns_end_the_run_the_ledgers_suggested_calls_run_in_the_models_place(tmp_path):
    """Seen with a 1.5B model: calls that failed twice running, then the run ended as an error with confirmed
    findings unrecorded. The turn that could end the run runs the ledger's calls instead."""
    wrong = measure(9, caption=SNOW + " it is small.", max_n=5)  # max_n below the tool's least: a ToolError
    script = [tool_reply(measure(1)), tool_reply(measure(2, confirm=True)), tool_reply(wrong),
              tool_reply(dict(wrong, id="r2"))]
    with StubServer(script, fallback=tool_reply(tool_call("finish", {"summary": "x"}, "f"))) as stub:
        sess, planner = make(stub, tmp_path)
        assert sess.run(planner).status == "completed"
    events = read_transcript(sess.transcript)
    turns = [e for e in events if isinstance(e, PlannerTurn)]
    assert [[c.name for c in t.tool_calls] for t in turns] == [["measure_rate"]] * 4 + [["record_finding"]] + [
        ["finish"]]
    assert [r.ok for r in events if r.kind == "tool_returned"] == [True, True, False, False, True, True]
    assert turns[4].requests == 0 and "its last 2 turns had only failed tool calls" in turns[4].reasoning
    assert turns[4].tool_calls[0].arguments == {"caption": SNOW, "discovery_test": "t1", "confirmation_test": "t2"}
    assert len(stub.requests) == 5  # the model is not asked for the turn sleuth made, and has the next one


def test_calls_that_repeat_the_last_turns_or_reconfirm_are_not_run_and_record_finding_gets_the_ledgers_ids(
        tmp_path):
    """Seen with a 1.5B model, seven turns running: the same look, a new confirmation of a caption already confirmed
    and a record_finding with ids that were not the caption's tests, beside calls that changed. Call by call, the
    repeat and the re-confirmation are not run and the record_finding gets the ledger's pair; a reply with nothing
    left runs the ledger's calls."""
    look = tool_call("generate_and_classify", {"prompt": SNOW, "n": 20}, "g")
    wrong = tool_call("record_finding", {"caption": SNOW, "discovery_test": "t3", "confirmation_test": "t9",
                                         "summary": "cats in snow fail"}, "r")
    first = [tool_reply(measure(1)), tool_reply(look, measure(2, confirm=True))]
    script = first + [tool_reply(dict(look, id="g2"), measure(3, confirm=True, max_n=200), wrong)]
    with StubServer(script, fallback=tool_reply(tool_call("finish", {"summary": "x"}, "f"))) as stub:
        sess, planner = make(stub, tmp_path / "mixed")
        assert sess.run(planner).status == "completed"
    events = read_transcript(sess.transcript)
    turns = [e for e in events if isinstance(e, PlannerTurn)]
    assert [[c.name for c in t.tool_calls] for t in turns] == [
        ["measure_rate"], ["generate_and_classify", "measure_rate"], ["record_finding"], ["finish"]]
    assert turns[2].tool_calls[0].arguments == {"caption": SNOW, "discovery_test": "t1", "confirmation_test": "t2",
                                                "summary": "cats in snow fail"}
    assert "did not run generate_and_classify (a repeat of the previous turn's call)" in turns[2].reasoning
    assert "already confirmed" in turns[2].reasoning and "given the ledger's test ids (t1, t2)" in turns[2].reasoning
    returned = [e for e in events if e.kind == "tool_returned"]
    assert all(r.ok for r in returned) and sum(r.name == "measure_rate" for r in returned) == 2
    assert turns[2].requests == 1  # not a whole-reply repeat: the model is not asked again
    # Nothing left of a reply: the ledger's suggestion (here its record_finding) runs in its place.
    script = first + [tool_reply(dict(look, id="g2"), measure(3, confirm=True, max_n=200))]
    with StubServer(script, fallback=tool_reply(tool_call("finish", {"summary": "x"}, "f"))) as stub:
        sess, planner = make(stub, tmp_path / "empty")
        assert sess.run(planner).status == "completed"
    turns = [e for e in read_transcript(sess.transcript) if isinstance(e, PlannerTurn)]
    assert [c.name for c in turns[2].tool_calls] == ["record_finding"]
    assert turns[2].tool_calls[0].arguments == {"caption": SNOW, "discovery_test": "t1", "confirmation_test": "t2"}
    assert "ran the ledger's suggested calls (record_finding) instead" in turns[2].reasoning


def test_record_findings_with_each_others_ids_get_their_own_pairs(tmp_path):
    """Seen with a 1.5B model copying eight suggested records: it paired each caption with the ids of another's."""
    day = SNOW + " it is daytime."
    swapped = [tool_call("record_finding", {"caption": SNOW, "discovery_test": "t2", "confirmation_test": "t4"}, "r1"),
               tool_call("record_finding", {"caption": day, "discovery_test": "t1", "confirmation_test": "t3"}, "r2")]
    script = [tool_reply(measure(1), measure(2, caption=day)),
              tool_reply(measure(3, confirm=True), measure(4, caption=day, confirm=True)), tool_reply(*swapped)]
    with StubServer(script, fallback=tool_reply(tool_call("finish", {"summary": "x"}, "f"))) as stub:
        sess, planner = make(stub, tmp_path)
        assert sess.run(planner).status == "completed"
    events = read_transcript(sess.transcript)
    turns = [e for e in events if isinstance(e, PlannerTurn)]
    assert [(c.arguments["caption"], c.arguments["discovery_test"], c.arguments["confirmation_test"])
            for c in turns[2].tool_calls] == [(SNOW, "t1", "t3"), (day, "t2", "t4")]
    assert [r.ok for r in events if r.kind == "tool_returned"] == [True] * 7


def test_a_spent_budget_ends_the_run_cleanly_and_max_turns_ends_it_with_its_own_status(tmp_path):
    look = tool_call("generate_and_classify", {"prompt": CAT, "n": 250}, "g")
    again = tool_call("generate_and_classify", {"prompt": SNOW, "n": 250}, "g2")
    with StubServer([tool_reply(look), tool_reply(again)],
                    fallback=tool_reply(tool_call("finish", {"summary": "x"}, "f"))) as stub:
        sess, planner = make(stub, tmp_path / "budget")
        sess.investigation.budget.images = 300
        result = sess.run(planner)
    # The second look is refused for want of images: the run ends there, cleanly, without asking the model again.
    assert result.status == "budget_spent" and len(stub.requests) == 2
    assert "- images: 250 used, 50 left of 300" in stub.requests[1].messages[-1]["content"]
    with StubServer([], fallback=tool_reply(measure(1))) as stub:
        sess, planner = make(stub, tmp_path / "turns")
        result = sess.run(planner, max_turns=2)
    # (the second turn repeats the first word for word, so it is asked once more before it runs)
    assert (result.status, result.n_turns) == ("max_turns", 2) and len(stub.requests) == 3


def _t(tid: str, caption: str, purpose: str, verdict: str, low: float = 2.0) -> dict[str, Any]:
    return {"test_id": tid, "caption": caption, "purpose": purpose, "verdict": verdict, "mode": "single",
            "rate_ratio": {"low": low}}


def test_the_suggested_step_follows_the_protocol_and_ends_in_finish() -> None:
    from sleuth.agent.llm.ledger import next_step

    def step(tests: list[dict[str, Any]], findings: list[dict[str, Any]] | None = None, untested: tuple[str, ...] = (),
             left: int | None = 5000) -> str:
        confirmations = sum(1 for t in tests if t["purpose"] == "confirmation")
        return next_step(tests, findings or [], list(untested), confirmations, left, saw_baseline=True,
                         proposals=True)

    assert step([]).startswith("finish with")
    assert "generate_and_classify with proposed=true" in step([], untested=("a cat. it is dark.",))
    # Everything screened and tested: screen again for weaker effects while images remain, then finish.
    again = next_step([], [], [], 0, 5000, saw_baseline=True, proposals=True, effects=[3.0])
    assert again.startswith("screen again for weaker failures: generate_and_classify with proposed=true and effect=2 ")
    assert "effect=1.5" in next_step([], [], [], 0, 5000, saw_baseline=True, proposals=True, effects=[3.0, 2.0])
    assert next_step([], [], [], 0, 5000, saw_baseline=True, proposals=True, effects=[3.0, 2.0, 1.5]).startswith(
        "finish with")
    assert next_step([], [], [], 0, 1500, saw_baseline=True, proposals=True, effects=[3.0]).startswith("finish with")
    first = next_step([], [], [], 0, 5000, saw_baseline=True, proposals=True,
                      to_test=[("a cat. it is dark.", 5, 12, "snow leopard")])
    assert first == ('measure_rate with caption "a cat. it is dark.", which the screen singles out (5/12 failed), and '
                     'target_label "snow leopard", the wrong label its failures got most.')
    found = [_t("t1", SNOW, "discovery", "supported"), _t("t2", "x", "discovery", "supported", low=4.0)]
    assert "confirm 'x' (supported as t2)" in step(found).replace('"', "'")
    # A confirmation made before any discovery test of its caption: the discovery record_finding needs comes first.
    early = step([_t("t1", SNOW, "confirmation", "supported")])
    assert early.startswith(f'measure_rate with caption "{SNOW}" and confirm=false: it was confirmed (t1) without')
    confirmed = [*found, _t("t3", SNOW, "confirmation", "supported")]
    assert "discovery_test 't1', confirmation_test 't3'" in step(confirmed)
    # a confirmed test waiting to be recorded comes first even when the attempts or the images have run out
    spent = confirmed + [_t(f"c{i}", f"y{i}", "confirmation", "not supported") for i in range(9)]
    assert "record_finding" in step(spent, left=100)
    recorded = [{"finding_id": "f1", "caption": SNOW}]
    # all ten attempts used: nothing can be confirmed, so measuring more is waste
    assert step(spent, recorded, untested=("a cat. it is dark.",)).startswith("finish: all 10 confirmation")
    # too few images for a confirmation: finish rather than measure or confirm
    assert step(found, untested=("a cat. it is dark.",), left=299).startswith("finish: 299 images are left")
    assert "confirm" in step(found, left=300)


def test_the_suggested_calls_batch_what_is_independent_and_keep_images_for_a_confirmation() -> None:
    from sleuth.agent.llm.ledger import next_calls

    def t(tid: str, caption: str, purpose: str, verdict: str, low: float = 2.0, label: str | None = None):
        return dict(_t(tid, caption, purpose, verdict, low), target_label=label)

    queue = [(f"a cat {i}.", 3, 3, "fox") for i in range(6)]
    tests = [t("t1", "a", "discovery", "supported", label="bee"), t("t2", "a", "confirmation", "supported"),
             t("t3", "b", "discovery", "supported", low=3.0, label="dog"), t("t4", "c", "discovery", "supported")]
    calls = next_calls(tests, [], [], 1, 5000, declared=24, to_test=queue)
    # the confirmed test recorded, the discoveries confirmed surest first (with their label), then new tests in the
    # screen's order up to the calls a reply may carry
    assert calls == [
        {"name": "record_finding", "arguments": {"caption": "a", "discovery_test": "t1", "confirmation_test": "t2"}},
        {"name": "measure_rate", "arguments": {"caption": "b", "target_label": "dog", "confirm": True}},
        {"name": "measure_rate", "arguments": {"caption": "c", "confirm": True}},
    ] + [{"name": "measure_rate", "arguments": {"caption": f"a cat {i}.", "target_label": "fox"}} for i in range(5)]
    assert len(next_calls([], [], [], 0, 5000, to_test=queue)) == 6
    assert len(next_calls([], [], [], 0, 5000, to_test=queue * 2)) == 8
    # a new test is suggested only while a confirmation of it could still be paid for after its first look
    assert len(next_calls([], [], [], 1, 350, to_test=queue)) == 2
    assert next_calls([], [], [], 1, 199, to_test=queue) == []
    assert len(next_calls([], [], [], 0, 1350, to_test=queue)) == 2  # the first confirmation draws its baseline
    # no attempts left: nothing to test, and a confirmation made before its discovery test gets that test
    assert next_calls([], [], [], 10, 5000, declared=10, to_test=queue) == []
    # a screen is one call at the pass's effect, with no cap of its own choosing; a weaker pass at the next effect
    screen = next_calls([], [], ["x"], 0, 5000, step="screen the 1 proposed captions ...", effects=[3.0, 2.0])
    assert screen == [{"name": "generate_and_classify", "arguments": {"proposed": True, "effect": 2.0}}]
    weaker = next_calls([], [], [], 0, 5000, step="screen again for weaker failures: ...", effects=[3.0])
    assert weaker == [{"name": "generate_and_classify", "arguments": {"proposed": True, "effect": 2.0}}]
    assert next_calls([], [], [], 0, 5000, step="finish with a summary") == []
    early = [t("t1", "a", "confirmation", "supported", label="fox")]
    assert next_calls(early, [], [], 1, 5000, to_test=queue)[0] == {
        "name": "measure_rate", "arguments": {"caption": "a", "target_label": "fox"}}


def test_suggested_tests_carry_the_screening_pass_sizes_and_confirmations_the_first_attempts(tmp_path):
    """Tests at the sizes of the screen's pass (30 images first, against 300 baseline images at 3x) reach more of
    what a screen singles out than measure_rate's defaults (100 against 1,000); confirmations keep the sizes the
    first attempt fixed for them."""
    from sleuth.agent.llm.ledger import confirmation_sizes, next_calls, pass_sizes
    from sleuth.agent.view import InvestigationView

    strong = {"first_n": 30, "max_n": 300, "baseline_n": 300, "spending": "pocock"}
    assert pass_sizes(3.0) == strong and pass_sizes(2.0)["first_n"] == 50 and pass_sizes(1.5)["max_n"] == 2000
    tests = [_t("t1", "x", "discovery", "supported")]
    queue = [("y", 3, 3, "fox"), ("z", 3, 3, "fox")]
    calls = next_calls(tests, [], [], 0, 400, to_test=queue, test_sizes=strong, confirm_sizes=strong,
                       confirm_baseline=300)
    # the first confirmation costs 30 + its 300 baseline images; one test (30) still leaves a confirmation (30)
    assert calls == [{"name": "measure_rate", "arguments": {"caption": "x", "confirm": True, **strong}},
                     {"name": "measure_rate", "arguments": {"caption": "y", "target_label": "fox", **strong}}]
    assert next_calls(tests, [], [], 0, 400, to_test=queue) == []  # at the defaults a confirmation needs 1,100
    # before any confirmation the 3x pass's sizes; after one, the sizes it ran with (defaults for those not given)
    own = {"first_n": 50, "max_n": 400, "baseline_n": 200}
    script = [tool_reply(measure(1)), tool_reply(measure(2, confirm=True, **own))]
    with StubServer(script, fallback=tool_reply(tool_call("finish", {"summary": "x"}, "f"))) as stub:
        sess, planner = make(stub, tmp_path)
        sess.run(planner)
    events = read_transcript(sess.transcript)
    first = [e for e in events if e.kind == "tool_returned"][0].seq
    assert confirmation_sizes(InvestigationView.from_events([e for e in events if e.seq <= first])) == strong
    assert confirmation_sizes(InvestigationView.from_events(events)) == {**own, "spending": "obrien-fleming"}
    # the ledger shows a single suggested call as a call to copy, with its sizes
    assert 'As a call: [{"name": "measure_rate"' in stub.requests[1].messages[-1]["content"]
    assert '"confirm": true, "first_n": 30, "max_n": 300, "baseline_n": 300, "spending": "pocock"}' in \
        stub.requests[1].messages[-1]["content"]


def test_forced_call_schema_bounds_every_free_string() -> None:
    """In forced-call mode the grammar must let a small model close every string: a finish summary without a bound
    ran past 950 tokens on a real model."""
    from sleuth.agent.planners.llm import ARGUMENT_CHARS, NOTE_CHARS, call_response_format

    fmt = call_response_format(registry().schemas())
    strings = _walk_strings(fmt["json_schema"]["schema"])
    names = [p for p, _ in strings]
    assert any(p.endswith("/caption") for p in names) and any(p.endswith("/summary") for p in names)
    free = [(p, s) for p, s in strings if "enum" not in s and "const" not in s]
    assert free and all("maxLength" in s for _, s in free)
    assert {s["maxLength"] for p, s in free if p.endswith("/summary")} == {ARGUMENT_CHARS}
    assert {s["maxLength"] for p, s in free if p.endswith("/note")} == {NOTE_CHARS}
    # the tools' own schemas (sent with --call-format tools) are left as they are
    finish = next(t for t in registry().schemas() if t["function"]["name"] == "finish")
    assert "maxLength" not in finish["function"]["parameters"]["properties"]["summary"]


def _walk_strings(schema: Any, path: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    if isinstance(schema, dict):
        if schema.get("type") == "string":
            out.append((path, schema))
        for k, v in schema.items():
            out += _walk_strings(v, f"{path}/{k}")
    elif isinstance(schema, list):
        for i, v in enumerate(schema):
            out += _walk_strings(v, f"{path}/{i}")
    return out
