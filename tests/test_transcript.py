"""Transcripts: round trip, hash chain, tampering, torn lines and resume, redaction; the artifact store."""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pytest
from PIL import Image

from sleuth.agent.events import ErrorEvent, PlannerTurn, RunStarted, ToolCall, ToolReturned, UserMessage, event_hash
from sleuth.agent.redact import REDACTED, clear_secrets, is_secret_key, redact, register_secret
from sleuth.agent.transcript import TranscriptError, TranscriptWriter, read_transcript, verify_transcript
from sleuth.tools.artifacts import ArtifactStore


def lines_of(path):
    return path.read_bytes().split(b"\n")[:-1]


# -- round trip and chain --------------------------------------------------------------------------------


def test_round_trip_keeps_every_event_and_fills_the_envelope(tmp_path, sample_events):
    path = tmp_path / "transcript.jsonl"
    events = sample_events * 3  # several events of every kind
    with TranscriptWriter(path) as w:
        out = [w.append(e) for e in events]
        assert w.events == out
    back = read_transcript(path)
    assert back == out
    assert [e.seq for e in back] == list(range(27))
    assert back[0].prev_hash == ""
    for prev, e in zip(back, back[1:], strict=False):
        assert e.prev_hash == prev.hash
    for original, e in zip(events, back, strict=True):
        assert e.ts.endswith("Z") and e.ts[:4].isdigit()
        assert e.model_dump(exclude={"seq", "ts", "prev_hash", "hash"}) == original.model_dump(
            exclude={"seq", "ts", "prev_hash", "hash"})
        assert e.hash == event_hash(e.model_dump(mode="json"))
    # One JSON object per line, newline-terminated.
    raw = path.read_bytes()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 27
    assert verify_transcript(path).model_dump() == {"ok": True, "n_events": 27, "first_bad_line": None,
                                                    "reason": None}


def test_writer_refuses_to_overwrite(written):
    path, _ = written
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="already holds a transcript"):
        TranscriptWriter(path)
    assert path.read_bytes() == before


def test_subscribers_see_each_event_after_it_is_on_disk(tmp_path):
    path = tmp_path / "t.jsonl"
    seen = []

    def on_event(e):
        seen.append((e.seq, len(lines_of(path))))

    with TranscriptWriter(path) as w:
        w.subscribe(on_event)
        w.append(UserMessage(text="a"))
        w.append(UserMessage(text="b"))
        w.unsubscribe(on_event)
        w.append(UserMessage(text="c"))
    assert seen == [(0, 1), (1, 2)]


# -- tampering ---------------------------------------------------------------------------------------------


def test_one_changed_digit_names_its_line(written):
    path, _ = written
    lines = lines_of(path)
    middle = len(lines) // 2  # 0-based index 4, line 5
    assert b'"k":37' in lines[middle]
    lines[middle] = lines[middle].replace(b'"k":37', b'"k":38')
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TranscriptError) as err:
        read_transcript(path)
    assert err.value.line == middle + 1 == 5
    assert "hash mismatch" in err.value.reason
    report = verify_transcript(path)
    assert (report.ok, report.first_bad_line, report.n_events) == (False, 5, 4)
    # Without verification the changed value is read as written.
    assert read_transcript(path, verify=False)[middle].result["k"] == 38


def test_a_deleted_line_is_named(written):
    path, _ = written
    lines = lines_of(path)
    del lines[6]
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TranscriptError) as err:
        read_transcript(path)
    assert err.value.line == 7
    assert "seq is 7, expected 6" in err.value.reason


def test_a_rehashed_line_still_breaks_the_chain(written):
    path, _ = written
    lines = lines_of(path)
    obj = json.loads(lines[3])
    obj["arguments"]["n"] = 5000
    obj["hash"] = event_hash(obj)  # a forger who recomputes this line's own hash
    lines[3] = json.dumps(obj).encode()
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TranscriptError) as err:
        read_transcript(path)
    assert err.value.line == 5 and "prev_hash" in err.value.reason


def test_invalid_json_and_schema_errors_are_named(written):
    path, _ = written
    lines = lines_of(path)
    path.write_bytes(b"\n".join([*lines[:2], b"{not json", *lines[3:]]) + b"\n")
    with pytest.raises(TranscriptError, match="line 3: invalid JSON"):
        read_transcript(path)
    bad = json.loads(lines[2])
    bad["kind"] = "nonsense"
    bad["hash"] = event_hash(bad)
    path.write_bytes(b"\n".join([*lines[:2], json.dumps(bad).encode(), *lines[3:]]) + b"\n")
    with pytest.raises(TranscriptError, match="line 3: schema"):
        read_transcript(path, verify=False)


