"""The answer key of an investigation on toyworld: what the world planted in the class, and what the run made of it.

Read after the run, from its closed transcript and the world's oracle, never by a planner: the class's planted bugs
and decoys with the oracle's ratio for each, the oracle's verdict on every confirmed finding and the planted bug it
names (the benchmark's rules: ``judge`` and ``discovery.names_bug``), the failure modes that hold the findings
naming each plant (the modes the transcript records: ``view.mode_claims``), and for every bug not found how far the
run got with it and why it stopped there (the benchmark's miss report, ``misses.stage_of``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from sleuth.agent.bench.discovery import names_bug
from sleuth.agent.bench.judge import OracleJudge
from sleuth.agent.bench.misses import LEARNED, stage_of
from sleuth.agent.view import InvestigationView
from sleuth.tools.backends.specs import BackendSpecs
from sleuth.tools.backends.toyworld import Oracle
from sleuth.tools.backends.toyworld.config import World

ORACLE_N = 2000
"""Oracle images per caption: enough to tell a real 1.2x effect from none for the bugs and findings of a demo."""

WHY = {
    "found": "a confirmed finding names it, and the oracle measures that finding real",
    "recorded, not real": "a finding names it, but the oracle does not measure that finding's caption above 1.2x",
    "confirmed, not recorded": "a confirmation was significant but no finding was recorded from it",
    "confirmation not significant": "a caption naming it passed discovery, but its confirmation on fresh seeds did "
                                    "not reach the corrected level",
    "supported, not confirmed": "a caption naming it passed discovery; the run ended before its confirmation",
    "tested, not supported": "a caption naming it was tested and did not pass the corrected discovery test",
    "screened, not tested": "its screen looked promising, but other candidates took the tests the budget allowed",
    "screened out": "its screen did not show it failing at twice the class rate, so it was dropped",
    "proposed, not screened": "a caption naming it was proposed but the budget ran out before it was screened",
    "never proposed": "no caption or perturbation of the run named it",
}
"""Why a planted bug ended at each stage (``misses.STAGES``)."""


def reveal_refusal(specs: BackendSpecs) -> str | None:
    """Why an answer key cannot be given for these backends (None: it can): the oracle knows toyworld's own
    generator and classifier only."""
    if specs.generator != "toyworld" or specs.classifier != "toyworld":
        return (f"--reveal needs toyworld's own generator and classifier, whose planted bugs the oracle knows "
                f"(got --generator {specs.generator} --classifier {specs.classifier})")
    return None


def answer_key(world: World, label: str, view: InvestigationView, findings: Sequence[dict[str, Any]], *,
               criterion: str = "top1", oracle_n: int = ORACLE_N, oracle: Oracle | None = None) -> dict[str, Any]:
    """The class's planted bugs and decoys, each finding's oracle verdict and bug, and every miss with its reason.

    ``view`` is the closed transcript's view; ``findings`` its confirmed findings (``FindingSummary``
    dicts, as ``investigate --json`` prints them). The key's ``modes`` maps each failure mode's id to its findings'
    ids; each finding names its mode (``mode_id``) and each plant the modes of the findings that name it.
    """
    modes = {c.mode.mode_id: [f.finding_id for f in c.findings] for c in view.mode_claims()}
    mode_of = {f: m for m, ids in modes.items() for f in ids}
    oracle = oracle or Oracle(world)
    judge = OracleJudge(oracle, oracle_n, criterion)
    manifest = [b for b in oracle.manifest() if b.class_ == label]
    bugs = [b for b in manifest if b.kind == "bug"]
    judged = []
    for f in findings:
        verdict = judge.judge(label, f["caption"])
        named = [b.name for b in manifest if names_bug(f["caption"], b, world)]
        judged.append({"finding_id": f["finding_id"], "caption": f["caption"], "real": verdict["real"],
                       "mode_id": mode_of.get(f["finding_id"]), "oracle": verdict, "names": named,
                       "bug": next((n for n in named if verdict["real"] and n in {b.name for b in bugs}), None)})
    planted = []
    for b in manifest:
        by = [f["finding_id"] for f in judged if b.name in f["names"] and (f["real"] or b.kind == "decoy")]
        entry: dict[str, Any] = {"name": b.name, "kind": b.kind, "caption": b.caption, "strength": b.strength,
                                 "confuser": b.confuser, "oracle": judge.judge(label, b.caption, full=True),
                                 "findings": by,
                                 "modes": list(dict.fromkeys(mode_of[f] for f in by if f in mode_of))}
        if b.kind == "bug":
            found = any(f["bug"] == b.name for f in judged)
            outcome = stage_of(view, partial(names_bug, bug=b, world=world), found)
            ratio = entry["oracle"]["ratio"]
            learned = ratio is None or ratio >= LEARNED
            why = WHY[outcome["stage"]]
            if not found and not learned:
                why = f"the classifier barely learned it (the oracle measures {ratio:.2g}x); " + why
            entry.update(found=found, learned=learned, stage=outcome["stage"], why=why, screen=outcome["screen"])
        planted.append(entry)
    return {"class": label, "world": world.name, "oracle_images": oracle_n, "planted": planted, "findings": judged,
            "modes": modes, "false_findings": [f["finding_id"] for f in judged if not f["real"]]}
