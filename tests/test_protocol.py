"""The protocol planner (an anytime search in passes at 3x, 2x and 1.5x) through the real loop on the fake backend
set, whose one failure (snow, 60% against 3%) is known exactly, and its pieces on hand-made candidates."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from sleuth.agent import modes
from sleuth.agent.mitigate import load_run
from sleuth.agent.modes import Idea, content_key, idea_of
from sleuth.agent.planners import confirmations_by_budget, declared_confirmations, protocol
from sleuth.agent.planners.protocol import (
    PASSES,
    Candidate,
    Found,
    ProtocolPlanner,
)
from sleuth.agent.planners.protocol_v2 import ProtocolV2Planner
from sleuth.agent.transcript import read_transcript
from sleuth.agent.view import InvestigationView
from sleuth.tools import caption_failures, measure_rate, stats
from sleuth.tools.caption_failures import Hypothesis
from sleuth.tools.common import Confusion, SampleSummary
from sleuth.tools.ladder import plausibility, score
from tests.fakeworld import fake_backends, new_session, unrendered

CAT = "a realistic photograph of a cat"
SNOW = content_key(CAT + " in the snow.")


def run(tmp_path, planner, budget=6_000, backends=None, **settings):
    if isinstance(planner, ProtocolPlanner) and planner.confirmations >= 1:
        settings.setdefault("confirmations", planner.confirmations)  # the family its declared sizes share out
    session = new_session(backends or fake_backends(), tmp_path, budget=budget, **settings)
    result = session.run(planner)
    return session, result, read_transcript(session.transcript)


def final(events) -> str:
    return [e for e in events if e.kind == "planner_turn"][-1].reasoning


def images_until_first_finding(events) -> int:
    used = 0
    for e in events:
        if e.kind == "tool_returned":
            used += e.images_used or 0
        if e.kind == "finding":
            return used
    raise AssertionError("no finding")


def test_each_pass_aims_lower_and_screens_longer():
    p0 = 0.03
    worths = [t.worth(p0) for t in PASSES]
    assert worths == pytest.approx([max(3 * p0, p0 + 0.05), max(2 * p0, p0 + 0.01), max(1.5 * p0, p0 + 0.005)])
    # Later passes look longer before they drop anything, and test on more images.
    assert [t.floor for t in PASSES] == sorted(t.floor for t in PASSES)
    assert [t.test_n for t in PASSES] == sorted(t.test_n for t in PASSES)
    # A 15x failure at 29% screened 0/3 is dropped by the first pass's rule, and one at 9/32 is tested in the second.
    first, second = PASSES[0], PASSES[1]
    assert plausibility(0, 3, p0, first) < 0.2
    assert plausibility(9, 32, p0, second) >= 0.9
    assert plausibility(1, 32, p0, second) < 0.2
    assert score(10, 12, p0) > score(4, 12, p0) > score(0, 3, p0)


def test_it_confirms_the_known_failure_early_and_keeps_looking_while_images_remain(tmp_path):
    session, result, events = run(tmp_path, ProtocolPlanner("cat", CAT, budget=6_000, confirmations=12))
    assert result.status == "completed"
    inv = session.investigation
    # One finding: snow, under whichever phrasing screened surest; the other phrasing is listed with it.
    assert len(inv.findings) == 1 and SNOW <= content_key(inv.findings[0].caption), [f.caption for f in inv.findings]
    assert inv.findings[0].counterfactual is not None
    assert "also phrased" in final(events)
    assert images_until_first_finding(events) < 1500
    # Where the earlier planner stops once nothing plausible at 3x is left, this one goes on to the weaker targets.
    v2, _, _ = run(tmp_path / "v2", ProtocolV2Planner("cat", CAT, budget=6_000))
    assert v2.investigation.budget.used < inv.budget.used
    turns = [e.reasoning for e in events if e.kind == "planner_turn"]
    assert any(t.startswith("Pass 2:") for t in turns)
    assert "Searched for effects down to" in final(events)


def test_it_is_deterministic(tmp_path):
    # The same seed and confirmation draw (a second fresh run of the seed would confirm on the next draw).
    a, _, _ = run(tmp_path / "a", ProtocolPlanner("cat", CAT, budget=3_000), confirmation_draw=0)
    b, _, _ = run(tmp_path / "b", ProtocolPlanner("cat", CAT, budget=3_000), confirmation_draw=0)
    assert a.investigation.findings == b.investigation.findings
    assert [t.p_value for t in a.investigation.tests] == [t.p_value for t in b.investigation.tests]


def test_nothing_to_find_spends_the_passes_and_says_so(tmp_path):
    class Perfect:
        id = "perfect"
        labels = fake_backends().classifier.labels

        def logits(self, images):
            return np.tile(np.array([5.0, 0.0, 0.0], np.float32), (len(images), 1))

    backends = fake_backends()
    backends.classifier = Perfect()
    session, result, events = run(tmp_path, ProtocolPlanner("cat", CAT, budget=20_000), budget=20_000,
                                  backends=backends)
    assert result.status == "completed" and session.investigation.findings == []
    assert session.investigation.tests == []
    text = final(events)
    assert "No finding was confirmed" in text and "every pass ran to its end" in text
    # Every candidate the generator can render was looked at until the last pass's target would have shown a failure
    # in it at least half the time (its floor, 32 images, is too few at 1.5x a class that never fails: 200); the
    # others once (the generator reported the words it cannot draw).
    screens = [e for e in events if e.kind == "tool_called" and e.name == "generate_and_classify"][1:]
    per_caption: Counter[str] = Counter()
    for e in screens:
        per_caption[e.arguments["prompt"]] += e.arguments["n"]
    # Each later pass first drew the class baseline its tests would compare with: 800, then 1,500 images.
    assert per_caption.pop(CAT) == PASSES[-1].baseline_n - PASSES[0].baseline_n
    drawn = {n for p, n in per_caption.items() if not unrendered(p)}
    last = PASSES[-1]
    worth = last.worth(0.5 / (last.baseline_n + 1))
    rungs = [n for n in sorted({last.floor, *last.ladder}) if n >= last.floor]
    assert drawn == {next(n for n in rungs if (1 - worth) ** n <= last.drop_evidence)} == {200}
    assert {n for p, n in per_caption.items() if unrendered(p)} == {PASSES[0].ladder[0]}


@pytest.mark.parametrize("budget", [400, 700, 1000, 1200, 1500, 2000])
def test_a_tight_budget_is_never_overrun_and_the_stop_says_so(tmp_path, budget):
    planner = ProtocolPlanner("cat", CAT, budget=budget, confirmations=declared_confirmations("protocol", budget))
    session, result, events = run(tmp_path, planner, budget=budget)
    # The planner asks only for what it can pay (the baseline's top-up included) and ends with its answer.
    assert result.status == "completed"
    assert not [e for e in events if e.kind == "tool_returned" and not e.ok and "budget" in (e.error or "")]
    assert session.investigation.budget.used <= budget
    text = final(events)
    assert "not reached" in text or "could not be measured" in text
    tests = {t.id: t for t in session.investigation.tests}
    assert all(tests[f.confirmation.test_id].purpose == "confirmation" for f in session.investigation.findings)


def test_the_declared_family_bounds_the_attempts_and_the_stop_names_it(tmp_path):
    session, _, events = run(tmp_path, ProtocolPlanner("cat", CAT, budget=6_000, confirmations=1), confirmations=1)
    confirms = [e for e in events if e.kind == "tool_called" and e.name == "measure_rate"
                and e.arguments.get("confirm")]
    assert len(confirms) == 1
    # The other phrasing of snow was supported too, and is named, not confirmed again.
    assert "(also phrased 'a realistic photograph of a cat" in final(events)
    # With no attempt to spend, the run stops before its first test and says why, naming what it singled out.
    session, _, events = run(tmp_path / "none", ProtocolPlanner("cat", CAT, budget=6_000, confirmations=0))
    assert session.investigation.tests == []
    text = final(events)
    assert "the investigation's 0 confirmation attempts are spent" in text
    assert "Singled out by the screen but not tested before the stop: " in text and "not reached: 3x" in text


def test_a_finding_is_recorded_when_confirmed_and_its_counterfactual_added_when_the_pass_ends(tmp_path):
    session, result, events = run(tmp_path, ProtocolPlanner("cat", CAT, budget=6_000, confirmations=12))
    inv = session.investigation
    (f,) = inv.findings
    # The finding event comes before any counterfactual image is drawn: mechanism tests never delay a finding.
    first = next(i for i, e in enumerate(events) if e.kind == "finding")
    cf_calls = [i for i, e in enumerate(events) if e.kind == "tool_called" and e.name == "measure_rate"
                and e.arguments.get("mode") == "counterfactual"]
    assert cf_calls and first < cf_calls[0]
    recorded = [e for e in events if e.kind == "finding"]
    assert [e.finding_id for e in recorded] == [f.finding_id] * 2
    assert recorded[0].finding["counterfactual"] is None
    assert recorded[1].finding["counterfactual"]["test_id"] == f.counterfactual.test_id
    # Every reader takes a finding as its latest event has it, and counts it once.
    view = InvestigationView.from_events(events)
    assert [g.model_dump() for g in view.findings] == [f.model_dump()] and view.finding_events == 1
    assert view.images_at_findings[f.finding_id] < sum(e.images_used or 0 for e in events[:cf_calls[0]]
                                                       if e.kind == "tool_returned") + 1
    assert events[-1].kind == "run_finished" and events[-1].n_findings == 1
    assert [g.model_dump() for g in load_run(session.transcript).findings] == [f.model_dump()]


def measured(k: int, n: int, **labels: int) -> measure_rate.Result:
    """A test or confirmation of ``k`` failures in ``n`` images (against 10/300), failing as ``labels``."""
    return measure_rate.Result(
        test_id="t", caption="c", purpose="confirmation", mode="sample", baseline=stats.binomial_rate(10, 300),
        p_value=0.0, adjusted_p=0.0, family_size=1, adjust_method="holm", verdict="supported",
        hypothesis=SampleSummary(prompt="p", failures=stats.binomial_rate(k, n), seeds=(0, n - 1),
                                 confusions=[Confusion(label=lab, count=c) for lab, c in labels.items()]))


def test_the_session_declares_the_planners_family_and_records_it(tmp_path):
    assert confirmations_by_budget(2_000) == 10 and confirmations_by_budget(10_000) == 40
    assert confirmations_by_budget(20_000) == 80 and confirmations_by_budget(100_000) == 80
    # The protocol planner's family does not follow the budget: what it finds by N images is the same whatever it was
    # given (an attempt is tested at alpha over the family).
    assert {declared_confirmations("protocol", b) for b in (2_000, 10_000, 20_000, 100_000)} == {40}
    assert declared_confirmations("protocol-v2", 10_000) == 10
    session = new_session(fake_backends(), tmp_path / "a", budget=10_000)
    assert session.investigation.max_confirmations == 40 and session.config.confirmations == 40
    assert session.started_event("protocol").config["confirmations"] == 40
    own = new_session(fake_backends(), tmp_path / "b", budget=10_000, confirmations=7,
                      planner={"name": "protocol-v2"})
    assert own.investigation.max_confirmations == 7


def test_ideas_come_from_what_the_failures_share_and_the_class_does_not():
    def hyp(n: int, *sentences: str) -> Hypothesis:
        return Hypothesis(caption="x", predicted_label="y", n_images=n, sentences=list(sentences), mean_loglik=[],
                          images=[])

    common = {"the cat is grey": 0.6, "it is daytime": 1.0}
    rock = idea_of([hyp(6, "it is on the rocks", "the cat is grey"), hyp(2, "it is on the rocks", "it is daytime")],
                   common)
    assert rock == Idea(frozenset({"it is on the rocks"}), "it is on the rocks")  # 'grey': as common in the class
    mountain = idea_of([hyp(3, "it is on the rocks", "it is in the fog")], common)
    snow = idea_of([hyp(5, "it is in the snow", "the background is white"), hyp(1, "it is daytime")], common)
    assert snow.sentences == {"it is in the snow", "the background is white"} and snow.top == "it is in the snow"
    assert rock.same(mountain) and mountain.same(rock) and not rock.same(snow)
    # A sentence two ideas share by the way does not make them one: each one's most shared sentence must be in both.
    white = idea_of([hyp(4, "the cat is white", "the background is white")], common)
    assert white.top == "the background is white" or not white.same(snow)
    assert not Idea(frozenset({"a", "b"}), "a").same(Idea(frozenset({"b", "c"}), "c"))
    assert idea_of([], common) == Idea() and not Idea().same(Idea())


def test_what_most_of_the_class_is_captioned_with_and_a_lone_failure_are_no_idea():
    """A class that seldom fails gives no failures to tell its own look from what a candidate changes: the other
    candidates' captioned failures do. A sentence shared by one failure is no idea, and a sentence that says a word of
    the candidate's own caption is its top sentence."""
    def hyp(n: int, *sentences: str) -> Hypothesis:
        return Hypothesis(caption="x", predicted_label="y", n_images=n, sentences=list(sentences), mean_loglik=[],
                          images=[])

    water, blue = "it is on the road", "the sky is blue"
    purple = [hyp(2, water, blue, "the bicycle is purple")]
    white = [hyp(24, water, blue, "the bicycle is white")]
    # Without a background the sentences every bicycle image gets make the two colours one idea.
    assert idea_of(purple, {}).same(idea_of(white, {}))
    # Against other candidates' failures, about half of which say 'in the water', only the colour is said of them.
    background = {water: 0.55, blue: 0.6, "the bicycle is white": 0.1, "the bicycle is purple": 0.0}
    assert idea_of(white, {}, background) == Idea(frozenset({"the bicycle is white"}), "the bicycle is white")
    assert not idea_of(purple, {}, background).same(idea_of(white, {}, background))
    # Without a background, the sentence that says the candidate's own word comes first.
    own = idea_of(purple, {}, None, modes.stems("a realistic photograph of a purple bicycle") - modes.stems(
        "a realistic photograph of a bicycle"))
    assert own.top == "the bicycle is purple" and not own.same(idea_of(white, {}, None, frozenset({"white"})))
    assert modes.stems("it is on the rocks") == modes.stems("on a rock") == {"rock"}
    # One failure of two says it: no idea.
    assert idea_of([hyp(1, "it is at night", "it is on the road"), hyp(1, "it is at night", "it is on the grass")],
                   {}).top == "it is at night"
    assert idea_of([hyp(1, "it is at night", "it is on the road"), hyp(1, "it is on the grass")], {}) == Idea()


