"""`sleuth chat`: slash commands, /auto, the LLM in conversation, Ctrl-C, and a person typing into a terminal."""

from __future__ import annotations

import io
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from rich.console import Console

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from fakeworld import fake_backends
from llm_stub import StubServer, text_reply, tool_call, tool_reply

from sleuth.agent.chat import PROMPT, STOPPED, Chat, auto_planner, help_table
from sleuth.agent.chat import commands as C
from sleuth.agent.chat.lineedit import history_path, line_reader, load_history, save_history
from sleuth.agent.cli import main
from sleuth.agent.events import PlannerTurn, ToolCalled, ToolReturned, UserMessage
from sleuth.agent.llm import LLMClient, LLMConfig
from sleuth.agent.planners.llm import LLMPlanner
from sleuth.agent.planners.protocol_v1 import ProtocolV1Planner
from sleuth.agent.session import Session
from sleuth.agent.terminal.render import render_event
from sleuth.agent.transcript import TranscriptWriter, read_transcript
from sleuth.tools import investigation_tools as registry
from sleuth.tools.cache import PredictionCache
from tests.fakeworld import new_session

ROOT = Path(__file__).resolve().parents[1]
SNOW = "a realistic photograph of a cat. it is in the snow."
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")
# A rate as the screen shows it: k/n with its 95% interval, e.g. "61/100 [51.2–70.0%]" or "61/100 = 61.0% [...]".
RATE_WITH_INTERVAL = re.compile(r"(\d+)/(\d+)(?: = \d+\.\d%)? \[(\d+\.\d)[–-](\d+\.\d)%\]")


def test_slash_command_parsing():
    p = C.parse("/measure n=200 target=snow_leopard confirm a cat in the snow")
    assert (p.name, p.options, p.flags, p.text) == ("measure", {"n": "200", "target": "snow_leopard"}, {"confirm"},
                                                    "a cat in the snow")
    name, args = C.arguments(p, [], "a photo of a cat", ("cat", "snow leopard"))
    assert name == "measure_rate" and args == {"caption": "a cat in the snow", "confirm": True, "mode": "sample",
                                               "max_n": 200, "target_label": "snow leopard"}
    assert C.arguments(C.parse("/generate"), [], "a photo of a cat")[1] == {"prompt": "a photo of a cat", "n": 100}
    # /screen: what was proposed, or the captions given (separated by semicolons), at an effect, within a cap.
    assert C.arguments(C.parse("/screen"), [], "a photo of a cat") == ("generate_and_classify", {"proposed": True})
    assert C.arguments(C.parse("/screen effect=2x max=500 a cat in fog; a cat at night"), [], "a photo of a cat") == (
        "generate_and_classify", {"prompts": ["a cat in fog", "a cat at night"], "effect": 2.0, "max_images": 500})
    for bad, message in [("/nope", "unknown command"), ("/measure", "usage: /measure"),
                         ("/measure n=lots a cat", "whole number"), ("/generate k=3", "unknown option k="),
                         ("/caption", "nothing measured yet"), ("/edit a cat", "no generated images"),
                         ("/screen effect=big", "effect must be 3, 2 or 1.5")]:
        with pytest.raises(C.CommandError, match=message):
            C.arguments(C.parse(bad), [], "a photo of a cat")


def test_flags_stand_before_or_after_the_text_and_quotes_keep_words_as_text():
    for line in ("/measure a photo of a cat in the snow confirm", "/measure confirm a photo of a cat in the snow",
                 "/measure a photo of a cat in the snow n=300 CONFIRM",
                 "/measure n=300 a photo of a cat in the snow confirm"):
        p = C.parse(line)
        assert (p.text, p.flags) == ("a photo of a cat in the snow", {"confirm"}), line
        args = C.arguments(p, [], "a photo of a cat")[1]
        assert args["caption"] == "a photo of a cat in the snow" and args["confirm"] is True
    p = C.parse("/measure counterfactual a cat's toy in the snow target=snow_leopard confirm")
    assert (p.text, p.flags, p.options) == ("a cat's toy in the snow", {"confirm", "counterfactual"},
                                            {"target": "snow_leopard"})
    # Quoted, the word is text; a quoted option value may hold spaces.
    p = C.parse('/measure "a photo of a cat that will not confirm" target="snow leopard"')
    assert (p.text, p.flags, p.options) == ("a photo of a cat that will not confirm", set(), {"target": "snow leopard"})
    assert C.parse("/measure 'confirm' the cat").text == "confirm the cat"
    # Commands without flags keep the word as text.
    assert C.parse("/generate a photo of a cat, confirm").text == "a photo of a cat, confirm"
    for bad, message in [("/measure a photo of a cat n=abc", r"^/measure: n must be a whole number, got 'abc'$"),
                         ("/measure a cat confirm in the snow", "'confirm' inside the text.*quote the text"),
                         ('/measure "a cat in the snow confirm', 'unclosed "'),
                         ("/measure n=3 a cat n=4", "n= given twice")]:
        with pytest.raises(C.CommandError, match=message):
            C.arguments(C.parse(bad), [], "a photo of a cat")


