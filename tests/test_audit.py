"""`sleuth audit`: classes under budgets, summaries, config errors, and resuming after SIGKILL at chosen points."""

from __future__ import annotations

import html
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sleuth.agent.audit import Audit, resolve_classes, start
from sleuth.agent.audit.config import load_config, parse_config
from sleuth.agent.audit.summary import findings_table
from sleuth.agent.cli import UsageError, main
from sleuth.agent.transcript import read_transcript, verify_transcript
from tests.compare import assert_equivalent_runs
from tests.fakeworld import fake_backends, forget_seed_claims

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "transcripts" / "audit-fly-cat.yaml"
CLASS_FIELDS = ("class", "status", "answer", "stopped_by", "images", "image_budget", "events", "turns",
                "hypotheses_tested", "findings", "unconfirmed", "hypotheses")
VOLATILE = {"ts", "hash", "prev_hash", "duration_s"}


def fake_audit(run_dir: Path, **settings) -> Audit:
    config = parse_config({"classes": ["cat", "dog", "snow leopard"], **settings})
    start(run_dir, config, resolve_classes(config, fake_backends()))
    return Audit(run_dir, fake_backends())


def comparable(summary: dict) -> list[dict]:
    return [{k: c[k] for k in CLASS_FIELDS} for c in summary["classes"]]


def test_audit_runs_each_class_under_the_budgets_and_ranks_findings(tmp_path):
    # The earlier protocol planner spends its whole budget, so the totals bind in a known order.
    audit = fake_audit(tmp_path / "a", budget={"per_class": {"images": 20_000}, "total": {"images": 9000}},
                       planner="protocol-v1")
    out = audit.run()
    cat, dog, leopard = out["classes"]
    # The audit's total caps the first class, the second gets what is left, the third nothing.
    assert (cat["image_budget"], cat["status"]) == (9000, "completed") and 0 < cat["images"] <= 9000
    assert dog["image_budget"] == 9000 - cat["images"] and dog["images"] <= dog["image_budget"]
    assert leopard["status"] == "skipped" and "image budget (9000) is spent" in leopard["stopped_by"]
    assert out["images"] == cat["images"] + dog["images"] <= 9000 and out["status"] == "budget"
    # Confirmed findings by effect size, then the supported but unconfirmed hypotheses; every row carries k/n,
    # intervals, the ratio and adjusted p, in the same shape as `investigate --json`.
    assert out["findings"] and all(f["confirmed"] for f in out["findings"])
    # Control across classes: Bonferroni over the three declared classes' confirmation families (family-wise).
    assert [f["audit_p"] for f in out["findings"]] == pytest.approx(
        [min(1.0, 3 * f["confirmation"]["adjusted_p"]) for f in out["findings"]])
    assert all(f["audit_significant"] == (f["audit_p"] <= 0.05) for f in out["findings"])
    control = out["audit_control"]
    assert (control["error"], control["level"]) == ("family-wise", 0.05)
    assert control["family"] == (f"{cat['confirmations_declared'] + dog['confirmations_declared']} declared "
                                 "confirmation attempts of the audit's 3 classes")
    lows = [f["confirmation"]["at_least"] for f in out["findings"]]
    assert all(b >= 1 for b in lows) and lows == sorted(lows, reverse=True)  # ranked by the headline bound
    top = out["findings"][0]
    assert top["caption"] == "a realistic photograph of a cat. it is in the snow."
    d = top["discovery"]
    assert d["adjusted_p"] < 0.05 and d["rate_ratio_ci"][0] > 1 and d["hypothesis"]["n"] > 0
    ratios = [f["discovery"]["rate_ratio"] for f in out["findings"]]
    assert ratios == sorted(ratios, reverse=True)
    unconfirmed = [h["rate_ratio"] for h in out["unconfirmed"]]
    assert unconfirmed == sorted(unconfirmed, reverse=True)
    # One transcript per class, each valid; the summary on disk is what was returned.
    assert json.loads((tmp_path / "a" / "summary.json").read_text()) == out
    for c in (cat, dog):
        events = read_transcript(tmp_path / "a" / c["transcript"])
        assert len(events) == c["events"] and events[0].command == "audit" and events[-1].kind == "run_finished"
        assert events[0].config["budget"] == c["image_budget"]
    assert not (tmp_path / "a" / "snow-leopard" / "transcript.jsonl").exists()
    from rich.console import Console

    console = Console(width=200, record=True, file=open(os.devnull, "w"))
    console.print(findings_table(out))
    text = console.export_text()
    assert "1 confirmed" in text and "it is in the snow." in text and "[" in text
    assert "audit p" in text and "family-wise error 0.05 per class" in text
    # The report of the audit directory states what holds across its classes, and each finding's audit p.
    from sleuth.agent.report import build_report

    page = build_report(tmp_path / "a")
    assert "Across the audit's classes" in page and "family-wise error at 0.05" in page
    assert html.escape(control["family"]) in page and pv_html(out["findings"][0]["audit_p"]) in page