def test_ideas_are_read_again_against_every_captioned_candidate():
    planner = ProtocolPlanner("bicycle", "a realistic photograph of a bicycle")

    def captioned(caption: str, *sentences: str) -> Candidate:
        return Candidate(caption, "colour", captioned=[Hypothesis(caption="x", predicted_label="y", n_images=4,
                                                                  sentences=list(sentences), mean_loglik=[],
                                                                  images=[])])

    water = "it is on the road"
    cands = [captioned(f"a {c} bicycle", water, f"the bicycle is {c}") for c in ("purple", "white", "green")]
    planner._cands = cands
    planner._refresh_ideas()  # two others each: too few to say what is said of every bicycle
    assert all(water in c.idea.sentences for c in cands)
    planner._cands = cands + [captioned(f"a bicycle {w}", water, f"it is {w}") for w in ("at dusk", "in fog")]
    planner._refresh_ideas()
    assert [c.idea.top for c in cands] == ["the bicycle is purple", "the bicycle is white", "the bicycle is green"]
    assert all(water not in c.idea.sentences for c in cands)
    finding = Found(cands[1], None, None, "goldfish")  # type: ignore[arg-type]
    assert planner._repeat_of(cands[0], [finding]) is None and not finding.phrasings


def test_another_phrasing_of_a_finding_waits_and_a_different_idea_is_confirmed():
    planner = ProtocolPlanner("cat", CAT)

    def cand(caption: str, *idea: str) -> Candidate:
        return Candidate(caption, "background", idea=Idea(frozenset(idea), idea[0] if idea else None))

    rock = cand("a cat on a rock", "it is on the rocks")
    finding = Found(rock, None, None, "snow leopard")  # type: ignore[arg-type]
    assert planner._repeats(cand("a cat on a mountain top", "it is on the rocks", "it is in the fog"), [finding])
    assert planner._repeats(cand("a cat on a grey rock"), [finding])  # every word of the finding and more
    assert not planner._repeats(cand("a cat in the snow", "it is in the snow"), [finding])
    assert finding.phrasings == ["a cat on a mountain top", "a cat on a grey rock"]
    assert not planner._repeats(cand("a cat by the sea", "it is in the water", "it is on the rocks"), [finding])
    # The same idea failing mostly as another wrong label is a failure of its own; a stray one does not count.
    other = cand("a cat on a boulder", "it is on the rocks")
    other.confusions.update({"fox": 3, "snow leopard": 1})
    assert not planner._repeats(other, [finding]) and other.state != "other"
    stray = cand("a cat on a cliff", "it is on the rocks")
    stray.confusions.update({"fox": 1, "snow leopard": 1})
    assert planner._repeats(stray, [finding])
    rocks = Idea(frozenset({"it is on the rocks"}), "it is on the rocks")
    assert not planner._repeats(Candidate("a cat on a stone", "caption", target="fox", idea=rocks), [finding])


