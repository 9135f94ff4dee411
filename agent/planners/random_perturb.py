"""A baseline planner: random caption perturbations at a fixed sample size, with the same image budget.

It measures the class baseline, draws random LANCE perturbations of the class prompt (single attributes and pairs),
measures each on a fixed number of fresh images (no captioning, no sequential stopping, no refinement, no
counterfactuals), then confirms the supported ones on fresh seeds and records them. The benchmark compares the
protocol planner with it: what does looking at failures buy over guessing?
"""

from __future__ import annotations

import random
from collections.abc import Generator, Sequence
from typing import Any

from sleuth.agent.events import Event, ToolCall
from sleuth.agent.loop import Turn
from sleuth.agent.planners.protocol import _float

Results = list[dict[str, Any]]


class RandomPerturbationPlanner:
    deterministic = True
    """The same tool results give the same turns: resume and fork can fast-forward it."""
    name = "random"

    def __init__(self, label: str, class_prompt: str, *, budget: int, seed: int = 0, baseline_n: int = 1000,
                 n_per_caption: int = 200, max_confirm: int = 4, confirm_n: int = 400, batch: int = 8) -> None:
        self.label = label
        self.class_prompt = class_prompt
        self.budget = budget
        self.rng = random.Random(seed)
        self.baseline_n = baseline_n
        self.n_per_caption = n_per_caption
        self.max_confirm = max_confirm
        self.confirm_n = confirm_n
        self.batch = batch
        self._script: Generator[Turn, Results, None] | None = None
        self._calls = 0

    def next_turn(self, events: Sequence[Event]) -> Turn:
        if self._script is None:
            self._script = self._run()
            return next(self._script)
        out: list[dict[str, Any]] = []
        for e in reversed(events):
            if e.kind == "planner_turn":
                break
            if e.kind == "tool_returned":
                out.append(e.result if e.ok and e.result is not None else {"error": e.error or "failed"})
        return self._script.send(list(reversed(out)))

    def _call(self, name: str, **arguments: Any) -> ToolCall:
        self._calls += 1
        if name == "measure_rate":
            # Tests compare against a baseline of the planner's own size (the tool would top it up to its default).
            arguments.setdefault("baseline_n", self.baseline_n)
        return ToolCall(id=f"call_{self._calls}", name=name, arguments=arguments)

    def _turn(self, reasoning: str, *calls: ToolCall) -> Turn:
        return Turn(reasoning=reasoning, tool_calls=list(calls), model="random")

    def _run(self) -> Generator[Turn, Results, None]:
        prompt = self.class_prompt
        (base, pert) = yield self._turn(
            "Baseline of the class prompt, and the pool of perturbations to draw from.",
            self._call("generate_and_classify", prompt=prompt, n=self.baseline_n),
            self._call("perturb_caption", caption=prompt, n=20, refinements=False),
        )
        singles = [e["caption"] for e in pert.get("edits", [])]
        if "error" in base or not singles:
            yield self._finish("Nothing to perturb." if "error" not in base else base["error"])
            return
        pool = list(singles)
        # Pairs join two edits of different types that extend the class prompt ("... at night next to a flower").
        tails = sorted({(e["type"], t) for e in pert.get("edits", [])
                        if e["caption"].startswith(prompt) and (t := e["caption"][len(prompt):].strip(" ."))})
        pairs = [f"{prompt} {a} {b}." for ta, a in tails for tb, b in tails if ta < tb]
        self.rng.shuffle(pool)
        self.rng.shuffle(pairs)
        order = [c for pair in zip(pool, pairs) for c in pair] + pool[len(pairs):] + pairs[len(pool):]
        spent = self.baseline_n
        reserve = self.max_confirm * self.confirm_n
        tested: list[tuple[str, dict[str, Any]]] = []
        while order and spent + self.n_per_caption * self.batch <= self.budget - reserve:
            chunk, order = order[: self.batch], order[self.batch:]
            results = yield self._turn(
                f"Measuring {len(chunk)} random perturbations on {self.n_per_caption} images each.",
                *[self._call("measure_rate", caption=c, max_n=self.n_per_caption, first_n=self.n_per_caption)
                  for c in chunk],
            )
            spent += self.n_per_caption * len(chunk)
            tested += [(c, r) for c, r in zip(chunk, results) if "error" not in r]
        supported = sorted([(c, r) for c, r in tested if r["verdict"] == "supported"],
                           key=lambda cr: -_float(cr[1]["rate_ratio"]["low"]))[: self.max_confirm]
        found = []
        for caption, r in supported:
            (conf,) = yield self._turn(
                f"Confirming {caption!r} on fresh seeds.",
                self._call("measure_rate", caption=caption, confirm=True, max_n=self.confirm_n,
                           first_n=min(100, self.confirm_n)),
            )
            if "error" in conf or conf["verdict"] != "supported":
                continue
            (rec,) = yield self._turn(
                f"Recording {caption!r}.",
                self._call("record_finding", caption=caption, discovery_test=r["test_id"],
                           confirmation_test=conf["test_id"], summary=f"{caption!r}: confirmed on fresh seeds."),
            )
            if "error" not in rec:
                found.append(caption)
        yield self._finish(f"{len(tested)} random perturbations measured; confirmed: "
                           + ("; ".join(repr(c) for c in found) or "none") + ".")

    def _finish(self, summary: str) -> Turn:
        return self._turn(summary, self._call("finish", summary=summary))
