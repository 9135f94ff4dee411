"""`sleuth report`: the HTML holds every finding and test with its numbers, embeds its images and plots, escapes
model text, reads audit directories, fails clearly on bad input, and renders in a real headless Chromium."""

from __future__ import annotations

import base64
import io
import json
import math
import os
import shutil
import subprocess
from collections.abc import Sequence
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sleuth.agent.cli import main
from sleuth.agent.events import Event, ToolCall, Usage, json_safe
from sleuth.agent.planners.protocol_v1 import ProtocolV1Planner
from sleuth.agent.planners.scripted import ScriptedPlanner
from sleuth.agent.report import build_report, load_runs, write_report
from sleuth.agent.report.data import HypothesisTest
from sleuth.agent.report.images import ImageEmbedder
from sleuth.agent.report.plots import forest_plot, plain
from sleuth.agent.runner import Turn
from sleuth.agent.session import Session
from sleuth.agent.transcript import read_transcript
from sleuth.tools import measure_rate, stats
from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.text import pv
from tests.fakeworld import fake_backends, new_session

CAT = "a realistic photograph of a cat"
HOSTILE = f'{CAT}. it is in the snow. <script>alert("x")</script> & $x^2$ </td></table>'
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Dom(HTMLParser):
    """Just enough of a DOM: body rows of tables by class, images, and a count of every tag."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.rows: dict[str, list[list[str]]] = {}
        self.images: list[dict[str, str]] = []
        self.tags: dict[str, int] = {}
        self.text: list[str] = []
        self._table: str | None = None
        self._body = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags[tag] = self.tags.get(tag, 0) + 1
        if tag == "table":
            self._table = a.get("class", "")
            self.rows.setdefault(self._table, [])
        elif tag == "tbody":
            self._body = True
        elif tag == "tr" and self._table is not None and self._body:
            self.rows[self._table].append([])
        elif tag == "img":
            self.images.append(a)

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table, self._body = None, False
        elif tag == "tbody":
            self._body = False

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._table is not None and self._body and self.rows[self._table]:
            self.rows[self._table][-1].append(data)

    def row_texts(self, table_class: str) -> list[str]:
        return [" ".join(r) for r in self.rows.get(table_class, [])]


def call(i: int, name: str, **arguments: object) -> ToolCall:
    return ToolCall(id=f"c{i}", name=name, arguments=arguments)


def _edit_step(events: Sequence[Event]) -> Turn:
    sample = next(e.result for e in events if e.kind == "tool_returned" and e.name == "generate_and_classify")
    refs = (sample["success_images"] + sample["failure_images"])[:4]
    return Turn(reasoning="Edit the same images into the snow.",
                tool_calls=[call(6, "edit_image", images=refs, source_caption=CAT, target_caption=HOSTILE)])


HOSTILE_SCRIPT = [
    Turn(reasoning="<b>Plan</b>: baseline first & then </pre> snow.", model="scripted",
         usage=Usage(prompt_tokens=1200, completion_tokens=80), cost_usd=0.0125,
         tool_calls=[call(1, "generate_and_classify", prompt=CAT, n=300)]),
    Turn(reasoning="Caption the failures.", tool_calls=[call(2, "caption_failures", measurement_id="m1")]),
    Turn(reasoning="Measure.", tool_calls=[call(3, "measure_rate", caption=HOSTILE, max_n=200)]),
    Turn(reasoning="Confirm.", tool_calls=[call(4, "measure_rate", caption=HOSTILE, confirm=True, max_n=200)]),
    Turn(reasoning="Perturb.", tool_calls=[call(5, "perturb_caption", caption=HOSTILE, types=["background"], n=2)]),
    _edit_step,
    Turn(reasoning="Record.", tool_calls=[call(7, "record_finding", caption=HOSTILE, discovery_test="t1",
                                               confirmation_test="t2", summary="<img src=x onerror=alert(1)>")]),
    Turn(reasoning="Done.", tool_calls=[call(8, "finish", summary="snow </body> breaks cats")]),
]


def _session(run_dir: Path, planner: object, budget: int = 20_000) -> Session:
    session = new_session(fake_backends(), run_dir, budget=budget)
    result = session.run(planner)  # type: ignore[arg-type]
    assert result.status == "completed"
    return session


@pytest.fixture(scope="module")
def protocol_run(tmp_path_factory: pytest.TempPathFactory) -> Session:
    """The protocol planner on the fake world: one confirmed finding (snow), refinements, counterfactuals."""
    return _session(tmp_path_factory.mktemp("runs") / "cat-protocol", ProtocolV1Planner("cat", CAT, baseline_n=1000))


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> Session:
    """A scripted run whose caption, summary and reasoning carry markup, quotes and mathtext."""
    return _session(tmp_path_factory.mktemp("runs") / "cat-hostile", ScriptedPlanner(HOSTILE_SCRIPT))


@pytest.fixture(scope="module")
def protocol_html(protocol_run: Session) -> str:
    return build_report(protocol_run.run_dir)


def _decode_png(src: str) -> Image.Image:
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix), src[:40]
    data = base64.b64decode(src[len(prefix):], validate=True)
    assert data.startswith(PNG_MAGIC)
    im = Image.open(io.BytesIO(data))
    im.load()
    assert im.format == "PNG"
    return im


def test_tables_hold_every_finding_and_test_with_its_numbers(protocol_run: Session, protocol_html: str) -> None:
    inv = protocol_run.investigation
    dom = Dom(protocol_html)
    events = read_transcript(protocol_run.transcript)
    assert len(dom.rows["findings"]) == sum(e.kind == "finding" for e in events) == len(inv.findings) == 1
    f = inv.findings[0]
    row = " ".join(dom.row_texts("findings")[0].split())
    d, c = f.discovery, f.confirmation
    for part in (f.caption, f"{d.hypothesis.k}/{d.hypothesis.n}", f"{d.baseline.k}/{d.baseline.n}",
                 f"{c.hypothesis.k}/{c.hypothesis.n}", pv(d.adjusted_p), pv(c.adjusted_p),
                 f"{d.rate_ratio.ratio:.3g}"):
        assert part in row, (part, row)
    # Every measure_rate test is a row, with the p-value adjusted over the final family (as the run ends with).
    tests = dom.row_texts("tests")
    assert len(tests) == len(inv.tests) == 12
    [run] = load_runs(protocol_run.run_dir)
    assert [t.test_id for t in run.tests] == [t.id for t in inv.tests]
    for ours, theirs in zip(run.tests, inv.tests):
        assert ours.adjusted_p == pytest.approx(theirs.adjusted_p, rel=1e-12)
        assert (ours.hypothesis.k, ours.hypothesis.n, ours.baseline.k, ours.baseline.n) == \
            (theirs.k1, theirs.n1, theirs.k0, theirs.n0)
    # The budget is rebuilt from the tool results and matches what the investigation spent: 4990 images generated,
    # 100 edited and sham-edited at one image each.
    assert run.budget.images_used == inv.budget.used == 5190 and inv.budget.editing == 200
    assert "5,190 of 20,000" in protocol_html


def test_images_and_plots_are_embedded_png(protocol_html: str) -> None:
    dom = Dom(protocol_html)
    plots = [i for i in dom.images if i.get("class") == "plot"]
    assert sorted(i["data-plot"] for i in plots) == ["confusion", "forest"]
    thumbs = [i for i in dom.images if i.get("class") == "thumb"]
    assert len(thumbs) >= 20
    for img in dom.images:
        im = _decode_png(img["src"])
        if img.get("class") == "plot":
            assert (int(img["width"]), int(img["height"])) == im.size
            assert np.asarray(im.convert("L")).std() > 10  # a drawing, not an empty canvas
    # Self-contained: no script, no stylesheet link, nothing fetched from anywhere.
    assert dom.tags.get("script", 0) == 0 and dom.tags.get("link", 0) == 0
    assert "http://" not in protocol_html and "https://" not in protocol_html
    assert 'src="data:' in protocol_html and "src='" not in protocol_html


def test_tree_shows_how_the_finding_was_derived(protocol_run: Session) -> None:
    [run] = load_runs(protocol_run.run_dir)
    [root] = run.tree
    assert root.caption == CAT and root.relation == "class prompt"
    nodes = list(root.walk())
    # Every measured caption is in the tree exactly once, with all of its tests.
    measured = {t.caption for t in run.tests}
    assert sorted(n.caption for n in nodes if n.tests) == sorted(measured)
    assert sorted(tid for n in nodes for tid in n.tests) == sorted(t.test_id for t in run.tests)
    finding = next(n for n in nodes if n.finding_id == "f1")
    assert finding.caption == f"{CAT}. it is in the snow."
    kinds = {(run.tests[int(t[1:]) - 1].purpose, run.tests[int(t[1:]) - 1].mode) for t in finding.tests}
    assert kinds == {("discovery", "sample"), ("discovery", "counterfactual"), ("confirmation", "sample")}
    # The finding is the refinement of the two-sentence caption it came from ...
    assert finding.relation.startswith("refinement")
    parent = next(n for n in nodes if finding in n.children)
    assert parent.caption.startswith(f"{CAT}. it is in the snow. it is daytime") and parent in root.children
    # ... and the same hypothesis as a perturbation of the class prompt is a child of the root.
    perturbed = next(n for n in root.children if n.caption == f"{CAT} in the snow.")
    assert perturbed.relation == "background: + in the snow" and perturbed.tests


def test_model_text_is_escaped_and_counterfactuals_are_paired(hostile_run: Session) -> None:
    html = build_report(hostile_run.run_dir)
    dom = Dom(html)
    assert dom.tags.get("script", 0) == 0 and "<script" not in html and "onerror=alert" not in html.replace(
        "&lt;img src=x onerror=alert(1)&gt;", "")
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; $x^2$ &lt;/td&gt;&lt;/table&gt;" in html
    assert "&lt;b&gt;Plan&lt;/b&gt;" in html and "&lt;/pre&gt;" in html
    # Markup in a caption cannot close the table early: the row keeps its cells and the caption its text.
    [row] = dom.rows["findings"]
    assert HOSTILE in "".join(row) and "yes" in row
    # Plots are drawn though the caption holds '$...$' (matplotlib mathtext).
    assert sorted(i["data-plot"] for i in dom.images if i.get("class") == "plot") == ["confusion", "forest"]
    [run] = load_runs(hostile_run.run_dir)
    [pairs] = run.pairs
    assert pairs.source.startswith("edit_image") and pairs.after_caption == HOSTILE and len(pairs.flips) == 4
    shown = [i for i in dom.images if i.get("title") in ("before", "after")]
    assert len(shown) == 8
    assert run.budget.prompt_tokens == 1200 and run.budget.cost_usd == pytest.approx(0.0125)
    assert run.budget.images_used == hostile_run.investigation.budget.used
    assert "$0.0125" in html


def test_audit_directory_gets_one_section_per_run(protocol_run: Session, hostile_run: Session,
                                                  tmp_path: Path) -> None:
    audit = tmp_path / "audit"
    shutil.copytree(protocol_run.run_dir, audit / "cat")
    shutil.copytree(hostile_run.run_dir, audit / "dog" / "run-1")
    (audit / "audit.json").write_text("{}")
    assert main(["report", str(audit)]) == 0
    dom = Dom((audit / "report.html").read_text())
    assert len(dom.rows["overview"]) == 2
    assert dom.tags["section"] == 2 and len(dom.rows["findings"]) == 2
    assert sum(1 for i in dom.images if i.get("class") == "plot") == 4


def test_cli_writes_the_default_file_and_reports_bad_input_in_one_line(protocol_run: Session, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(protocol_run.run_dir, run_dir)
    assert main(["report", str(run_dir)]) == 0
    assert (run_dir / "report.html").stat().st_size > 10_000
    out = tmp_path / "elsewhere" / "r.html"
    assert main(["report", str(run_dir / "transcript.jsonl"), "-o", str(out)]) == 0 and out.is_file()
    capsys.readouterr()
    lines = (run_dir / "transcript.jsonl").read_text().splitlines(keepends=True)
    lines[3] = lines[3].replace('"ok":true', '"ok":false', 1)
    (run_dir / "transcript.jsonl").write_text("".join(lines))
    (tmp_path / "empty").mkdir()
    for args, message in [([str(tmp_path / "nope")], "no such file or directory"),
                          ([str(tmp_path / "empty")], "no transcript.jsonl"),
                          ([str(run_dir)], "line 4: hash mismatch"),
                          ([str(run_dir), "-o", str(tmp_path)], "is a directory")]:
        assert main(["report", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert main(["report", str(run_dir), "--no-verify"]) == 0


def test_non_finite_ratios_in_transcripts_read_back_as_inf_and_nan(protocol_run: Session) -> None:
    """JSON has no inf: a transcript spells an infinite or undefined rate ratio as a string, read back as a float."""
    result = next(e.result for e in read_transcript(protocol_run.transcript)
                  if e.kind == "tool_returned" and e.name == "measure_rate")
    assert result is not None and result["mode"] == "sample"
    k1, n1 = result["hypothesis"]["failures"]["k"], result["hypothesis"]["failures"]["n"]
    n0 = result["baseline"]["n"]
    infinite = stats.rate_ratio(k1, n1, 0, n0)
    zero = json.loads(json.dumps(json_safe({**result, "baseline": stats.binomial_rate(0, n0).model_dump(),
                                            "rate_ratio": infinite.model_dump()})))
    assert zero["rate_ratio"]["ratio"] == "Infinity" and zero["rate_ratio"]["high"] == "Infinity"
    r = measure_rate.Result.model_validate(zero)
    assert r.rate_ratio == infinite and math.isinf(r.rate_ratio.ratio)
    undefined = json.loads(json.dumps(json_safe(stats.rate_ratio(0, 10, 0, 10).model_dump())))
    assert undefined["ratio"] == "NaN"
    rr = stats.RatioCI.model_validate(undefined)
    assert math.isnan(rr.ratio) and rr.low == 0.0 and math.isinf(rr.high)


def test_results_that_do_not_fit_are_named_not_fatal(written: tuple[Path, list[object]]) -> None:
    path, _ = written
    [run] = load_runs(path)
    assert run.label == "cat" and run.status == "completed" and run.budget.tool_errors == 1
    assert run.budget.prompt_tokens == 10 and run.budget.cost_usd == pytest.approx(0.0012)
    assert any(w.startswith("line 5 (measure_rate): skipped") for w in run.warnings)
    assert any(w.startswith("line 7 (finding): skipped") for w in run.warnings)
    html = build_report(path)
    assert "No finding was confirmed" in html and "line 5 (measure_rate): skipped" in html


def test_forest_plot_copes_with_zero_counts_and_mathtext() -> None:
    base = stats.binomial_rate(0, 100)

    def row(tid: str, k1: int, k0: int, caption: str) -> HypothesisTest:
        rr = stats.rate_ratio(k1, 100, k0, 100)
        return HypothesisTest(test_id=tid, seq=0, caption=caption, purpose="discovery", mode="sample",
                       hypothesis=stats.binomial_rate(k1, 100), baseline=base, rate_ratio=rr, p_value=0.01,
                       adjusted_p=0.02, adjusted_p_at_test=0.02, adjust_method="holm", verdict="supported")

    rows = [row("t1", 30, 0, "a cat $in$ snow"), row("t2", 0, 5, "a cat"), row("t3", 0, 0, "a cat \\ odd")]
    assert math.isinf(rows[0].rate_ratio.ratio) and rows[1].rate_ratio.ratio == 0
    png = forest_plot(rows, "a cat")
    assert png is not None and png.startswith(PNG_MAGIC)
    assert forest_plot(rows, "a cat") == png  # deterministic bytes
    assert forest_plot([], None) is None
    assert plain("$5 and $6") == r"\$5 and \$6"


def test_large_images_are_embedded_as_thumbnails(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    big = store.put_image(np.random.default_rng(0).integers(0, 255, (512, 384, 3), dtype=np.uint8))
    small = store.put_image(np.zeros((64, 64, 3), np.uint8))
    emb = ImageEmbedder(tmp_path, max_side=160)
    b, s = emb.get(big), emb.get(small)
    assert b is not None and (b.width, b.height) == (120, 160) and _decode_png(b.uri).size == (120, 160)
    assert s is not None and base64.b64decode(s.uri.split(",", 1)[1]) == store.get_bytes(small)
    assert emb.get("0" * 64) is None and emb.missing == ["0" * 64]


# -- a real browser -------------------------------------------------------------------------------------------

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WINDOW = (1280, 2600)
# Appended to a copy of the report only: writes where the plots and the findings rows were laid out.
PROBE = """<script>
const rect = e => { const r = e.getBoundingClientRect();  // the content box: borders excluded
  return [r.left + e.clientLeft, r.top + e.clientTop, e.clientWidth, e.clientHeight]; };