def test_a_finding_that_fails_as_several_labels_claims_each_it_often_fails_as():
    """Rooms of a house the classifier never saw fail as fly, dog and cat alike: a second room whose screen failed as
    dog is the same finding when dog holds a fair share of the first room's failures, and not when it holds less than
    OTHER_SHARE of them."""
    planner = ProtocolPlanner("shark", "a realistic photograph of a shark")
    indoors = Idea(frozenset({"it is indoors"}), "it is indoors")

    def tested(k: int, **labels: int) -> measure_rate.Result:
        return measure_rate.Result(
            test_id="t", caption="c", purpose="discovery", mode="sample", baseline=stats.binomial_rate(0, 300),
            p_value=0.0, adjusted_p=0.0, family_size=1, adjust_method="holm", verdict="supported",
            hypothesis=SampleSummary(prompt="p", failures=stats.binomial_rate(k, 30), seeds=(0, 29),
                                     confusions=[Confusion(label=lab, count=c) for lab, c in labels.items()]))

    bathroom = Candidate("a shark in a bathroom", "background", idea=indoors)
    finding = Found(bathroom, tested(27, fly=12, dog=9, cat=4, crayfish=2), tested(26, fly=10, dog=7, cat=6,
                                                                                      crayfish=3), "fly")
    assert finding.labels() == Counter({"fly": 22, "dog": 16, "cat": 10, "crayfish": 5})
    bedroom = Candidate("a shark in a bedroom", "background", idea=indoors, confusions=Counter({"dog": 3}))
    assert planner._repeats(bedroom, [finding]) and finding.phrasings == ["a shark in a bedroom"]
    # crayfish: 5 of 53 failures (9%), under OTHER_SHARE: a failure of its own.
    kitchen = Candidate("a shark in a kitchen", "background", idea=indoors, confusions=Counter({"crayfish": 3}))
    assert not planner._repeats(kitchen, [finding]) and kitchen.state != "other"


