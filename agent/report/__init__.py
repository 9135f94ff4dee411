"""`sleuth report`: one self-contained HTML file from a run directory (or a directory of runs).

``data`` reads the transcript into typed report models, ``plots`` draws them with matplotlib, ``html`` writes the
page (images and plots inline as data URIs, no script, no external resource: it works offline and can be mailed).
"""

from __future__ import annotations

from pathlib import Path

from sleuth.agent.report.data import ReportError, RunReport, find_transcripts, load_runs


def build_report(path: str | Path, *, verify: bool = True, title: str | None = None) -> str:
    """The HTML of the run (or runs) under ``path``; ``ReportError`` for a missing or untrustworthy transcript."""
    from sleuth.agent.report.html import render_report

    return render_report(load_runs(path, verify=verify), title=title)


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


__all__ = ["ReportError", "RunReport", "build_report", "default_output", "find_transcripts", "load_runs",
           "write_report"]