# -- torn lines and resume -----------------------------------------------------------------------------------


def test_torn_final_line_is_detected_and_resume_moves_it_aside(written):
    path, out = written
    torn = b'{"kind":"user_message","prev_hash":"ab'
    with open(path, "ab") as f:
        f.write(torn)
    with pytest.raises(TranscriptError) as err:
        read_transcript(path)
    assert err.value.line == 10 and "torn final line" in err.value.reason
    assert verify_transcript(path).n_events == 9

    with TranscriptWriter(path, resume=True) as w:
        assert w.torn_path == path.parent / "transcript.jsonl.torn-1"
        assert w.torn_path.read_bytes() == torn
        assert len(w.events) == 9
        e = w.append(UserMessage(text="resumed"))
    assert e.seq == 9 and e.prev_hash == out[-1].hash
    back = read_transcript(path)
    assert [x.seq for x in back] == list(range(10)) and back[-1].text == "resumed"

    # A second crash gets its own file; the first is never overwritten.
    with open(path, "ab") as f:
        f.write(b"{")
    with TranscriptWriter(path, resume=True) as w:
        assert w.torn_path.name == "transcript.jsonl.torn-2"
    assert (path.parent / "transcript.jsonl.torn-1").read_bytes() == torn
    assert len(read_transcript(path)) == 10


def test_resume_keeps_a_whole_last_event_missing_only_its_newline(written):
    path, _ = written
    path.write_bytes(path.read_bytes()[:-1])
    assert len(read_transcript(path)) == 9
    with TranscriptWriter(path, resume=True) as w:
        assert w.torn_path is None
        w.append(UserMessage(text="next"))
    assert [e.seq for e in read_transcript(path)] == list(range(10))


def test_resume_refuses_a_transcript_broken_before_its_end(written):
    path, _ = written
    data = path.read_bytes().replace(b'"k":37', b'"k":36')
    path.write_bytes(data)
    with pytest.raises(TranscriptError) as err:
        TranscriptWriter(path, resume=True)
    assert err.value.line == 5
    assert path.read_bytes() == data


# -- redaction ------------------------------------------------------------------------------------------------

KEY = "sk-proj-" + "Zq8x" * 10
RUNTIME_KEY = "my-local-server-secret-4711"


def test_api_keys_never_reach_the_file(tmp_path):
    path = tmp_path / "t.jsonl"
    register_secret(RUNTIME_KEY)
    try:
        with TranscriptWriter(path) as w:
            w.append(RunStarted(run_id="r", command="chat", planner="llm",
                                config={"model": "gpt-x", "api_key": KEY, "top_k": 3,
                                        "llm": {"endpoint": {"headers": {"Authorization": f"Bearer {KEY}"}}},
                                        "server": {"password": RUNTIME_KEY}}))
            w.append(PlannerTurn(reasoning=f"my key is {RUNTIME_KEY}, do not tell",
                                 tool_calls=[ToolCall(id="1", name="x", arguments={"apiKey": KEY, "n": 2})],
                                 usage={"prompt_tokens": 11, "completion_tokens": 7}))
            w.append(ToolReturned(call_id="1", name="x", ok=False, error=f"401: invalid key {KEY} for gpt-x"))
            w.append(ErrorEvent(message=f"AuthenticationError: Incorrect API key provided: {KEY}. See docs",
                                where="planner llm", traceback=f'  File "x.py"\nheaders={{"Authorization": '
                                                               f'"Bearer {KEY}"}}'))
    finally:
        clear_secrets()
    raw = path.read_bytes()
    assert KEY.encode() not in raw and KEY[:20].encode() not in raw
    assert RUNTIME_KEY.encode() not in raw
    assert raw.count(REDACTED.encode()) >= 7
    events = read_transcript(path)
    assert events[0].config["top_k"] == 3 and events[0].config["model"] == "gpt-x"
    assert events[1].usage.prompt_tokens == 11 and events[1].tool_calls[0].arguments["n"] == 2
    assert events[2].error == "401: invalid key [redacted] for gpt-x"
    assert events[3].message.endswith("[redacted]. See docs")


