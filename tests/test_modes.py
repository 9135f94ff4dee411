"""Failure modes: which findings are phrasings of one cause, the claim a mode makes, and how a run records them."""

from __future__ import annotations

from collections import Counter

from sleuth.agent.modes import (
    FOUNDED,
    Idea,
    ModeBook,
    Trace,
    best,
    claims,
    fails_otherwise,
    ideas_of,
    link,
)
from sleuth.tools import stats
from sleuth.tools.caption_failures import Hypothesis
from sleuth.tools.findings import Evidence, Finding

PROMPT = "a realistic photograph of a cat"


def hyp(n: int, *sentences: str, label: str = "snow leopard") -> Hypothesis:
    return Hypothesis(caption=PROMPT + ". " + ". ".join(sentences) + ".", predicted_label=label, n_images=n,
                      sentences=list(sentences), mean_loglik=[-1.0] * len(sentences), images=[])


def trace(caption: str, top: str | None = None, *others: str, labels: dict[str, int] | None = None) -> Trace:
    idea = Idea(frozenset({top, *others}) if top else frozenset(), top)
    return Trace(caption, Counter(labels or {"snow leopard": 10}), idea, PROMPT)


SNOW = "it is in the snow"


def test_failures_that_read_alike_are_one_cause() -> None:
    storm = trace(f"{PROMPT} in a snowstorm.", SNOW, "the background is white")
    lake = trace(f"{PROMPT} on a frozen lake.", SNOW)
    got = link(lake, storm, "f4")
    assert got is not None and got.kind == "idea" and "f4" in got.reason and SNOW in got.reason


def test_a_caption_that_states_what_another_s_failures_show_is_that_cause() -> None:
    # A three-sentence cluster caption whose failures' most distinctive sentence is the person, not the snow.
    cluster = trace(f"{PROMPT}. the cat is grey. there is a person next to it. it is in the snow.",
                    "there is a person next to it", SNOW, "the background is white")
    storm = trace(f"{PROMPT} in a snowstorm.", SNOW, "the background is white")
    assert not storm.idea.same(cluster.idea)
    got = link(storm, cluster)
    assert got is not None and got.kind == "states"
    # A sentence the caption says but its failures do not show is no link: a grey cat is not the snow.
    grey = trace(f"{PROMPT}. the cat is grey.", "the cat is grey")
    assert link(grey, cluster) is None


def test_shared_words_link_only_where_the_failures_do_not_say_otherwise() -> None:
    rock = trace(f"{PROMPT} on a rock.", "it is on the rocks")
    wider = trace(f"{PROMPT} on a rock at night.", "it is at night", "it is on the rocks")
    assert link(wider, rock).kind == "wider"  # holds every word of the finding's caption
    narrow = trace(f"{PROMPT} on rocks.", "it is on the rocks")
    assert link(narrow, wider).kind == "narrower"
    elsewhere = trace(f"{PROMPT} on rocks.", "the cat is white")  # its failures show something else
    assert link(elsewhere, wider) is None
    unread = trace(f"{PROMPT} on rocks.")  # no failures captioned yet: part of the words is not yet the cause
    assert link(unread, wider) is None


def test_a_failure_to_another_label_is_a_cause_of_its_own() -> None:
    snow = trace(f"{PROMPT} in the snow.", SNOW, labels={"snow leopard": 20, "fox": 2})
    same_words = trace(f"{PROMPT} in the snow.", SNOW, labels={"chainlink fence": 9, "snow leopard": 1})
    assert fails_otherwise(same_words, snow)
    assert link(same_words, snow) is None
    # One direction only: a screen with too few failures to name a label does not stop the link.
    few = trace(f"{PROMPT} in a snowstorm.", SNOW, labels={"fox": 1})
    assert link(few, snow, symmetric=False) is not None and link(few, snow) is None


def test_ideas_are_read_against_the_class_and_the_other_captions() -> None:
    common = {"the cat is grey": 0.6}
    captioned = {f"{PROMPT} in the snow.": [hyp(6, SNOW, "the cat is grey"), hyp(2, SNOW)],
                 f"{PROMPT} on a rock.": [hyp(5, "it is on the rocks", "it is daytime")]}
    ideas = ideas_of(captioned, common, PROMPT)
    assert ideas[f"{PROMPT} in the snow."] == Idea(frozenset({SNOW}), SNOW)  # grey: the class's own failures say it
    # Once four other captions are captioned, a sentence most of them say says nothing of any one.
    many = {f"{PROMPT} {x}.": [hyp(4, "it is on the road", f"it is {x}")] for x in ("red", "blue", "green", "pink")}
    many[f"{PROMPT} purple."] = [hyp(4, "it is on the road", "it is purple")]
    ideas = ideas_of(many, {}, PROMPT)
    assert all("it is on the road" not in i.sentences for i in ideas.values())
    assert ideas[f"{PROMPT} purple."].top == "it is purple"


