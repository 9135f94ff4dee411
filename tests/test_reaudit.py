"""A re-audit with the same seed confirms on fresh images, and says so.

The same seed draws the same discovery images, so a second run of a class repeats the first one's screens. Were its
confirmations drawn on the same seeds too, it would repeat the first run's findings, false ones included, and a second
audit of just the classes that confirmed something would face a smaller audit family for the same evidence. Each
fresh run therefore claims a confirmation draw (a block of confirmation seeds) in the ledger beside the prediction
cache: the first run of a seed gets draw 0, a later one the first draw no run claimed. Forks, resumes and replays keep
the draw their transcript recorded.
"""

from __future__ import annotations

import numpy as np
import pytest

from sleuth.agent.audit.summary import audit_family
from sleuth.agent.config import RunConfig
from sleuth.agent.replay.rebuild import session_for
from sleuth.agent.transcript import TranscriptWriter
from sleuth.tools import investigation_tools, stats
from sleuth.tools.cache import PredictionCache
from sleuth.tools.context import ToolContext
from sleuth.tools.defaults import CONFIRMATION_DRAWS
from sleuth.tools.investigation import CONFIRMATION_OFFSET
from sleuth.tools.registry import ToolError
from tests.fakeworld import fake_backends, new_session
from tests.test_audit_family import ALPHA, null_audits

CAPTION = "a realistic photograph of a cat. it is sitting."


def confirm(session, caption: str = CAPTION):
    ctx = ToolContext(investigation=session.investigation)
    return investigation_tools().call("measure_rate", {"caption": caption, "confirm": True, "max_n": 200}, ctx)


def discover(session, caption: str = CAPTION) -> list[int]:
    return session.investigation.sample(caption, 50).seeds


def test_a_second_fresh_run_of_a_seed_confirms_on_images_no_earlier_run_saw(tmp_path):
    cache = PredictionCache(tmp_path / "cache.sqlite")
    first = new_session(fake_backends(), tmp_path / "first", cache=cache, budget=5000)
    second = new_session(fake_backends(), tmp_path / "second", cache=cache, budget=5000)
    assert (first.config.confirmation_draw, second.config.confirmation_draw) == (0, 1)
    assert first.reaudit is None and second.earlier == [str((tmp_path / "first").resolve())]
    assert "confirms on fresh ones (confirmation draw 1)" in second.reaudit
    assert "until something confirms is not covered by alpha" in second.reaudit
    # The same discovery images; confirmation seeds (baseline and attempts) of blocks that never meet.
    assert discover(first) == discover(second)
    a, b = confirm(first), confirm(second)
    for draw, (s, result) in enumerate(((first, a), (second, b))):
        seeds = [*s.investigation.baselines["confirmation"].seeds, *result.hypothesis.seeds]
        assert (1 + draw) * CONFIRMATION_OFFSET <= min(seeds) and max(seeds) < (2 + draw) * CONFIRMATION_OFFSET
    # Other images, other counts (the fake world's failures are random draws per seed).
    assert (a.hypothesis.failures.k, a.baseline.k) != (b.hypothesis.failures.k, b.baseline.k)
    # The draw is recorded where forks, resumes and replays read it.
    assert second.started_event("scripted").config["confirmation_draw"] == 1
    assert second.started_event("scripted").seeds["confirmation"] == 2 * CONFIRMATION_OFFSET


def test_a_run_directory_keeps_its_claim_and_forks_keep_the_recorded_draw(tmp_path):
    cache = PredictionCache(tmp_path / "cache.sqlite")
    new_session(fake_backends(), tmp_path / "first", cache=cache)
    second = new_session(fake_backends(), tmp_path / "second", cache=cache)
    # A class an audit restarts before its first line was written claims again from the same directory.
    again = new_session(fake_backends(), tmp_path / "second", cache=cache)
    assert again.config.confirmation_draw == 1 and again.earlier == [str((tmp_path / "first").resolve())]
    with TranscriptWriter(second.transcript) as writer:
        second.runner(writer)
        started = writer.append(second.started_event("scripted"))
    fork = session_for(started, tmp_path / "fork", backends=fake_backends())
    assert fork.config.confirmation_draw == 1 and fork.investigation.draw == 1 and fork.reaudit is None
    # ... and claims nothing: the next fresh run takes draw 2.
    assert new_session(fake_backends(), tmp_path / "third", cache=cache).config.confirmation_draw == 2


def test_another_seed_class_or_cache_starts_at_draw_zero_and_old_transcripts_read_as_draw_zero(tmp_path):
    cache = PredictionCache()
    new_session(fake_backends(), tmp_path / "a", cache=cache)
    assert new_session(fake_backends(), tmp_path / "b", cache=cache, seed=1).config.confirmation_draw == 0
    assert new_session(fake_backends(), tmp_path / "c", cache=cache, **{"class": "dog"}).config.confirmation_draw == 0
    assert new_session(fake_backends(), tmp_path / "d", cache=PredictionCache()).config.confirmation_draw == 0
    assert new_session(fake_backends(), tmp_path / "e", cache=cache).config.confirmation_draw == 1
    assert RunConfig.recorded({"class": "cat", "budget": 100}).confirmation_draw == 0


