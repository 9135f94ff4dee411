"""The report's layout in a real browser (headless Chromium, where installed): at 800 px the findings-at-a-glance
table stacks each finding's cells under its id and nothing is wider than the window; at 1,400 px it is a table."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sleuth.agent.cli import main

EXAMPLE = Path(__file__).resolve().parents[1] / "transcripts" / "investigate-fly-s0"
BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
PROBE = """<script>window.addEventListener('load', () => {
  const t = document.querySelector('table.summary'), row = t.querySelector('tbody tr');
  document.body.insertAdjacentHTML('beforeend', '<pre id="probe">' + [document.documentElement.scrollWidth,
    Math.round(t.getBoundingClientRect().width), getComputedStyle(row).display,
    Math.round(row.querySelector('.examples').getBoundingClientRect().right)].join(' ') + '</pre>');
});</script></body>"""


def layout(html: Path, width: int) -> tuple[int, int, str, int]:
    assert BROWSER is not None
    out = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--hide-scrollbars",
                          f"--window-size={width},1000", "--virtual-time-budget=5000", "--dump-dom",
                          html.as_uri()], capture_output=True, text=True, timeout=120)
    if out.returncode != 0 and "<html" not in out.stdout:  # installed, but it cannot start on this machine
        pytest.skip(f"{BROWSER} does not start here: {out.stderr.strip()[-300:]}")
    m = re.search(r'<pre id="probe">(\d+) (\d+) ([\w-]+) (\d+)</pre>', out.stdout)
    assert m, out.stderr[-2000:]
    return int(m.group(1)), int(m.group(2)), m.group(3), int(m.group(4))


@pytest.mark.skipif(BROWSER is None, reason="no Chromium on this machine")
def test_the_glance_table_stacks_at_800_px_and_is_a_table_at_1400(tmp_path, capsys):
    report = tmp_path / "report.html"
    assert main(["report", str(EXAMPLE), "-o", str(report), "--no-verify"]) == 0
    capsys.readouterr()
    probed = tmp_path / "probed.html"
    probed.write_text(report.read_text().replace("</body>", PROBE, 1))
    page, table, display, examples_right = layout(probed, 800)
    assert display == "grid" and page <= 800 and table <= 800 and examples_right <= 800
    page, table, display, examples_right = layout(probed, 1400)
    assert display == "table-row" and page <= 1400 and examples_right <= 1400


def test_image_lists_are_decoded_only_when_opened(tmp_path, capsys):
    report = tmp_path / "report.html"
    assert main(["report", str(EXAMPLE), "-o", str(report), "--no-verify"]) == 0
    capsys.readouterr()
    html = report.read_text()
    lists = re.findall(r"<details class='images'>.*?</details>", html, re.S)
    thumbs = [t for block in lists for t in re.findall(r"<img [^>]*>", block)]
    assert lists and thumbs and all('loading="lazy"' in t for t in thumbs)
    assert not any(" open" in block[:30] for block in lists)  # closed until the reader opens one