def test_tests_go_by_the_evidence_of_their_screens():
    """Surest first: the posterior probability of failing at the pass's target, then the posterior mean rate; a
    wrong label or a kind that already has findings costs nothing."""
    planner = ProtocolPlanner("cat", CAT)
    planner._p0 = 0.03
    t = PASSES[0]
    strong = Candidate("a", "background", k=12, n=12, confusions=Counter({"cat": 12}))
    weaker = Candidate("b", "background", k=9, n=12, confusions=Counter({"fence": 9}))
    weak = Candidate("c", "background", k=6, n=12, confusions=Counter({"fence": 6}))
    unsure = Candidate("d", "background", k=1, n=3, confusions=Counter({"fence": 1}))
    assert plausibility(6, 12, 0.03, t) > 0.999 and plausibility(1, 3, 0.03, t) < 0.9
    assert [c.caption for c in planner._order([unsure, weak, weaker, strong], t)] == ["a", "b", "c", "d"]


def test_a_new_pass_looks_again_at_what_the_first_dropped():
    planner = ProtocolPlanner("cat", CAT)
    planner._p0 = 0.03
    first, second = PASSES[0], PASSES[1]
    dropped = Candidate("a", "background", k=0, n=3, state="dropped")
    climbing = Candidate("b", "background", k=1, n=6, state="open")
    assert planner._judge(dropped, first) == "dropped"
    dropped.state = "open"  # what a new pass does to every candidate not tested, found or set aside
    plan = planner._screen_plan(second, [dropped, climbing])
    assert sorted((c.caption, more) for c, more in plan) == [("a", second.floor - 3), ("b", second.floor - 6)]


