"""`sleuth report`: one self-contained HTML file from a run directory (or a directory of runs).

``data`` reads the transcript into typed report models, ``plots`` draws them with matplotlib, ``html`` writes the
page (images and plots inline as data URIs, no script, no external resource: it works offline and can be mailed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sleuth.agent.report.data import ReportError, RunReport, find_transcripts, load_runs


def find_mitigations(path: str | Path) -> list[Path]:
    """``mitigation.json`` files of `sleuth mitigate` at ``path`` or one or two levels below it."""
    p = Path(path)
    if p.is_file():
        p = p.parent
    return sorted({*p.glob("mitigation.json"), *p.glob("*/mitigation.json"), *p.glob("*/*/mitigation.json")})


def build_report(path: str | Path, *, verify: bool = True, title: str | None = None) -> str:
    """The HTML of the run (or runs) under ``path``, and of any mitigation of them written there; ``ReportError``
    for a missing or untrustworthy transcript or mitigation."""
    from pydantic import ValidationError

    from sleuth.agent.mitigate import MitigationResult
    from sleuth.agent.report.html import render_report

    mitigations = []
    for m in find_mitigations(path):
        try:
            mitigations.append(MitigationResult.model_validate_json(m.read_text(encoding="utf-8")))
        except (OSError, ValidationError) as e:
            raise ReportError(f"{m}: not a mitigation result: {str(e).splitlines()[0]}") from None
    audit = audit_summary(path)
    if mitigations and not list(_transcripts(path)):
        runs = sorted({r for m in mitigations for r in m.runs})
        return render_report([r for run in runs for r in load_runs(run, verify=verify)], title=title,
                             mitigations=mitigations)
    return render_report(load_runs(path, verify=verify), title=title, mitigations=mitigations, audit=audit)


def audit_summary(path: str | Path) -> dict[str, Any] | None:
    """The ``summary.json`` of an audit at ``path`` (it states the audit's control across classes), if there is one
    that says so; summaries of older audits, without a stated family, are left out."""
    import json

    f = Path(path) / "summary.json"
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ReportError(f"{f}: not an audit summary: {e}") from None
    return data if isinstance(data, dict) and isinstance(data.get("audit_control"), dict) else None


def _transcripts(path: str | Path) -> list[Path]:
    try:
        return find_transcripts(path)
    except ReportError:
        return []


def default_output(path: str | Path) -> Path:
    """``RUN_DIR/report.html`` (beside the transcript when ``path`` is a transcript file)."""
    p = Path(path)
    return (p.parent if p.is_file() else p) / "report.html"


def write_report(path: str | Path, out: str | Path | None = None, *, verify: bool = True) -> Path:
    """Write the report of ``path`` to ``out`` (default ``default_output(path)``); returns the file written."""
    html = build_report(path, verify=verify)
    target = Path(out) if out is not None else default_output(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(target)
    return target


__all__ = ["ReportError", "RunReport", "build_report", "default_output", "find_mitigations", "find_transcripts",
           "load_runs", "write_report"]
