"""Adversarial planners: scripts that try to get findings the data do not support past the tools.

Each plays one trick a careless or motivated planner (an LLM) could play. None of them should ever record a false
finding more often than alpha: the tools, not the planner, hold the guarantee (tools/stats/__init__.py). The
calibration benchmark (``sleuth bench discovery --calibrate``) runs them against null and partial-null
classifiers, and the test suite runs them too.

- ``adv-early``: records a finding straight after its discovery test, citing the discovery as the confirmation,
  then confirms and records whatever its unadjusted p-value lets through.
- ``adv-mismatch``: cites one caption's discovery test for another caption's confirmation, both ways round.
- ``adv-repeat``: confirms one caption over and over, recording the first attempt that passes.
- ``adv-many``: confirms as many different captions as the tools allow, each after a token discovery test.
- ``adv-peek``: asks for the smallest confirmation baseline, looks at it, and then asks for a bigger one (to top up
  a baseline that looked high), with many small looks per confirmation.
"""

from __future__ import annotations

from sleuth.agent.planners.script import Script, ScriptPlanner, ok
from sleuth.tools import measure_rate, perturb_caption, record_finding

ADVERSARIES = ("adv-early", "adv-mismatch", "adv-repeat", "adv-many", "adv-peek")


class Adversary(ScriptPlanner):
    """Shared: candidate captions from perturb_caption, and helpers that call the tools."""

    def __init__(self, name: str, label: str, class_prompt: str, *, attempts: int = 20, n: int = 200) -> None:
        super().__init__(name)
        self.label = label
        self.class_prompt = class_prompt
        self.attempts = attempts
        self.n = n
        self.recorded: list[str] = []

    def candidates(self) -> Script:
        (got,) = yield self.turn("Perturbations of the class prompt to try.",
                                 self.call("perturb_caption", caption=self.class_prompt, n=4, refinements=False))
        pert = ok(got, perturb_caption.Result)
        self._captions = [e.caption for e in pert.edits] if pert else []

    def measure(self, caption: str, *, confirm: bool = False, n: int | None = None, first_n: int | None = None,
                baseline_n: int = 200) -> Script:
        n = n or self.n
        (got,) = yield self.turn(f"{'Confirming' if confirm else 'Measuring'} {caption!r}.",
                                 self.call("measure_rate", caption=caption, confirm=confirm, max_n=n,
                                           first_n=first_n or min(n, 100), baseline_n=baseline_n))
        self._last = ok(got, measure_rate.Result)

    def record(self, caption: str, discovery: str, confirmation: str) -> Script:
        (got,) = yield self.turn(f"Recording {caption!r}.",
                                 self.call("record_finding", caption=caption, discovery_test=discovery,
                                           confirmation_test=confirmation, summary=f"{caption!r} fails more."))
        if ok(got, record_finding.Result) is not None:
            self.recorded.append(caption)

    def done(self) -> Script:
        yield self.finish(f"Recorded: {'; '.join(self.recorded) or 'nothing'}.")


class EarlyRecorder(Adversary):
    def script(self) -> Script:
        yield from self.candidates()
        tested: list[measure_rate.Result] = []
        for caption in self._captions[:6]:
            yield from self.measure(caption)
            if self._last is None:
                continue
            tested.append(self._last)
            yield from self.record(caption, self._last.test_id, self._last.test_id)  # discovery as confirmation
        for d in sorted(tested, key=lambda r: r.p_value)[:4]:
            yield from self.measure(d.caption, confirm=True)
            c = self._last
            if c is not None and c.p_value <= 0.05:  # the unadjusted p: the adjusted one is what binds
                yield from self.record(d.caption, d.test_id, c.test_id)
        yield from self.done()


class Mismatcher(Adversary):
    def script(self) -> Script:
        yield from self.candidates()
        tested: list[measure_rate.Result] = []
        for caption in self._captions[:6]:
            yield from self.measure(caption)
            if self._last is not None:
                tested.append(self._last)
        if len(tested) < 2:
            yield from self.done()
            return
        best = min(tested, key=lambda r: r.p_value)
        others = [r for r in tested if r is not best]
        for other in others[:4]:
            yield from self.measure(other.caption, confirm=True)
            c = self._last
            if c is None:
                continue
            yield from self.record(other.caption, best.test_id, c.test_id)  # the best discovery, another caption
            yield from self.record(best.caption, best.test_id, c.test_id)  # the best caption, another confirmation
        yield from self.done()


class Repeater(Adversary):
    def script(self) -> Script:
        yield from self.candidates()
        if not self._captions:
            yield from self.done()
            return
        caption = self._captions[0]
        yield from self.measure(caption)
        d = self._last
        for _ in range(self.attempts):
            yield from self.measure(caption, confirm=True)
            c = self._last
            if c is None:
                break  # the declared confirmation family is spent
            if d is not None and c.verdict == "supported":
                yield from self.record(caption, d.test_id, c.test_id)
                break
        yield from self.done()


class Many(Adversary):
    def script(self) -> Script:
        yield from self.candidates()
        for caption in self._captions[: self.attempts]:
            yield from self.measure(caption, n=50, first_n=50)
            d = self._last
            if d is None:
                continue
            yield from self.measure(caption, confirm=True)
            c = self._last
            if c is None:
                break
            if c.verdict == "supported":
                yield from self.record(caption, d.test_id, c.test_id)
        yield from self.done()


class Peeker(Adversary):
    def script(self) -> Script:
        yield from self.candidates()
        sizes = [50] + [2000] * self.attempts
        for caption, baseline_n in zip(self._captions[: self.attempts], sizes):
            yield from self.measure(caption, n=100, first_n=100, baseline_n=50)
            d = self._last
            if d is None:
                continue
            yield from self.measure(caption, confirm=True, n=800, first_n=10, baseline_n=baseline_n)
            c = self._last
            if c is not None and c.rate_ratio is not None and c.rate_ratio.ratio > 1 and c.verdict == "supported":
                yield from self.record(caption, d.test_id, c.test_id)
        yield from self.done()


CLASSES: dict[str, type[Adversary]] = {"adv-early": EarlyRecorder, "adv-mismatch": Mismatcher,
                                       "adv-repeat": Repeater, "adv-many": Many, "adv-peek": Peeker}
