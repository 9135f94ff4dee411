"""Two runs compared as a colleague's machine would: the same events, results equal up to the tolerance policy."""

from __future__ import annotations

from collections.abc import Sequence

from sleuth.agent.events import Event
from sleuth.agent.replay.verify import ImageStores, compare_outcomes, diff_values

VOLATILE = {"ts", "hash", "prev_hash", "duration_s", "versions"}


def assert_equivalent_runs(a: Sequence[Event], b: Sequence[Event], *, allow: tuple[str, ...] = ("equivalent",)
                           ) -> None:
    """Event for event the same run: planner turns, calls and envelopes exactly (timestamps and hashes aside); tool
    results and findings identical or, where floats were computed in another order (thread counts, another CPU),
    within the declared tolerance. ``allow``: the difference classes accepted besides identical."""
    assert [e.kind for e in a] == [e.kind for e in b]
    for x, y in zip(a, b):
        if x.kind == "tool_returned" and y.kind == "tool_returned":
            found = compare_outcomes(y.ok, y.result if y.ok else y.error, x.ok, x.result if x.ok else x.error, None,
                                     ImageStores())
            assert all(kind in allow for kind, *_ in found), (x.seq, [f for f in found if f[0] not in allow][:3])
            rest = {"result", "error"}
        elif x.kind == "finding" and y.kind == "finding":
            found = []
            diff_values(y.finding, x.finding, "finding", ImageStores(), found)
            assert all(kind in allow for kind, *_ in found), (x.seq, found[:3])
            rest = {"finding"}
        else:
            rest = set()
        assert x.model_dump(mode="json", exclude=VOLATILE | rest) == y.model_dump(mode="json", exclude=VOLATILE | rest)