@pytest.mark.parametrize("key", ["api_key", "API_KEY", "apikey", "apiKey", "x-api-key", "openai_key", "token",
                                 "hf_token", "accessToken", "secret", "client_secret", "password", "db_password",
                                 "Authorization", "auth", "proxy_auth", "credentials", "aws_credential_file",
                                 "bearer"])
def test_secret_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["top_k", "n_tokens", "prompt_tokens", "completion_tokens", "max_tokens",
                                 "key_attribute", "key", "keys", "token_count", "author", "oauth_flow", "monkey",
                                 "hash", "prev_hash", "caption", "tokenizer"])
def test_ordinary_keys(key):
    assert not is_secret_key(key)


def test_string_masking_keeps_ordinary_text():
    text = ("keys AKIAIOSFODNN7EXAMPLE ghp_" + "a1" * 18 + " hf_" + "B2" * 12 + " xai-" + "c3" * 12 +
            " Bearer abc123def456; refs " + "ab" * 32 + " task-" + "x" * 30 + " the bearer of bad news;"
            " api_key=plain99value password: 'hunter22' n_tokens: 123456")
    out = redact({"note": text, "ok": None, "api_key": None, "token": ""})
    assert out["note"] == ("keys [redacted] [redacted] [redacted] [redacted] Bearer [redacted]; refs " + "ab" * 32 +
                           " task-" + "x" * 30 + " the bearer of bad news; api_key=[redacted] "
                           "password: '[redacted]' n_tokens: 123456")
    assert out["api_key"] is None and out["token"] == ""


# -- artifact store --------------------------------------------------------------------------------------------


def image(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(16, 24, 3), dtype=np.uint8)


def test_images_are_content_addressed_pngs(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")
    img = image()
    ref = store.put_image(img)
    path = store.path(ref)
    assert path == tmp_path / "artifacts" / ref[:2] / f"{ref}.png"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == ref
    assert Image.open(io.BytesIO(path.read_bytes())).format == "PNG"
    np.testing.assert_array_equal(store.get_image(ref), img)
    # Idempotent and deterministic: a second store gives the same bytes and ref; no temporary files remain.
    assert store.put_image(img.copy()) == ref
    other = ArtifactStore(tmp_path / "other")
    assert other.put_image(img) == ref and other.path(ref).read_bytes() == path.read_bytes()
    assert [p.name for p in (tmp_path / "artifacts").rglob("*") if p.is_file()] == [f"{ref}.png"]
    assert store.put_image(image(1)) != ref


def test_blobs_and_unknown_refs(tmp_path):
    store = ArtifactStore(tmp_path)
    ref = store.put_bytes(b'{"a": 1}', ext="json")
    assert ref == hashlib.sha256(b'{"a": 1}').hexdigest()
    assert store.path(ref).name == f"{ref}.json" and store.get_bytes(ref) == b'{"a": 1}'
    assert store.exists(ref) and not store.exists("0" * 64) and not store.exists("mem:3")
    with pytest.raises(KeyError, match="no artifact"):
        store.get_image("0" * 64)
    with pytest.raises(KeyError, match="not an artifact ref"):
        store.get_bytes("../etc/passwd")
    with pytest.raises(ValueError, match="uint8 RGB"):
        store.put_image(np.zeros((4, 4), dtype=np.uint8))
    with pytest.raises(ValueError, match="uint8 RGB"):
        store.put_image(np.zeros((4, 4, 3), dtype=np.float32))


def test_non_finite_numbers_are_written_as_strict_json_strings(tmp_path):
    import json

    from sleuth.agent.events import ToolReturned
    from sleuth.agent.transcript import TranscriptWriter, read_transcript
    from sleuth.tools import stats

    ratio = stats.rate_ratio(5, 100, 0, 1000)  # no baseline failures: an infinite ratio with a finite lower bound
    path = tmp_path / "t.jsonl"
    with TranscriptWriter(path) as w:
        w.append(ToolReturned(call_id="c", name="measure_rate", ok=True, duration_s=0.1,
                              result={"rate_ratio": ratio.model_dump(mode="json"), "p": float("nan")}))
    line = path.read_text().splitlines()[0]
    json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))  # strict JSON
    (event,) = read_transcript(path)
    assert event.result["rate_ratio"]["ratio"] == "Infinity" and event.result["p"] == "NaN"
    assert stats.RatioCI.model_validate(event.result["rate_ratio"]).ratio == float("inf")
