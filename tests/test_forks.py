"""Forks of one transcript share its confirmation family.

A fork copies its source's first lines, so it draws the same confirmation baseline and seeds; so does every fork
of the same point. Counted apart, five sibling branches would get five families' worth of attempts against one
baseline, and a user who forks until some branch records a finding would face no bound. The attempt ledger beside
the prediction cache counts every branch's attempts in the one family the transcript declared.
"""

from __future__ import annotations

import pytest

from sleuth.agent.replay.rebuild import session_for
from sleuth.agent.transcript import TranscriptWriter
from sleuth.tools import investigation_tools, stats
from sleuth.tools.cache import PredictionCache
from sleuth.tools.context import ToolContext
from sleuth.tools.investigation import Budget, Investigation
from sleuth.tools.registry import ToolError
from sleuth.tools.stats.shared_baseline import attempts_fwer
from tests.fakeworld import fake_backends, new_session

NULLS = [f"a realistic photograph of a cat. it is {w}." for w in ("daytime", "indoors", "small", "sitting")]


def branch(cache: PredictionCache, family: str | None, m: int = 3) -> ToolContext:
    inv = Investigation(backends=fake_backends(), label="cat", budget=Budget(images=60_000), max_confirmations=m,
                        cache=cache, family=family)
    return ToolContext(investigation=inv)


def confirm(ctx: ToolContext, caption: str):
    return investigation_tools().call("measure_rate", {"caption": caption, "confirm": True, "max_n": 200}, ctx)


def test_sibling_branches_share_the_attempts_and_a_repeat_of_a_call_is_not_another_attempt():
    cache = PredictionCache()
    first = branch(cache, "transcript-1")
    made = [confirm(first, c) for c in NULLS[:3]]
    sibling = branch(cache, "transcript-1")  # forked before any confirmation: same baseline, same seeds
    with pytest.raises(ToolError, match="3 confirmation attempts of this transcript and its forks are spent"):
        confirm(sibling, NULLS[3])
    # The very calls the first branch made, in the same state, draw the same images: not new attempts.
    again = [confirm(sibling, c) for c in NULLS[:3]]
    assert [(r.p_value, r.hypothesis.failures.k) for r in again] == [(r.p_value, r.hypothesis.failures.k)
                                                                     for r in made]
    # Another transcript (another first line) has its own family, and so does an investigation without one.
    assert confirm(branch(cache, "transcript-2"), NULLS[3]).family_size == 3
    assert confirm(branch(cache, None), NULLS[3]).family_size == 3


def test_a_caption_re_typed_in_another_branch_is_another_attempt():
    # The generator receives the text as typed (a case-sensitive text encoder draws other images from "A Cat" than
    # from "a cat"), so siblings that re-type one caption spend one attempt each.
    cache = PredictionCache()
    confirm(branch(cache, "t", m=2), NULLS[0])
    confirm(branch(cache, "t", m=2), NULLS[0].upper())
    with pytest.raises(ToolError, match="2 confirmation attempts of this transcript and its forks are spent"):
        confirm(branch(cache, "t", m=2), "  ".join(NULLS[0].split()))


def test_a_fork_compares_with_a_confirmation_baseline_of_the_size_the_first_branch_drew():
    # Designs without a baseline size: a fork that chose a larger baseline after reading the first branch's count
    # would stop the baseline where it looks low. Its size is fixed for every branch when the first one draws it.
    cache = PredictionCache()
    first = branch(cache, "t")
    investigation_tools().call("measure_rate", {"caption": NULLS[0], "confirm": True, "max_n": 200,
                                                "baseline_n": 300}, first)
    with pytest.raises(ToolError, match="confirmation baseline of 300 images"):
        investigation_tools().call("measure_rate", {"caption": NULLS[1], "confirm": True, "max_n": 200,
                                                    "baseline_n": 800}, branch(cache, "t"))
    same = investigation_tools().call("measure_rate", {"caption": NULLS[1], "confirm": True, "max_n": 200,
                                                       "baseline_n": 300}, branch(cache, "t"))
    assert same.baseline.n == 300 and same.family_size == 3


def test_a_branch_adopts_the_sizes_an_earlier_branch_fixed_before_the_baseline():
    cache = PredictionCache()
    confirm(branch(cache, "t", m=4), NULLS[0])  # fixes max_n=200 for the family
    sibling = branch(cache, "t", m=4)
    with pytest.raises(ToolError, match="not a declared design"):
        investigation_tools().call("measure_rate", {"caption": NULLS[1], "confirm": True, "max_n": 800}, sibling)
    assert confirm(sibling, NULLS[1]).family_size == 4


def test_a_session_and_its_forks_count_in_the_family_of_the_transcripts_first_line(tmp_path):
    s = new_session(fake_backends(), tmp_path / "run", cache=PredictionCache())
    with TranscriptWriter(s.transcript) as writer:
        s.runner(writer)
        started = writer.append(s.started_event("scripted"))
    assert s.investigation.family == started.hash
    fork = session_for(started, tmp_path / "fork", backends=fake_backends())
    assert fork.investigation.family == started.hash


@pytest.mark.parametrize(("n0", "p0"), [(1000, 0.09), (500, 0.05)])
def test_forking_until_a_branch_records_a_finding_stays_at_alpha(n0, p0):
    """Exact: null attempts of one design against one shared baseline, at alpha/M with M = 10."""
    plan = [stats.default_plan(800, first=100, alpha=0.05 / 10)]
    one = attempts_fwer(plan, n0, p0, 10, adaptive=False)  # one branch using its ten attempts
    counted_apart = attempts_fwer(plan, n0, p0, 50, adaptive=False)  # five siblings, ten each
    assert one <= 0.05 < counted_apart  # with the ledger five siblings together have the ten attempts of one
    # Exact (docs/statistics.md): 2.0% and 2.9% for one family; 5.3% and 9.1% for five siblings counted apart.
    assert (one, counted_apart) == pytest.approx({(500, 0.05): (0.0204, 0.0531), (1000, 0.09): (0.0295, 0.0908)}[
        n0, p0], abs=0.0001)