def test_what_a_test_adds_to_the_class_baseline_is_paid_for_before_anything_else():
    planner = ProtocolPlanner("cat", CAT, budget=10_000)
    planner.images_left = lambda: 1_000  # type: ignore[method-assign]
    last = PASSES[-1]
    planner._have = last.baseline_n  # the baseline is already at this pass's size
    assert planner._topup(last) == 0 and planner._affords(0, last)
    planner._have = 800  # the next test tops it up by 700, and a first confirmation needs its own baseline
    assert planner._topup(last) == last.baseline_n - 800
    assert not planner._affords(0, last)
    assert planner._test_n(last) == last.first_n


def test_a_later_pass_draws_its_class_baseline_before_its_screen_judges_anything(tmp_path):
    """The 2x pass's threshold is twice the class rate: it is judged against the 800 baseline images its tests use,
    drawn when the pass starts, not against the first pass's 300."""
    session, result, events = run(tmp_path, ProtocolPlanner("cat", CAT, budget=6_000, confirmations=12))
    assert result.status == "completed"
    order = [e for e in events if e.kind in ("planner_turn", "tool_called", "tool_returned")]
    intro = next(j for j, e in enumerate(order) if e.kind == "planner_turn" and e.reasoning.startswith("Pass 2:"))
    called = [e for e in order[:intro] if e.kind == "tool_called" and e.name == "generate_and_classify"
              and e.arguments.get("prompt") == CAT]
    first, top = called[0], called[-1]
    assert first.arguments["n"] == 300 and top.arguments["n"] == PASSES[1].baseline_n - 300
    # Nothing else between the top-up and the pass's first judgement.
    between = [e for e in order[order.index(top) + 1:intro] if e.kind == "tool_called"]
    assert between == []
    counts = {e.call_id: e.result["summary"]["failures"] for e in order if e.kind == "tool_returned"
              and e.call_id in (first.call_id, top.call_id)}
    k = sum(c["k"] for c in counts.values())
    assert sum(c["n"] for c in counts.values()) == PASSES[1].baseline_n
    p0 = (k + 0.5) / (PASSES[1].baseline_n + 1)
    assert f"now fails at {100 * PASSES[1].worth(p0):.1f}% or more" in order[intro].reasoning
    # The class rate the answer gives is the whole baseline's.
    whole = session.investigation.baselines["discovery"]
    assert whole.n >= PASSES[1].baseline_n and f"Baseline for cat: {whole.k}/{whole.n} = " in final(events)