def pv_html(p: float) -> str:
    from sleuth.agent.report.html import fmt_p

    return fmt_p(p)


def test_resuming_a_finished_audit_changes_nothing_and_a_lost_summary_is_rebuilt(tmp_path):
    run = tmp_path / "a"
    first = fake_audit(run, budget={"per_class": {"images": 6000}}).run()
    cat_bytes = (run / "cat" / "transcript.jsonl").read_bytes()
    assert comparable(Audit(run, fake_backends()).run()) == comparable(first)
    # Killed after a class's transcript ended but before its summary was written: the state is rebuilt.
    (run / "cat" / "summary.json").unlink()
    (run / "summary.json").unlink()
    again = Audit(run, fake_backends()).run()
    assert comparable(again) == comparable(first)
    assert (run / "cat" / "transcript.jsonl").read_bytes() == cat_bytes


def test_wall_time_budget_ends_each_class_cleanly(tmp_path):
    out = fake_audit(tmp_path / "a", budget={"per_class": {"images": 5000, "seconds": 1e-6}}).run()
    for c in out["classes"]:
        assert c["status"] == "completed" and "wall-time budget is spent" in c["stopped_by"]
        events = read_transcript(tmp_path / "a" / c["transcript"])
        assert [e.kind for e in events] == ["run_started", "planner_turn", "tool_called", "tool_returned",
                                            "run_finished"]
        assert events[1].model == "budget" and verify_transcript(tmp_path / "a" / c["transcript"]).ok


@pytest.mark.parametrize("settings, message", [
    ({"classes": []}, "classes: name at least one class"),
    ({"classes": ["cat", "cat"]}, "classes listed twice: cat"),
    ({"classes": ["cat"], "budgets": {}}, "budgets: unknown setting"),
    ({"classes": ["cat"], "budget": {"per_class": {"images": 0}}}, "budget.per_class.images: Input should be greater"),
    ({"classes": ["cat"], "alpha": 0.7}, "alpha: Input should be less than 0.5"),
    ({"classes": ["cat"], "backends": {"classifier": "nope:x"}}, "unknown classifier kind 'nope'"),
    ({"classes": ["cat"], "backends": {"wrld": "default"}}, "backends.wrld: unknown setting"),
    ({"classes": ["cat"], "planner": "oracle"},
     "planner.name: unknown planner 'oracle' (known: protocol, protocol-v2, protocol-v1, wiles"),
    ({"classes": ["cat"], "planner": {"llm": "m", "llm_retry": 2}}, "did you mean 'llm_retries'"),
])
def test_bad_configs_are_one_line_errors(settings, message):
    with pytest.raises(UsageError) as err:
        parse_config(settings, "audit.yaml")
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_config_files_and_class_names(tmp_path):
    toml = tmp_path / "a.toml"
    toml.write_text('classes = ["cat"]\nseed = 3\n[planner]\nname = "protocol"\nbaseline_n = 200\n'
                    '[budget.per_class]\nimages = 3000\n[budget.total]\nseconds = 60\n')
    c = load_config(toml)
    assert (c.seed, c.planner.baseline_n, c.per_class_images, c.budget.total.seconds) == (3, 200, 3000, 60)
    assert load_config(EXAMPLE).classes == ["fly", "cat"]
    bad = tmp_path / "b.yaml"
    bad.write_text("classes: [cat\n")
    with pytest.raises(UsageError, match="is not valid YAML"):
        load_config(bad)
    with pytest.raises(UsageError, match="unknown class 'kat'. Did you mean: cat"):
        resolve_classes(parse_config({"classes": ["kat"]}), fake_backends())
    assert resolve_classes(parse_config({"classes": "all"}), fake_backends()) == ["cat", "snow leopard", "dog"]


