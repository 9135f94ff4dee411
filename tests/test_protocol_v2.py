"""The protocol-v2 planner (screen on a ladder, test what the screen singles out, confirm at once, stop early) through
the real loop on the fake backend set, whose one failure (snow, 60% against 3%) is known exactly."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from sleuth.agent.modes import content_key
from sleuth.agent.planners.protocol_v1 import ProtocolV1Planner
from sleuth.agent.planners.protocol_v2 import LADDER, Candidate, ProtocolV2Planner, by_kind, plausibility, score, worth
from sleuth.agent.transcript import read_transcript
from tests.fakeworld import fake_backends, new_session

CAT = "a realistic photograph of a cat"
SNOW = content_key(CAT + " in the snow.")


def run(tmp_path, planner, budget=20_000, backends=None, seed=0, **settings):
    session = new_session(backends or fake_backends(), tmp_path, seed=seed, budget=budget, **settings)
    result = session.run(planner)
    return session, result, read_transcript(session.transcript)


def test_worth_and_plausibility_follow_the_stated_rule():
    # A failure worth confirming: 3x the baseline and 5 points above it, capped half way to certainty.
    assert worth(0.01) == pytest.approx(0.06) and worth(0.05) == pytest.approx(0.15)
    assert worth(0.6) == pytest.approx(0.8)
    # At a 3.3% baseline: nothing in 4 images leaves ~3%; one failure in 4 keeps a candidate in play; three are
    # enough to test; one in 32 is dropped.
    p0 = 0.033
    assert plausibility(0, 4, p0) < 0.2 < plausibility(1, 4, p0) < 0.9 < plausibility(3, 4, p0)
    assert plausibility(1, 32, p0) < 0.05
    # More failures in the same images is always more plausible, and a surer one ranks first.
    for n in LADDER:
        ps = [plausibility(k, n, p0) for k in range(n + 1)]
        assert all(a < b or a > 1 - 1e-9 for a, b in zip(ps, ps[1:]))
    assert score(10, 12, p0) > score(4, 12, p0) > score(1, 12, p0)


def test_it_confirms_the_known_failure_with_a_fraction_of_the_images(tmp_path):
    session, result, events = run(tmp_path / "v2", ProtocolV2Planner("cat", CAT, budget=20_000))
    assert result.status == "completed"
    inv = session.investigation
    assert [content_key(f.caption) for f in inv.findings] == [SNOW]
    f = inv.findings[0]
    assert f.confirmation.adjusted_p < 0.05 and f.counterfactual is not None
    lean_images = inv.budget.used
    v1, _, _ = run(tmp_path / "v1", ProtocolV1Planner("cat", CAT, budget=20_000))
    assert [x.caption for x in v1.investigation.findings] == [CAT + ". it is in the snow."]
    # The same finding for under a fifth of the images.
    assert lean_images * 5 < v1.investigation.budget.used
    # It was confirmed a few hundred images after its screen, not after a discovery stage.
    used = 0
    for e in events:
        if e.kind == "tool_returned":
            used += e.images_used or 0
        if e.kind == "finding":
            break
    assert used < 1500
    # The answer says why the run stopped.
    final = [e for e in events if e.kind == "planner_turn"][-1].reasoning
    assert "Stopped: No candidate is left" in final


def test_the_screen_climbs_the_ladder_and_tests_only_what_it_singles_out(tmp_path):
    session, _, events = run(tmp_path, ProtocolV2Planner("cat", CAT, budget=20_000))
    calls = [e for e in events if e.kind == "tool_called"]
    screens = [e for e in calls if e.name == "generate_and_classify"][1:]
    sizes: dict[str, int] = {}
    for e in screens:
        sizes[e.arguments["prompt"]] = sizes.get(e.arguments["prompt"], 0) + e.arguments["n"]
    # Every screened caption stops on a rung of the ladder; the snow caption is among them.
    assert set(sizes.values()) <= set(LADDER) and SNOW in {content_key(c) for c in sizes}
    tested = [e.arguments["caption"] for e in calls if e.name == "measure_rate" and not e.arguments.get("confirm")
              and e.arguments.get("mode") != "counterfactual"]
    # Only captions with snow fail above the baseline (grass and sand fail at the baseline's 3%), and the shortest
    # of them goes first: one test, confirmed, so the other phrasings of the same failure are not tested.
    assert [content_key(c) for c in tested] == [SNOW]
    assert session.investigation.budget.used < 1500


def test_it_is_deterministic(tmp_path):
    # The same seed and confirmation draw (a second fresh run of the seed would confirm on the next draw).
    a, _, _ = run(tmp_path / "a", ProtocolV2Planner("cat", CAT, budget=20_000), confirmation_draw=0)
    b, _, _ = run(tmp_path / "b", ProtocolV2Planner("cat", CAT, budget=20_000), confirmation_draw=0)
    assert a.investigation.findings == b.investigation.findings
    assert [t.p_value for t in a.investigation.tests] == [t.p_value for t in b.investigation.tests]


def test_nothing_to_find_ends_after_the_screen_and_says_why(tmp_path):
    class Perfect:
        id = "perfect"
        labels = fake_backends().classifier.labels

        def logits(self, images):
            return np.tile(np.array([5.0, 0.0, 0.0], np.float32), (len(images), 1))

    backends = fake_backends()
    backends.classifier = Perfect()
    session, result, events = run(tmp_path, ProtocolV2Planner("cat", CAT, budget=20_000), backends=backends)
    assert result.status == "completed" and session.investigation.findings == []
    assert session.investigation.tests == []
    final = [e for e in events if e.kind == "planner_turn"][-1].reasoning
    assert "No finding was confirmed" in final and "No candidate is left" in final
    # The baseline and one rung of screening: nothing failed, so nothing climbed.
    screens = [e for e in events if e.kind == "tool_called" and e.name == "generate_and_classify"][1:]
    assert screens and all(e.arguments["n"] == LADDER[0] for e in screens)
    assert session.investigation.budget.used == 300 + LADDER[0] * len(screens)


@pytest.mark.parametrize("budget", [400, 700, 1000])
def test_a_tight_budget_is_never_overrun_and_the_stop_says_so(tmp_path, budget):
    session, result, events = run(tmp_path, ProtocolV2Planner("cat", CAT, budget=budget), budget=budget)
    assert result.status in ("completed", "budget_spent")
    assert session.investigation.budget.used <= budget
    final = [e for e in events if e.kind == "planner_turn"][-1].reasoning
    assert "Stopped:" in final or "could not be measured" in final
    # Whatever it recorded went through a confirmation.
    tests = {t.id: t for t in session.investigation.tests}
    assert all(tests[f.confirmation.test_id].purpose == "confirmation" for f in session.investigation.findings)


def test_equally_sure_candidates_go_by_how_much_their_failures_keep_to_one_label():
    """Screens at their ceiling (12/12) tie on sureness; the one whose failures keep to one wrong label goes first
    in its kind, and a surer screen still beats a more concentrated one."""
    p0 = 0.15

    def cand(caption: str, kind: str, k: int, confusions: dict[str, int]) -> Candidate:
        return Candidate(caption, kind, k=k, n=12, confusions=Counter(confusions))

    scattered = cand("a", "background", 12, {"x": 5, "y": 4, "z": 3})
    mixed = cand("b", "background", 12, {"y": 7, "x": 5})
    kept = cand("c", "background", 12, {"z": 11, "x": 1})
    weaker = cand("d", "background", 11, {"w": 11})
    order = by_kind([scattered, mixed, weaker, kept], p0)
    assert [c.caption for c in order] == ["c", "b", "a", "d"]
    assert [round(c.mode_share, 3) for c in order] == [0.917, 0.583, 0.417, 0.917]
    # Within one failure mode the same: shortest caption first, then surest, then the most concentrated.
    same = [cand("p q", "domain", 12, {"x": 6, "y": 6}), cand("r s", "domain", 12, {"x": 9, "y": 3})]
    assert [c.caption for c in by_kind(same, p0)] == ["r s", "p q"]
    # No failures, no share.
    assert cand("e", "object", 0, {}).mode_share == 0.0


def test_one_finding_per_failure_mode(tmp_path):
    """Snow fails as snow leopard whatever the phrasing: one finding, and the other phrasings are not re-confirmed."""
    session, _, events = run(tmp_path, ProtocolV2Planner("cat", CAT, budget=20_000))
    assert len(session.investigation.findings) == 1
    confirms = [e for e in events
                if e.kind == "tool_called" and e.name == "measure_rate" and e.arguments.get("confirm")]
    assert len(confirms) == 1


def test_the_summary_names_what_the_screen_singled_out_but_never_tested(tmp_path, monkeypatch):
    """A run that stops before testing a candidate the screen singled out says which, with its screen."""
    import sleuth.agent.planners.protocol_v2 as v2

    monkeypatch.setattr(v2, "MAX_CONFIRMATIONS", 0)  # stops as soon as the screen has singled anything out
    session, result, events = run(tmp_path, ProtocolV2Planner("cat", CAT, budget=20_000))
    final = [e for e in events if e.kind == "planner_turn"][-1].reasoning
    assert session.investigation.tests == []
    assert ("Singled out by the screen but not tested before the stop: 1 ('a realistic photograph of a cat. it is "
            "in the snow.' 7/12)") in final
    # Surest first, at most five named.
    cands = [v2.Candidate(f"c{i}", "caption", k=i, n=12) for i in range(8)]
    assert v2._named(cands, 0.05) == " ('c7' 7/12, 'c6' 6/12, 'c5' 5/12, 'c4' 4/12, 'c3' 3/12, and 3 more)"