def test_counterfactual_tests_are_planned_at_what_the_costliest_so_far_was_charged():
    """On toyworld a counterfactual test costs its 20 class images and their 40 edits; an editor on a diffusion model
    charges several hundred generator images a test, so a batch planned at 60 each would be refused by the budget."""
    planner = ProtocolPlanner("cat", CAT, budget=10_000)
    planner.images_left = lambda: 1_000  # type: ignore[method-assign]
    planner._have, planner._conf_drawn = 300, 300  # nothing to top up; a confirmation's first look kept back

    def result(mode: str, charged: int | None = None) -> measure_rate.Result:
        return measure_rate.Result(test_id="t1", caption="c", purpose="discovery", mode=mode,  # type: ignore[arg-type]
                                   baseline=stats.binomial_rate(0, 300), p_value=0.5, adjusted_p=0.5, family_size=1,
                                   adjust_method="holm", verdict="inconclusive", budget_charged=charged,
                                   rate_ratio=stats.rate_ratio(20, 30, 5, 300),
                                   hypothesis=SampleSummary(prompt="p", failures=stats.binomial_rate(20, 30),
                                                            seeds=(0, 29)))

    def findings(n: int) -> list[Found]:
        return [Found(Candidate(f"{CAT} {i}", "background"), result("sample"), result("sample"), "dog")
                for i in range(n)]

    found = findings(8)
    left = 1_000 - PASSES[0].first_n
    gen = planner._mechanisms(found[:1], PASSES[0])
    assert len(next(gen).tool_calls) == 1
    gen.send([result("counterfactual", 456)])
    gen = planner._mechanisms(found, PASSES[0])
    assert len(next(gen).tool_calls) == left // 456 == 2
    # At toyworld's cost the same images pay for every finding's test.
    cheap = ProtocolPlanner("cat", CAT, budget=10_000)
    cheap.images_left = planner.images_left  # type: ignore[method-assign]
    cheap._have, cheap._conf_drawn = 300, 300
    assert len(next(cheap._mechanisms(findings(7), PASSES[0])).tool_calls) == 7


def test_a_screen_that_reads_as_a_findings_idea_gets_no_more_screening_images():
    """Before a candidate climbs another rung, the failures of its screen are captioned; one whose failures read as a
    finding's idea waits as that finding's phrasing (the finding lists it) instead of taking more images."""
    planner = ProtocolPlanner("cat", CAT)
    planner._common = {"it is daytime": 0.9}

    def hyp(n: int, *sentences: str) -> Hypothesis:
        return Hypothesis(caption="x", predicted_label="snow leopard", n_images=n, sentences=list(sentences),
                          mean_loglik=[], images=[])

    snow = Candidate(CAT + ". it is in the snow.", "caption", target="snow leopard",
                     captioned=[hyp(20, "it is in the snow", "it is daytime")])
    storm = Candidate(CAT + " in a snowstorm.", "background", k=3, n=3, looks=[("m9", 3)],
                      confusions=Counter({"snow leopard": 3}))
    sky = Candidate(CAT + " in the sky.", "background", k=3, n=3, looks=[("m8", 3)], confusions=Counter({"fly": 3}))
    planner._cands = [snow, storm, sky]
    planner._refresh_ideas()
    finding = Found(snow, None, None, "snow leopard")  # type: ignore[arg-type]
    turns = planner._preview([storm, sky], screening=True)
    turn = next(turns)
    assert [c.arguments["measurement_id"] for c in turn.tool_calls] == ["m9", "m8"]
    with pytest.raises(StopIteration):
        turns.send([caption_failures.Result(measurement_id="m9", n_failures=3,
                                            hypotheses=[hyp(3, "it is in the snow", "it is daytime")]),
                    caption_failures.Result(measurement_id="m8", n_failures=3,
                                            hypotheses=[hyp(3, "it is in the sky", "it is daytime")])])
    assert storm.idea.top == "it is in the snow" and sky.idea.top == "it is in the sky"
    assert [c for c in (storm, sky) if not planner._repeats(c, [finding])] == [sky]
    assert storm.state == "other" and not storm.worded and finding.phrasings == [storm.caption]