const out = {scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth,
             plots: [...document.querySelectorAll('img.plot')].map(e => [e.dataset.plot, rect(e), e.complete,
             e.naturalWidth]), rows: [...document.querySelectorAll('table.findings tbody tr')].map(rect)};
const pre = document.createElement('pre'); pre.id = 'layout'; pre.style.display = 'none';
pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
</script>"""


def chromium() -> str | None:
    explicit = os.environ.get("SLEUTH_CHROMIUM")
    if explicit:
        return explicit
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


def _browse(binary: str, profile: Path, *args: str,
            window: tuple[int, int] = WINDOW) -> subprocess.CompletedProcess[str]:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--force-device-scale-factor=1",
             "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}",
             f"--window-size={window[0]},{window[1]}"]
    return subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=120, check=False)


def test_report_renders_in_headless_chromium(protocol_run: Session, tmp_path: Path) -> None:
    binary = chromium()
    if binary is None:
        if os.environ.get("SLEUTH_REQUIRE_CHROMIUM"):
            pytest.fail("SLEUTH_REQUIRE_CHROMIUM is set but no chromium binary was found")
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium; or set SLEUTH_CHROMIUM)")
    report = write_report(protocol_run.run_dir, tmp_path / "report.html")
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    dumped = _browse(binary, tmp_path / "profile-1", "--dump-dom", probe.as_uri())
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = Dom(dumped.stdout)
    # The browser's own DOM has the findings table with one row per finding.
    rows = dom.row_texts("findings")
    assert len(rows) == len(protocol_run.investigation.findings) == 1
    assert protocol_run.investigation.findings[0].caption in rows[0]
    start = dumped.stdout.index('<pre id="layout"')
    layout = json.loads(Dom(dumped.stdout[start:dumped.stdout.index("</pre>", start) + 6]).text[0])
    assert [p[0] for p in layout["plots"]] == ["forest", "confusion"]
    shot = tmp_path / "shot.png"
    done = _browse(binary, tmp_path / "profile-2", f"--screenshot={shot}", probe.as_uri())
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    page = np.asarray(Image.open(shot).convert("RGB"), dtype=np.float64)
    assert page.shape[:2] == (WINDOW[1], WINDOW[0])
    sources = {i["data-plot"]: _decode_png(i["src"]) for i in Dom(report.read_text()).images
               if i.get("class") == "plot"}
    for kind, (x, y, w, h), complete, natural in layout["plots"]:
        assert complete and natural > 0, f"the {kind} plot did not load"
        assert y + h <= WINDOW[1] and w > 200 and h > 150, (kind, x, y, w, h)
        region = page[round(y) + 2:round(y + h) - 2, round(x) + 2:round(x + w) - 2]
        assert region.std() > 20, f"the {kind} plot region is blank"
        # What the browser painted there is the plot itself, not some other content.
        expected = np.asarray(sources[kind].convert("RGB").resize((round(w), round(h))), dtype=np.float64)
        expected = expected[2:round(h) - 2, 2:round(w) - 2]
        assert np.corrcoef(region.ravel(), expected.ravel())[0, 1] > 0.9, kind
    for x, y, w, h in layout["rows"]:
        assert page[round(y):round(y + h), round(x):round(x + w)].std() > 10  # the row's text was painted


@pytest.mark.parametrize("width", [800, 1400])
def test_report_does_not_scroll_sideways(protocol_run: Session, hostile_run: Session, tmp_path: Path,
                                         width: int) -> None:
    """Wide tables scroll inside their own box; the page itself never scrolls sideways."""
    binary = chromium()
    if binary is None:
        if os.environ.get("SLEUTH_REQUIRE_CHROMIUM"):
            pytest.fail("SLEUTH_REQUIRE_CHROMIUM is set but no chromium binary was found")
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium; or set SLEUTH_CHROMIUM)")
    for i, run in enumerate((protocol_run, hostile_run)):
        report = write_report(run.run_dir, tmp_path / f"report{i}.html")
        probe = tmp_path / f"probe{i}.html"
        probe.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
        dumped = _browse(binary, tmp_path / f"profile-{i}", "--dump-dom", probe.as_uri(), window=(width, 1200))
        assert dumped.returncode == 0, dumped.stderr[-2000:]
        start = dumped.stdout.index('<pre id="layout"')
        layout = json.loads(Dom(dumped.stdout[start:dumped.stdout.index("</pre>", start) + 6]).text[0])
        assert layout["innerWidth"] == width
        assert layout["scrollWidth"] <= width, (run.run_dir.name, layout["scrollWidth"])