def finding(fid: str, caption: str, k: int, n: int, k0: int = 13, n0: int = 300, p: float = 1e-6,
            effect: stats.RatioCI | None = None) -> Finding:
    def ev(tid: str) -> Evidence:
        return Evidence(test_id=tid, hypothesis=stats.binomial_rate(k, n), baseline=stats.binomial_rate(k0, n0),
                        rate_ratio=stats.rate_ratio(k, n, k0, n0), p_value=p, adjusted_p=min(1.0, 40 * p),
                        kind="rate", effect=effect)
    return Finding(finding_id=fid, caption=caption, summary="", confirmed=True, discovery=ev(f"d{fid}"),
                   confirmation=ev(f"c{fid}"))


def test_modes_form_as_findings_are_placed_and_claim_their_best_evidence() -> None:
    book = ModeBook()
    cluster = trace(f"{PROMPT}. the cat is grey. there is a person next to it. it is in the snow.",
                    "there is a person next to it", SNOW)
    storm = trace(f"{PROMPT} in a snowstorm.", SNOW)
    sky = trace(f"{PROMPT} in the sky.", "it is in the sky", labels={"fly": 8})
    first = book.place("f1", cluster)
    assert first.new and first.mode.mode_id == "m1" and first.reason == FOUNDED
    second = book.place("f2", storm)
    assert not second.new and second.mode is first.mode and "f1" in second.reason
    assert first.mode.idea == SNOW  # what most of its findings' failures show, not the founder's odd sentence
    assert book.place("f3", sky).mode.mode_id == "m2"
    assert book.place("f2", storm).mode.findings == ["f1", "f2"]  # placed once
    strong, weak = finding("f1", cluster.caption, 30, 30, p=1e-9), finding("f2", storm.caption, 21, 30, p=1e-7)
    got = claims(book, [strong, weak, finding("f3", sky.caption, 24, 30)])
    assert [c.mode.mode_id for c in got] == ["m1", "m2"]
    assert got[0].best is strong and [f.finding_id for f in got[0].phrasings] == ["f2"]
    assert got[0].effect == strong.confirmation.rate_ratio


def test_the_best_evidence_is_the_smallest_adjusted_p_then_the_surest_effect() -> None:
    a = finding("f1", "a", 20, 30, p=1e-4, effect=stats.RatioCI(ratio=6.0, low=0.25, high=18.0, method="conditional"))
    b = finding("f2", "b", 21, 30, p=1e-4, effect=stats.RatioCI(ratio=5.0, low=2.0, high=9.0, method="conditional"))
    c = finding("f3", "c", 10, 30, p=1e-3)
    assert best([a, b, c]) is b
    assert best([c, a]) is a
    assert best([]) is None


def test_a_restored_book_places_the_rest_as_it_would_have() -> None:
    book = ModeBook()
    book.restore("m1", "f1", FOUNDED, SNOW, ["snow leopard"])
    storm = trace(f"{PROMPT} in a snowstorm.", SNOW)
    traces = {"f1": trace(f"{PROMPT} in the snow.", SNOW), "f2": storm}
    copy = book.copy()
    placed = copy.place("f2", storm, traces)
    assert placed.mode.mode_id == "m1" and copy.mode_of("f2") is placed.mode
    assert book.mode_of("f2") is None  # the copy is a copy


def test_failures_that_read_alike_at_different_rates_are_two_causes() -> None:
    golden = Trace(f"{PROMPT} golden.", Counter({"fox": 9}), Idea(frozenset({"the cat is yellow"}),
                                                                  "the cat is yellow"), PROMPT, k=9, n=30)
    orange = Trace(f"{PROMPT} orange.", Counter({"fox": 28}), golden.idea, PROMPT, k=28, n=30)
    amber = Trace(f"{PROMPT} amber.", Counter({"fox": 12}), golden.idea, PROMPT, k=12, n=30)
    assert link(orange, golden) is None  # 93% against 30% (Fisher p < 0.01): not one cause
    assert link(amber, golden).kind == "idea"  # 40% against 30%: alike
    assert link(Trace(orange.caption, orange.labels, orange.idea, PROMPT), golden).kind == "idea"  # no rate: captions