def test_a_kind_of_cause_with_two_findings_failing_as_one_label_waits_for_the_end_of_the_pass():
    planner = ProtocolPlanner("crayfish", "a realistic photograph of a crayfish")
    blue, green = Candidate("blue", "adjective", target="shark"), Candidate("green", "adjective", target="shark")
    found = [Found(blue, None, None, "shark"), Found(green, None, None, "shark")]  # type: ignore[arg-type]
    purple = Candidate("purple", "adjective", target="shark")
    other_label = Candidate("red", "adjective", target="bee")
    other_kind = Candidate("in a net", "object", target="shark")
    assert planner._saturated(purple, found)
    assert not planner._saturated(other_label, found) and not planner._saturated(other_kind, found)
    assert not planner._saturated(purple, found[:1])  # one finding of its kind and label is not enough


def test_candidates_that_waited_are_tested_before_the_pass_ends(tmp_path, monkeypatch):
    # With no finding needed to wait, every candidate with a wrong label waits until the pass has screened the rest;
    # then they are tested in the same pass, the transcript says why they waited, and the snow is still found.
    monkeypatch.setattr(protocol, "KIND_LATER", 0)
    _, result, events = run(tmp_path, ProtocolPlanner("cat", CAT, budget=6_000))
    said = [e.reasoning for e in events if e.kind == "planner_turn"]
    waited = [i for i, s in enumerate(said) if "waited because findings of their kind already fail as their" in s]
    assert waited and any(s.startswith("Testing on fresh seeds") for s in said[waited[0]:])
    assert result.status == "completed" and "snow" in final(events)


def test_each_pass_declares_its_spending_with_its_confirmation_sizes():
    designs = protocol.pass_designs(PASSES, 80, 20_000)
    assert [(d.key, d.spending, d.attempts) for d in designs] == [
        ((30, 300), "pocock", 48), ((50, 800), "pocock", 16), ((100, 2000), "pocock", 16)]
    weak = tuple(dataclasses.replace(t, spending="obrien-fleming") if i else t for i, t in enumerate(PASSES))
    assert [d.spending for d in protocol.pass_designs(weak, 80, 20_000)] == ["pocock", "obrien-fleming",
                                                                             "obrien-fleming"]
    planner = ProtocolPlanner("cat", CAT, passes=weak)
    assert [planner.measure(CAT + " in the snow.", None, t).arguments["spending"] for t in weak] == [
        "pocock", "obrien-fleming", "obrien-fleming"]


@pytest.mark.parametrize("name", ["protocol", "protocol-v2", "protocol-v1", "wiles", "random"])
def test_each_offline_planner_writes_its_registered_name_on_its_turns(name):
    from sleuth.agent.config import PlannerConfig
    from sleuth.agent.planners import PlanFor, build_planner

    planner = build_planner(PlannerConfig(name=name), PlanFor(label="cat", class_prompt=CAT, labels=("cat", "dog"),
                                                              budget=5000))
    assert planner.name == name and planner.next_turn([]).model == name


def test_each_pass_confirms_against_as_many_baseline_images_as_its_tests_have():
    """Strong effects against the first 300 confirmation baseline images, so that the first confirmation is cheap;
    the 2x pass against the first 800, against which a weak failure of a class that seldom fails can be confirmed."""
    assert [d.baseline_n for d in protocol.pass_designs(PASSES, 80, 20_000, 300)] == [300, 800, 800]
    assert [d.baseline_n for d in protocol.pass_designs(PASSES, 40, 10_000, 300)] == [300, 800]
    assert [d.baseline_n for d in protocol.pass_designs(PASSES, 10, 2_000, 500)] == [500]
    # A weak failure (3.5% against 0.3%): against 300 baseline images it is not under alpha over the 40 attempts
    # declared at 10,000 images, let alone a look's share of it; against 800 it is.
    from sleuth.tools.stats.comparisons import fisher_p_greater

    small = float(fisher_p_greater(28, 800, 1, 300))
    large = float(fisher_p_greater(28, 800, 3, 800))
    assert small == pytest.approx(1.04e-3, rel=0.01) and large == pytest.approx(1.9e-6, rel=0.01)
    assert large < 0.05 / 40 / 10 and small > 0.05 / 40 / 2
    # The planner reserves what a confirmation adds to the baseline: 300 before the first, 500 more before the
    # first of the 2x pass.
    planner = ProtocolPlanner("cat", CAT, budget=10_000)
    assert planner._confirm_cost(PASSES[0]) == PASSES[0].first_n + 300
    assert planner._confirm_cost(PASSES[1]) == PASSES[1].first_n + 800
    planner._conf_drawn = 300
    assert planner._confirm_cost(PASSES[0]) == PASSES[0].first_n
    assert planner._confirm_cost(PASSES[1]) == PASSES[1].first_n + 500