def test_cli_usage_errors(tmp_path, capsys):
    assert main(["audit"]) == 2
    assert "give a CONFIG" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["audit", "--resume", str(tmp_path / "empty")]) == 2
    assert "holds no audit (no audit.json)" in capsys.readouterr().err
    cfg = tmp_path / "c.yaml"
    cfg.write_text("classes: [flye]\n")
    assert main(["audit", str(cfg), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert "Did you mean: fly" in err and len(err.splitlines()) == 1 and not (tmp_path / "x").exists()


# -- SIGKILL at chosen points, then --resume ------------------------------------------------------------------


def sleuth(*args: str, crash: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("SLEUTH_CRASH_AT", None)
    if crash:
        env["SLEUTH_CRASH_AT"] = crash
    return subprocess.run([sys.executable, "-m", "tests.crash", "audit", *args, "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def crash_and_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str], points: list[str]) -> None:
    """An uninterrupted audit, then the same audit killed at each point in turn (each run resuming the last), then
    resumed to its end: same summaries, same events."""
    reference = tmp_path / "ref" / "audit"
    assert main(["audit", str(EXAMPLE), "--out", str(reference), "--json"]) == 0
    capsys.readouterr()
    expected = json.loads((reference / "summary.json").read_text())
    forget_seed_claims()  # the crashed audit is a first audit of its seeds too, as on another machine
    run = tmp_path / "crashed" / "audit"
    for i, point in enumerate(points):
        args = [str(EXAMPLE), "--out", str(run)] if i == 0 else ["--resume", str(run)]
        proc = sleuth(*args, crash=point)
        assert proc.returncode == -signal.SIGKILL, (point, proc.stderr[-2000:])
    assert main(["audit", "--resume", str(run), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert comparable(got) == comparable(expected)
    assert got["findings"] == expected["findings"]
    for c in expected["classes"]:
        # Event for event the same transcript (timestamps and hashes aside; the crashed runs used one thread, so
        # floats summed in another order may differ in their last digits), and a valid chain.
        assert_equivalent_runs(read_transcript(run / c["transcript"]), read_transcript(reference / c["transcript"]))
        assert verify_transcript(run / c["transcript"]).ok


@pytest.mark.e2e
def test_sigkill_at_several_points_then_resume_equals_an_uninterrupted_audit(tmp_path, capsys):
    points = [
        "torn:tool_returned:5",  # mid-event: half of fly's fifth tool result reaches the file
        "after:tool_called:9",  # mid-call: a call started, its result never written
        "torn:run_started:1",  # cat's very first line torn (fly ended in the previous run)
    ]
    crash_and_resume(tmp_path, capsys, points)
    run = tmp_path / "crashed" / "audit"
    summary = json.loads((run / "summary.json").read_text())
    fly, cat = summary["classes"]
    # The torn lines are kept beside the transcripts and listed in the summary, never silently dropped.
    assert [t["file"] for t in fly["recovery"]["torn_lines"]] == ["transcript.jsonl.torn-1"]
    assert (run / "fly" / "transcript.jsonl.torn-1").read_bytes().startswith(b'{"kind":"tool_returned"')
    assert (run / "cat" / "transcript.jsonl.torn-1").read_bytes().startswith(b'{"kind":"run_started"')
    assert cat["recovery"]["torn_lines"][0]["bytes"] > 0


@pytest.mark.slow
def test_sigkill_at_many_more_points(tmp_path, capsys):
    crash_and_resume(tmp_path, capsys, ["after:any:3", "torn:planner_turn:2", "after:any:40",
                                        "unsynced:tool_returned:7", "torn:tool_called:3", "after:run_finished:1",
                                        "after:any:25", "torn:any:10", "unsynced:run_finished:1"])


# -- an LLM-planned audit: resumed without asking the model again for recorded turns, replayed without a key ------


@pytest.mark.e2e
def test_llm_audit_resumes_without_re_asking_and_replays_without_a_key(tmp_path, monkeypatch):
    from tests.llm_stub import HttpError, StubServer, text_reply, tool_call, tool_reply

    cat = "a realistic photograph of a cat"
    edits = {"edits": [{"type": "background", "edit": "+ snow", "caption": f"{cat}. it is in the snow."}]}
    script = [tool_reply(tool_call("generate_and_classify", {"prompt": cat, "n": 100}, "c1"), content="Baseline."),
              tool_reply(tool_call("perturb_caption", {"caption": cat, "types": ["background"]}, "c2")),
              text_reply(json.dumps(edits)),  # perturb_caption asks the model for the edits
              tool_reply(tool_call("measure_rate", {"caption": f"{cat}. it is in the snow.", "max_n": 100}, "c3")),
              HttpError(500, "down"),  # the model fails: the first run ends in an error, undone by the cut below
              tool_reply(tool_call("finish", {"summary": "snow hurts"}, "c4"))]
    monkeypatch.setenv("SLEUTH_STUB_API_KEY", "sk-stub")
    run = tmp_path / "a"
    with StubServer(script) as stub:
        config = parse_config({"classes": ["cat"], "planner": {"llm": "openai/stub-model", "api_base": stub.api_base,
                                                              "api_key_env": "SLEUTH_STUB_API_KEY", "llm_retries": 0},
                               "budget": {"per_class": {"images": 3000}}})
        start(run, config, ["cat"])
        assert Audit(run, fake_backends()).run()["classes"][0]["status"] == "error"
        path = run / "cat" / "transcript.jsonl"
        lines = path.read_bytes().split(b"\n")
        keep = next(i for i, raw in enumerate(lines) if b'"call_id":"c3"' in raw and b"tool_returned" in raw) + 1
        path.write_bytes(b"\n".join(lines[:keep]) + b"\n")  # as if killed right after the measurement returned
        for f in (run / "cat" / "summary.json", run / "summary.json"):
            f.unlink()
        asked = len(stub.requests)
        out = Audit(run, fake_backends()).run()
        assert len(stub.requests) == asked + 1  # only the new turn was asked for, no recorded one again
    (cat_summary,) = out["classes"]
    assert cat_summary["status"] == "completed" and cat_summary["answer"] == "snow hurts\n\nNo finding was recorded."
    events = read_transcript(path)
    assert len(events) == keep + 4 and events[keep].kind == "planner_turn" and events[-1].kind == "run_finished"
    # Replaying needs no key and no model: LLM perturbations keep their recorded result, the rest re-runs.
    monkeypatch.delenv("SLEUTH_STUB_API_KEY")
    from sleuth.agent.replay.rebuild import verify_run

    report = verify_run(path, backends=fake_backends())
    assert report.ok and report.calls == 3 and [s.tool for s in report.skipped] == ["perturb_caption"]
