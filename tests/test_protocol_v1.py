"""The protocol-v1 planner through the real loop, on the fake backend set with a known bug (snow)."""

from __future__ import annotations

from sleuth.agent.planners.protocol_v1 import ProtocolV1Planner
from sleuth.agent.transcript import read_transcript
from tests.fakeworld import fake_backends, new_session

CAT = "a realistic photograph of a cat"


def run_session(tmp_path, seed=0, budget=20_000, **settings):
    backends = fake_backends()
    session = new_session(backends, tmp_path, seed=seed, budget=budget, **settings)
    result = session.run(ProtocolV1Planner("cat", CAT, baseline_n=1000))
    return session, result


def test_protocol_confirms_the_planted_effect_and_writes_every_step(tmp_path):
    session, result = run_session(tmp_path)
    assert result.status == "completed"
    inv = session.investigation
    assert len(inv.findings) == 1
    f = inv.findings[0]
    # Refinement keeps the shortest caption with the effect: the class sentence plus the snow sentence.
    assert f.caption == "a realistic photograph of a cat. it is in the snow."
    assert f.confirmation.hypothesis.n > 0 and f.confirmation.adjusted_p < 0.05
    assert f.counterfactual is not None and f.counterfactual.kind == "counterfactual"
    events = read_transcript(session.transcript)
    kinds = [e.kind for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    assert kinds.count("finding") == 1
    names = [e.name for e in events if e.kind == "tool_called"]
    assert names[:2] == ["generate_and_classify", "caption_failures"]
    assert "perturb_caption" in names and names[-1] == "finish"
    assert sum(1 for e in events if e.kind == "tool_returned" and not e.ok) == 0
    # Every planner turn explains itself in words.
    assert all(e.reasoning for e in events if e.kind == "planner_turn")
    assert inv.budget.used <= 20_000


def test_protocol_is_deterministic(tmp_path):
    # The same seed and confirmation draw (a second fresh run of the seed would confirm on the next draw).
    a, _ = run_session(tmp_path / "a", confirmation_draw=0)
    b, _ = run_session(tmp_path / "b", confirmation_draw=0)
    assert a.investigation.findings == b.investigation.findings
    assert [t.p_value for t in a.investigation.tests] == [t.p_value for t in b.investigation.tests]


def test_a_baseline_without_failures_ends_cleanly_with_and_without_exploration(tmp_path):
    import numpy as np

    class Perfect:
        id = "perfect"
        labels = fake_backends().classifier.labels

        def logits(self, images):
            return np.tile(np.array([5.0, 0.0, 0.0], np.float32), (len(images), 1))

    for explore in (False, True):
        backends = fake_backends()
        backends.classifier = Perfect()
        session = new_session(backends, tmp_path / str(explore))
        planner = ProtocolV1Planner("cat", CAT, baseline_n=200, explore=explore, refine=explore,
                                  counterfactual=explore)
        result = session.run(planner)
        assert result.status == "completed" and session.investigation.findings == []
        # Without exploration there is nothing to test; with it, every perturbation the generator can render is
        # screened, none fails more often than the baseline (0%), so none becomes a test.
        assert session.investigation.tests == []
        screens = [e for e in read_transcript(session.transcript)
                   if e.kind == "tool_called" and e.name == "generate_and_classify"]
        prompts = {e.arguments["prompt"] for e in screens[1:]}
        assert len(screens) == 1 or {CAT + " in the snow.", CAT + " on the grass."} <= prompts
        assert explore == (len(screens) > 1) and all(e.arguments["n"] == 30 for e in screens[1:])
