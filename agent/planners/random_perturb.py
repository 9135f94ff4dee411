"""A baseline planner: random caption perturbations at a fixed sample size, with the same image budget.

It measures the class baseline, draws random LANCE perturbations of the class prompt (single attributes and pairs),
measures each on a fixed number of fresh images (no captioning, no sequential stopping, no refinement, no
counterfactuals), then confirms the supported ones on fresh seeds and records them. The benchmark compares the
protocol planner with it: what does looking at failures buy over guessing?
"""

from __future__ import annotations

import random

from sleuth.agent.planners.script import Script, ScriptPlanner, ok
from sleuth.tools import generate_and_classify, measure_rate, perturb_caption, record_finding
from sleuth.tools.defaults import BASELINE_N


class RandomPerturbationPlanner(ScriptPlanner):
    def __init__(self, label: str, class_prompt: str, *, budget: int, seed: int = 0, baseline_n: int = BASELINE_N,
                 n_per_caption: int = 200, max_confirm: int = 4, confirm_n: int = 400, batch: int = 8) -> None:
        super().__init__("random")
        self.label = label
        self.class_prompt = class_prompt
        self.budget = budget
        self.rng = random.Random(seed)
        self.baseline_n = baseline_n
        self.n_per_caption = n_per_caption
        self.max_confirm = max_confirm
        self.confirm_n = confirm_n
        self.batch = batch

    def script(self) -> Script:
        prompt = self.class_prompt
        (first, second) = yield self.turn(
            "Baseline of the class prompt, and the pool of perturbations to draw from.",
            self.call("generate_and_classify", prompt=prompt, n=self.baseline_n),
            self.call("perturb_caption", caption=prompt, n=20, refinements=False),
        )
        base, pert = ok(first, generate_and_classify.Result), ok(second, perturb_caption.Result)
        singles = [e.caption for e in pert.edits] if pert else []
        if base is None or not singles:
            yield self.finish("Nothing to perturb." if base is not None else first.error)
            return
        pool = list(singles)
        pairs = []
        for a in singles:
            for b in singles:
                extra = b.split(". ", 1)[1] if ". " in b else ""
                if a < b and extra and prompt in a and a.startswith(prompt) and b.startswith(prompt):
                    pairs.append(a.rstrip(".") + ". " + extra)
        self.rng.shuffle(pool)
        self.rng.shuffle(pairs)
        order = [c for pair in zip(pool, pairs) for c in pair] + pool[len(pairs):] + pairs[len(pool):]
        spent = self.baseline_n
        reserve = self.max_confirm * self.confirm_n
        tested: list[measure_rate.Result] = []
        while order and spent + self.n_per_caption * self.batch <= self.budget - reserve:
            chunk, order = order[: self.batch], order[self.batch:]
            results = yield self.turn(
                f"Measuring {len(chunk)} random perturbations on {self.n_per_caption} images each.",
                *[self.call("measure_rate", caption=c, max_n=self.n_per_caption, first_n=self.n_per_caption,
                            baseline_n=self.baseline_n) for c in chunk],
            )
            spent += self.n_per_caption * len(chunk)
            tested += [r for r in results if isinstance(r, measure_rate.Result)]
        supported = sorted([r for r in tested if r.verdict == "supported"],
                           key=lambda r: -(r.rate_ratio.low if r.rate_ratio else 0.0))[: self.max_confirm]
        found = []
        for r in supported:
            (got,) = yield self.turn(
                f"Confirming {r.caption!r} on fresh seeds.",
                self.call("measure_rate", caption=r.caption, confirm=True, max_n=self.confirm_n,
                          first_n=min(100, self.confirm_n), baseline_n=self.baseline_n),
            )
            conf = ok(got, measure_rate.Result)
            if conf is None or conf.verdict != "supported":
                continue
            (rec,) = yield self.turn(
                f"Recording {r.caption!r}.",
                self.call("record_finding", caption=r.caption, discovery_test=r.test_id,
                          confirmation_test=conf.test_id, summary=f"{r.caption!r}: confirmed on fresh seeds."),
            )
            if ok(rec, record_finding.Result) is not None:
                found.append(r.caption)
        yield self.finish(f"{len(tested)} random perturbations measured; confirmed: "
                          + ("; ".join(repr(c) for c in found) or "none") + ".")