def test_failures_that_read_alike_at_another_rate_are_a_cause_of_their_own():
    """Phrasings of one cause fail alike: a candidate whose failures the captioner reads as a finding's, but which
    fails at a clearly different rate, is tested as a distinct candidate; one at the finding's rate waits."""
    planner = ProtocolPlanner("bicycle", "a realistic photograph of a bicycle")
    idea = Idea(frozenset({"the bicycle is orange"}), "the bicycle is orange")
    golden = Candidate("a realistic photograph of a golden bicycle", "adjective", target="car", idea=idea)
    finding = Found(golden, None, measured(24, 100), "car")
    alike = Candidate("a realistic photograph of an orange bicycle", "adjective", target="car", k=10, n=40,
                      idea=idea)
    stronger = Candidate("a realistic photograph of an amber bicycle", "adjective", target="car", k=30, n=40,
                         idea=idea)
    assert planner._repeats(alike, [finding]) and alike.state == "other"
    assert not planner._repeats(stronger, [finding]) and stronger.state != "other"
    # With no rate to compare (a screen not yet looked at), the captions decide.
    assert planner._repeats(Candidate("a realistic photograph of a copper bicycle", "adjective", target="car",
                                      idea=idea), [finding])


def test_the_images_kept_back_for_a_test_go_to_the_surest_open_candidate_when_screening_stops():
    planner = ProtocolPlanner("bicycle", "a realistic photograph of a bicycle")
    planner._p0 = 0.01
    idea = Idea(frozenset({"the bicycle is orange"}), "the bicycle is orange")
    finding = Found(Candidate("a realistic photograph of a golden bicycle", "adjective", target="car", idea=idea),
                    None, None, "car")  # type: ignore[arg-type]

    def cand(caption: str, k: int, n: int, state: str = "open", **kw) -> Candidate:
        return Candidate(f"a realistic photograph of a bicycle {caption}", "background", k=k, n=n, state=state, **kw)

    phrasing = cand("that is orange", 9, 80, idea=idea)  # the surest, but a finding's phrasing
    dropped = cand("in the rain", 6, 32, state="dropped")
    best, next_ = cand("in a tunnel", 4, 80), cand("on a bridge", 2, 80)
    unseen = cand("in a barn", 0, 0)
    cands = [unseen, next_, dropped, phrasing, best]
    t = PASSES[1]
    assert plausibility(9, 80, 0.01, t) > plausibility(4, 80, 0.01, t) > plausibility(2, 80, 0.01, t)
    assert planner._last_shot(cands, [finding], t) is best and best.state == "test"
    assert planner._last_shot(cands, [finding], t) is next_
    assert planner._last_shot(cands, [finding], t) is None  # an unscreened, a dropped and a phrasing are not shots
    assert phrasing.state == "open" and dropped.state == "dropped" and unseen.state == "open"


def test_the_last_shot_is_never_a_phrasing_however_sure_its_screen():
    planner = ProtocolPlanner("bicycle", "a realistic photograph of a bicycle")
    planner._p0 = 0.01
    idea = Idea(frozenset({"the bicycle is orange"}), "the bicycle is orange")
    finding = Found(Candidate("a realistic photograph of a golden bicycle", "adjective", target="car", idea=idea),
                    None, None, "car")  # type: ignore[arg-type]
    waiting = Candidate("a realistic photograph of an orange bicycle", "adjective", target="car", k=9, n=80,
                        state="other", idea=idea)
    ladder = Candidate("a realistic photograph of a bicycle in a tunnel", "background", k=4, n=80, state="open")
    planner._pass = 1
    assert planner._last_shot([waiting, ladder], [finding], PASSES[1]) is ladder
    assert planner._last_shot([waiting, ladder], [finding], PASSES[1]) is None and waiting.state == "other"


def test_a_tested_candidate_is_read_as_the_runner_reads_a_finding():
    """Once tested, a candidate's wrong labels are its test's (not its screen's few, nor the label of the cluster of
    failures it came from), and a phrasing is read both ways, as the runner places findings in modes."""
    planner = ProtocolPlanner("cat", CAT)
    road = Idea(frozenset({"it is on the road"}), "it is on the road")
    grey = Candidate(CAT + ". the background is grey.", "caption", target="fox", idea=road,
                     confusions=Counter({"fox": 3}))
    lot = Candidate(CAT + " in a parking lot.", "background", idea=road)
    finding = Found(lot, None, None, "chainlink fence")  # type: ignore[arg-type]
    finding.labels = lambda: Counter({"chainlink fence": 40, "fox": 4})  # type: ignore[method-assign]
    assert planner._repeat_of(grey, [finding]) is None  # its screen failed as fox, which the finding seldom does
    grey.tested, grey.tested_k, grey.tested_n = Counter({"chainlink fence": 20, "fox": 6}), 26, 200
    assert grey.trace(CAT).target is None and grey.trace(CAT).top_label() == "chainlink fence"
    assert planner._repeat_of(grey, [finding]) is finding and not grey.worded