def test_help_and_usage_lines_print_their_bracketed_options():
    screen = io.StringIO()
    Console(file=screen, width=200, color_system=None).print(help_table(llm=False))
    out = screen.getvalue()
    assert "/measure [n=800] [target=LABEL] [confirm] [counterfactual] CAPTION" in out
    assert "/generate [n=100] [target=LABEL] [PROMPT]" in out and "/caption [MEASUREMENT]" in out
    assert '/measure "a cat that will not confirm"' in out
    # Recorded text (a result no tool reads, the model's words) prints as recorded, brackets and all.
    screen = io.StringIO()
    console = Console(file=screen, width=200, color_system=None)
    console.print(render_event(ToolReturned(call_id="c1", name="old_tool", ok=True,
                                            result={"caption": "a cat [bold] in [n=800] snow"})))
    console.print(render_event(PlannerTurn(reasoning="try [confirm] next", model="m[x]")))
    out = screen.getvalue()
    assert "a cat [bold] in [n=800] snow" in out and "try [confirm] next" in out and "m[x]" in out


def test_chat_history_is_saved_bounded_and_loaded(tmp_path):
    readline = pytest.importorskip("readline")
    path = tmp_path / "state" / "chat_history"
    assert history_path({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "sleuth" / "chat_history"
    assert history_path({"SLEUTH_CHAT_HISTORY": str(path), "XDG_CACHE_HOME": "/x"}) == path
    readline.clear_history()
    try:
        for i in range(5):
            readline.add_history(f"/measure n={i} a cat")
        assert save_history(readline, path, limit=3)
        assert path.read_text().splitlines()[-3:] == ["/measure n=2 a cat", "/measure n=3 a cat", "/measure n=4 a cat"]
        assert path.stat().st_mode & 0o777 == 0o600
        readline.clear_history()
        assert load_history(readline, path, limit=3) == 3
        assert [readline.get_history_item(i) for i in (1, 2, 3)] == ["/measure n=2 a cat", "/measure n=3 a cat",
                                                                      "/measure n=4 a cat"]
        readline.clear_history()
        assert load_history(readline, tmp_path / "missing") == 0
        # Not at a terminal: lines are read plainly and no history file is written.
        plain = tmp_path / "plain_history"
        with line_reader(str.upper, path=plain, interactive=False) as read:
            assert read is str.upper
        assert not plain.exists()
        with line_reader(str.upper, path=plain, interactive=True) as read:
            assert read is input
        assert plain.exists()
    finally:
        readline.clear_history()


class Harness:
    """A chat over the fake backends, typed into from a list, its screen captured."""

    def __init__(self, tmp_path: Path, planner=None, auto=None, **settings) -> None:
        self.session = new_session(fake_backends(), tmp_path / "run", cache=PredictionCache(), command="chat",
                                   **settings)
        self.screen = io.StringIO()
        self.console = Console(file=self.screen, width=160, highlight=False, color_system=None)
        self.writer = TranscriptWriter(self.session.transcript)
        self.chat = Chat(self.session, self.writer, self.console, planner=planner, bars=False,
                         protocol=(lambda: auto(self.session)) if auto is not None else
                         lambda: ProtocolV1Planner("cat", "a realistic photograph of a cat", baseline_n=300,
                                                   max_n=300, explore=False))
        self.chat.start()

    def type(self, *lines: str) -> str:
        feed: Iterator[str] = iter(lines)

        def read(prompt: str) -> str:
            try:
                return next(feed)
            except StopIteration:
                raise EOFError from None

        status = self.chat.loop(read)
        self.chat.finish(status)
        self.writer.close()
        return ANSI.sub("", self.screen.getvalue())


def test_slash_commands_drive_the_tools_and_land_in_the_transcript(tmp_path):
    h = Harness(tmp_path)
    lines = ["/generate n=200", "/caption", f"/measure n=200 target=snow_leopard {SNOW}",
             f"/measure n=200 confirm {SNOW}", "/record t1 t2 cats in snow pass for snow leopards",
             f"/edit k=3 {SNOW}", "/perturb types=background n=1", "/screen", "/findings", "how are you?", "/bogus",
             "/measure",
             "/quit",
             "/generate never reached"]
    screen = h.type(*lines)
    events = read_transcript(h.session.transcript)  # verifies the hash chain
    assert events[0].kind == "run_started" and (events[0].command, events[0].planner) == ("chat", "user")
    assert [e.text for e in events if isinstance(e, UserMessage)] == lines[:-1]
    calls = [e for e in events if isinstance(e, ToolCalled)]
    assert [c.name for c in calls] == ["generate_and_classify", "caption_failures", "measure_rate", "measure_rate",
                                       "record_finding", "edit_image", "perturb_caption", "generate_and_classify"]
    for c in calls:  # each command is a turn of the user, followed by its call and result
        i = events.index(c)
        assert isinstance(events[i - 1], PlannerTurn) and events[i - 1].model == "user"
        after = next(e for e in events[i + 1:] if e.kind != "finding")  # record_finding's finding comes first
        assert isinstance(after, ToolReturned) and after.call_id == c.call_id
    returned = [e for e in events if isinstance(e, ToolReturned)]
    assert all(r.ok for r in returned), [r.error for r in returned if not r.ok]
    finding = next(e for e in events if e.kind == "finding")
    assert finding.finding["caption"] == SNOW and finding.finding["confirmed"]
    assert events[-1].kind == "run_finished" and events[-1].n_findings == 1
    # The screen shows each measured rate with its interval, the findings table, and the hints.
    k, n = (finding.finding["discovery"]["hypothesis"][x] for x in ("k", "n"))
    assert any(m.group(1, 2) == (str(k), str(n)) for m in RATE_WITH_INTERVAL.finditer(screen))
    assert "1 confirmed finding" in screen and "No LLM is configured" in screen and "unknown command /bogus" in screen
    # A usage line keeps its bracketed options (rich would read "[n=800]" as markup and drop it).
    assert "usage: /measure [n=800] [target=LABEL] [confirm] [counterfactual] CAPTION" in screen


def test_record_cites_a_counterfactual_test_when_given_one(tmp_path):
    h = Harness(tmp_path)
    h.type(f"/measure n=200 target=snow_leopard {SNOW}", f"/measure n=200 confirm {SNOW}",
           f"/measure counterfactual n=20 {SNOW}", "/record t1 t2 t3 cats in snow pass for snow leopards",
           "/record t1 t2 t1 not a counterfactual test, so part of the summary")
    calls = [e for e in read_transcript(h.session.transcript) if isinstance(e, ToolCalled)]
    records = [c.arguments for c in calls if c.name == "record_finding"]
    assert records[0]["counterfactual_test"] == "t3" and records[0]["summary"] == "cats in snow pass for snow leopards"
    assert "counterfactual_test" not in records[1] and records[1]["summary"].startswith("t1 not a counterfactual")


def test_auto_hands_over_to_the_protocol_planner_and_the_chat_goes_on(tmp_path):
    h = Harness(tmp_path)
    h.type("/auto", "/generate n=20")
    events = read_transcript(h.session.transcript)
    turns = [e for e in events if isinstance(e, PlannerTurn)]
    assert turns[0].model == "protocol-v1" and turns[-1].model == "user"
    finish = next(e for e in events if isinstance(e, ToolReturned) and e.name == "finish")
    assert finish.ok and events.index(finish) < events.index(turns[-1])  # the chat outlived the planner's finish
    assert any("snow" in f.caption for f in h.session.investigation.findings)
    assert events[-1].kind == "run_finished" and events[-1].status == "completed"


@pytest.mark.parametrize("before", [
    [],  # /auto alone: the protocol planner declares its own sizes for the session's family
    # The user confirms first (declaring 100-image sizes for the whole family) and records a finding.
    [f"/measure n=100 {SNOW}", f"/measure n=100 confirm {SNOW}", "/record t1 t2"],
    # ... and makes refused calls too (sizes not declared; unknown tests).
    [f"/measure n=50 confirm {SNOW}", f"/measure n=60 confirm {SNOW}. it is daytime.", "/record t7 t8", "/mesure"],
])
def test_auto_after_any_user_commands_goes_on_from_them_to_a_clean_end(tmp_path, before):
    h = Harness(tmp_path, auto=lambda s: auto_planner(s), budget=6000)
    screen = h.type(*before, "/auto", "/findings")
    events = read_transcript(h.session.transcript)
    planned = {e.call_id for t in events if isinstance(t, PlannerTurn) and t.model == "protocol"
               for e in events if isinstance(e, ToolCalled) and any(c.id == e.call_id for c in t.tool_calls)}
    refused = [e.error for e in events if isinstance(e, ToolReturned) and e.call_id in planned and not e.ok]
    # The planner's confirmations use the declared sizes: none is refused for its sizes or its family.
    assert not [r for r in refused if "declared" in r or "share out" in r or "forks" in r], refused
    confirmed = [e for e in events if isinstance(e, ToolReturned) and e.call_id in planned and e.ok
                 and e.name == "measure_rate" and e.result.get("purpose") == "confirmation"]
    assert confirmed and h.session.investigation.findings
    assert "did not replicate" not in " ".join(t.reasoning for t in events if isinstance(t, PlannerTurn)
                                               for r in refused if r in t.reasoning)
    finish = [e for e in events if isinstance(e, ToolReturned) and e.name == "finish"]
    assert all(f.ok for f in finish), [f.error for f in finish]
    assert events[-1].kind == "run_finished" and events[-1].status == "completed"
    assert "Traceback" not in screen and "error in planner" not in screen
    if "/record t1 t2" in before:  # the user's finding is named in the planner's summary
        assert "Recorded before this procedure: f1" in finish[-1].result["summary"] if finish else True
    if "/mesure" in before:
        assert "unknown command /mesure; did you mean /measure?" in screen


def test_a_refused_confirmation_is_not_reported_as_a_failed_replication(tmp_path, monkeypatch):
    from sleuth.tools.investigation import Investigation
    from sleuth.tools.registry import ToolError

    def closed(self):
        raise ToolError("no confirmation here")

    monkeypatch.setattr(Investigation, "confirmation_alpha", closed)
    h = Harness(tmp_path, auto=lambda s: auto_planner(s), budget=3000)
    h.type("/auto")
    events = read_transcript(h.session.transcript)
    turns = [t.reasoning for t in events if isinstance(t, PlannerTurn) and t.model == "protocol"]
    refused = [t for t in turns if "no confirmation here" in t]
    assert refused and all("was refused" in t and "did not replicate" not in t for t in refused)
    assert events[-1].kind == "run_finished" and events[-1].status == "completed"


def _stub_planner(stub: StubServer, session: Session) -> LLMPlanner:
    client = LLMClient(LLMConfig(model="openai/stub-model", api_base=stub.api_base, api_key_env="K"),
                       environ={"K": "stub-key-000000"})
    return LLMPlanner(client, registry(), label="cat", class_prompt="a realistic photograph of a cat",
                      labels=session.backends.classifier.labels.labels, mode="chat", artifacts=session.artifacts)


def _answer_with_evidence(body: dict) -> dict:
    """The stub's second reply: an answer built from the measure_rate result the planner fed back."""
    tool = next(m for m in reversed(body["messages"]) if m["role"] == "tool")
    r = json.loads(re.search(r">\n(.*)\n</tool_result>", tool["content"], re.S).group(1))
    f, b = r["hypothesis"]["failures"], r["baseline"]
    return text_reply(f"Cats in snow fail {f['k']}/{f['n']} [{100 * f['low']:.1f}–{100 * f['high']:.1f}%] against "
                      f"{b['k']}/{b['n']} for plain cats (adjusted p = {r['adjusted_p']:.2g}): {r['verdict']}.")


@pytest.mark.e2e  # a whole run or a simulation: over the fast tier's 5 seconds
def test_words_go_to_the_llm_which_sees_the_users_commands(tmp_path):
    script = [tool_reply(tool_call("measure_rate", {"caption": SNOW, "target_label": "snow leopard",
                                                    "max_n": 200}, "m1"), content="I measure it."),
              _answer_with_evidence,
              text_reply("The grass baseline is low.")]
    with StubServer(script) as stub:
        h = Harness(tmp_path, planner=None)
        h.chat.planner = _stub_planner(stub, h.session)
        screen = h.type("do cats in snow fail?", "/generate n=30 a realistic photograph of a cat in the grass",
                        "and in grass?")
    assert "Cats in snow fail" in screen and RATE_WITH_INTERVAL.search(screen.split("Cats in snow fail")[1])
    events = read_transcript(h.session.transcript)
    own = [e for e in events if isinstance(e, PlannerTurn) and e.model == "openai/stub-model"]
    assert [bool(t.tool_calls) for t in own] == [True, False, False] and own[1].final.startswith("Cats in snow")
    last = stub.requests[2].body["messages"]
    assert last[-1] == {"role": "user", "content": "and in grass?"}
    assert last[-2]["role"] == "user" and last[-2]["content"].startswith("The user ran:")  # the /generate
    assert "conversation with a user" in stub.requests[0].body["messages"][0]["content"]


# -- a person at a terminal ------------------------------------------------------------------------------------


def _spawn(tmp_path: Path, *args: str, env: dict | None = None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "SLEUTH_NO_CACHE": "1",
           "COLUMNS": "160", "SLEUTH_CHAT_HISTORY": str(tmp_path / "chat_history"), **(env or {})}
    log = io.StringIO()
    child = pexpect.spawn(sys.executable, ["-m", "sleuth", "chat", "--class", "cat", "--runs", str(tmp_path), *args],
                          cwd=str(tmp_path), env=env, encoding="utf-8", dimensions=(50, 160), timeout=120)
    child.logfile_read = log
    return child, log


@pytest.mark.e2e
def test_typing_into_chat_without_an_llm(tmp_path):
    child, log = _spawn(tmp_path, "--seed", "5")
    child.expect_exact(PROMPT)
    child.sendline("/measure n=100 target=snow_leopard a realistic photograph of a cat in the snow")
    child.expect_exact(PROMPT)  # the prompt comes back once the command is done
    screen = ANSI.sub("", log.getvalue())
    rates = RATE_WITH_INTERVAL.findall(screen)
    assert rates, screen[-2000:]
    k, n, low, high = rates[0]
    assert int(n) == 100 and float(low) < 100 * int(k) / int(n) < float(high)
    # Ctrl-C during a long generation stops the tool, not the session.
    child.sendline("/generate n=5000")
    child.expect("generat")
    time.sleep(1.5)
    child.sendintr()
    child.expect_exact(STOPPED)
    child.expect_exact(PROMPT)
    said = ANSI.sub("", log.getvalue())
    assert said[said.rindex("/generate n=5000"):].count(STOPPED) == 1  # Ctrl-C is reported once
    child.sendline("/findings")
    child.expect("no confirmed finding")
    child.expect_exact(PROMPT)
    child.send("\x1b[A\r")  # Up brings back the last line (not "^[[A"), Enter runs it again
    child.expect("no confirmed finding")
    child.expect_exact(PROMPT)
    child.sendline("/quit")
    child.expect("Replay it with: sleuth replay")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    transcript = next(tmp_path.glob("*/transcript.jsonl"))
    events = read_transcript(transcript)
    stopped = [e for e in events if isinstance(e, ToolReturned) and e.error == STOPPED]
    assert len(stopped) == 1 and stopped[0].name == "generate_and_classify"
    assert events[-1].kind == "run_finished" and events[-1].status == "completed"
    # At a terminal, lines go through readline and into the history file, for Up to bring back next time.
    history = (tmp_path / "chat_history").read_text().splitlines()
    assert history[-4:] == ["/measure n=100 target=snow_leopard a realistic photograph of a cat in the snow",
                            "/generate n=5000", "/findings", "/quit"]  # a repeated line is kept once
    assert [e.text for e in events if isinstance(e, UserMessage)][-3:] == ["/findings", "/findings", "/quit"]


@pytest.mark.e2e
def test_typing_into_chat_with_the_stub_llm_then_replaying_it(tmp_path, capsys):
    script = [tool_reply(tool_call("measure_rate", {"caption": SNOW, "target_label": "snow leopard",
                                                    "max_n": 100}, "m1"), content="Let me measure that."),
              _answer_with_evidence]
    with StubServer(script) as stub:
        child, log = _spawn(tmp_path, "--llm", "openai/stub-model", "--api-base", stub.api_base,
                            "--api-key-env", "SLEUTH_STUB_KEY", "--seed", "6",
                            env={"SLEUTH_STUB_KEY": "stub-key-123456789"})
        child.expect_exact(PROMPT)
        child.sendline("Do cats in the snow fool the classifier?")
        child.expect("Cats in snow fail")
        child.expect_exact(PROMPT)
        child.sendline("/quit")
        child.expect(pexpect.EOF)
        child.close()
    assert child.exitstatus == 0 and len(stub.requests) == 2
    assert stub.requests[0].headers["Authorization"] == "Bearer stub-key-123456789"
    screen = ANSI.sub("", log.getvalue())
    answer = screen.split("Cats in snow fail")[1]
    assert RATE_WITH_INTERVAL.search(answer), answer[:300]
    transcript = next(tmp_path.glob("*/transcript.jsonl"))
    assert "stub-key-123456789" not in transcript.read_text()
    # The chat replays like any other run: the user's words, the tool call, the answer.
    assert main(["replay", str(transcript), "--width", "160"]) == 0
    out = capsys.readouterr().out
    assert "› Do cats in the snow fool the classifier?" in out and "measure_rate" in out
    assert "Cats in snow fail" in out and "hash chain verified" in out