def test_a_named_draw_is_honoured_and_a_reused_one_says_it_is_not_fresh_evidence(tmp_path):
    cache = PredictionCache()
    new_session(fake_backends(), tmp_path / "a", cache=cache)
    pinned = new_session(fake_backends(), tmp_path / "b", cache=cache, confirmation_draw=0)
    assert pinned.investigation.draw == 0 and pinned.earlier == [str((tmp_path / "a").resolve())]
    assert "confirmation draw 0 was used by an earlier run" in pinned.reaudit
    assert "not fresh evidence" in pinned.reaudit
    # A draw no run used is fresh; the automatic claim then skips it.
    assert new_session(fake_backends(), tmp_path / "c", cache=cache, confirmation_draw=5).reaudit is None
    assert new_session(fake_backends(), tmp_path / "d", cache=cache).config.confirmation_draw == 1
    with pytest.raises(ValueError, match="less than 255"):
        RunConfig.model_validate({"class": "cat", "confirmation_draw": CONFIRMATION_DRAWS})


def test_when_every_draw_of_a_seed_is_used_a_fresh_run_is_refused(tmp_path):
    cache = PredictionCache()
    for d in range(CONFIRMATION_DRAWS):
        cache.claim_draw("key", f"run-{d}", d)
    assert cache.claim_draw("key", "run-7") == (7, [f"run-{d}" for d in range(7)])  # a claimant keeps its draw
    with pytest.raises(ValueError, match="all 255 confirmation draws of this seed are used; choose another seed"):
        cache.claim_draw("key", "another")


def test_a_repeated_audit_says_which_classes_it_re_audits(tmp_path):
    from sleuth.agent.audit import Audit, resolve_classes, start
    from sleuth.agent.audit.config import parse_config

    def audit(name: str) -> dict:
        config = parse_config({"classes": ["cat", "dog"], "budget": {"per_class": {"images": 700}}})
        start(tmp_path / name, config, resolve_classes(config, fake_backends()))
        return Audit(tmp_path / name, fake_backends()).run()

    first, second = audit("first"), audit("second")
    assert [c["confirmation_draw"] for c in first["classes"]] == [0, 0]
    assert [c["confirmation_draw"] for c in second["classes"]] == [1, 1]
    assert all("reaudit" not in c for c in first["classes"])
    assert [c["reaudit"].split(" was audited")[0] for c in second["classes"]] == ["cat, seed 0", "dog, seed 0"]


def reaudit_false_findings(first: np.ndarray, second: np.ndarray, m: int) -> np.ndarray:
    """Per null audit of 12 classes: does a second audit of just the classes whose first audit confirmed something
    (same seed, so the same screens and the same attempts) list a false audit-significant finding? ``second``: the
    p-values of its attempts, which are the first audit's on the same confirmation images."""
    out = np.zeros(len(first), bool)
    for a in range(len(first)):
        picked = [c for c in range(first.shape[1]) if (m * first[a, c] <= ALPHA).any()]
        again = np.minimum(1.0, m * second[a, picked]).ravel()
        findings = [{"confirmation": {"adjusted_p": float(x)}} for x in again[again <= ALPHA]]
        if findings:
            out[a] = audit_family(findings, len(picked), ALPHA, [m] * len(picked))["audit_significant"] > 0
    return out


def test_re_auditing_the_classes_that_confirmed_something_stays_at_alpha_on_a_fresh_draw():
    """The adversary: audit 12 null classes, each spending its 40 declared attempts (the protocol planner's) on
    null captions; then audit again, with the same seed, only the classes that confirmed something. On the same
    confirmation images the second audit repeats every class-level false finding with a smaller audit family; on a
    fresh draw its attempts are new tests."""
    runs, m = 4000, 40
    first = null_audits(runs, 12, m, seed=38)
    same = reaudit_false_findings(first, first, m)
    fresh = reaudit_false_findings(first, null_audits(runs, 12, m, seed=39), m)
    leak = stats.binomial_rate(int(same.sum()), runs, method="clopper-pearson")
    assert int(same.sum()) == 902 and leak.low > 4 * ALPHA, leak  # 22.6% [21.3%, 23.9%]
    rate = stats.binomial_rate(int(fresh.sum()), runs, method="clopper-pearson")
    assert int(fresh.sum()) == 24 and rate.high <= ALPHA, rate  # 0.6% [0.4%, 0.9%]


def test_a_fresh_run_refused_its_draw_is_a_tool_error(tmp_path, monkeypatch):
    cache = PredictionCache()
    monkeypatch.setattr(cache, "claim_draw", lambda *a, **k: (_ for _ in ()).throw(ValueError("all used")))
    with pytest.raises(ToolError, match="cat, seed 0: all used"):
        new_session(fake_backends(), tmp_path / "a", cache=cache)


def test_a_run_that_never_started_gives_its_draw_back(tmp_path):
    cache = PredictionCache(tmp_path / "cache.sqlite")
    never = new_session(fake_backends(), tmp_path / "never", cache=cache)
    never.discard()
    assert not (tmp_path / "never").exists()
    again = new_session(fake_backends(), tmp_path / "again", cache=cache)
    assert again.config.confirmation_draw == 0 and again.reaudit is None
