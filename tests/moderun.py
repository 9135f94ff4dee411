"""A scripted run on the fake world whose three findings form two failure modes, for the tests of every view of modes.

'in the snow' founds m1; 'in the snow in daytime' holds every word of it, so it joins m1 as another phrasing; 'on
a snowy hill' shares no content word with either ('snowy' is not 'snow'), and no caption of its failures was read, so
it founds m2. All three fail as snow leopard (the fake world's one failure), each confirmed on fresh seeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sleuth.agent.events import ToolCall
from sleuth.agent.planners.scripted import ScriptedPlanner
from sleuth.agent.runner import RunResult, Turn
from sleuth.agent.session import Session
from sleuth.tools.findings import Finding
from sleuth.tools.stats import RatioCI
from tests.fakeworld import fake_backends, new_session

CAT = "a realistic photograph of a cat"
SNOW = f"{CAT} in the snow."
DAYTIME = f"{CAT} in the snow in daytime."
HILL = f"{CAT} on a snowy hill."


def call(i: int, name: str, **arguments: object) -> ToolCall:
    return ToolCall(id=f"c{i}", name=name, arguments=arguments)


def _finding(i: int, caption: str) -> list[Turn]:
    """Discovery, confirmation and record of one caption (tests t{2i-1} and t{2i})."""
    d, c = 2 * i - 1, 2 * i
    return [Turn(reasoning="Measure.", tool_calls=[call(10 * i, "measure_rate", caption=caption, max_n=200)]),
            Turn(reasoning="Confirm.", tool_calls=[call(10 * i + 1, "measure_rate", caption=caption, confirm=True,
                                                        max_n=200)]),
            Turn(reasoning="Record.", tool_calls=[call(10 * i + 2, "record_finding", caption=caption,
                                                       discovery_test=f"t{d}", confirmation_test=f"t{c}")])]


SCRIPT = [
    Turn(reasoning="Baseline.", tool_calls=[call(1, "generate_and_classify", prompt=CAT, n=300)]),
    Turn(reasoning="Caption the failures.", tool_calls=[call(2, "caption_failures", measurement_id="m1")]),
    *_finding(1, SNOW), *_finding(2, DAYTIME), *_finding(3, HILL),
    Turn(reasoning="Done.", tool_calls=[call(99, "finish", summary="cats in snow fail")]),
]


@dataclass
class ModeRun:
    session: Session
    result: RunResult

    @property
    def transcript(self) -> Path:
        return self.session.transcript


def mode_run(run_dir: Path) -> ModeRun:
    session = new_session(fake_backends(), run_dir, budget=20_000)
    result = session.run(ScriptedPlanner(SCRIPT))
    assert result.status == "completed"
    return ModeRun(session, result)


def weakened(f: Finding, ratio: float = 2.5, low: float = 0.0, high: float = 16.0) -> Finding:
    """The finding with its corrected effect's interval reaching 1 (a weak claim), its counts unchanged."""
    c = f.confirmation
    effect = RatioCI(ratio=ratio, low=low, high=high, method="test")
    return f.model_copy(update={"confirmation": c.model_copy(update={"effect": effect})})
