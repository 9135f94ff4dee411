"""The top of a report: one summary row per confirmed finding, the conclusion in parts, image grids collapsed, and
plot titles that keep the words in which findings differ."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sleuth.agent.planners.protocol_v1 import ProtocolV1Planner
from sleuth.agent.report import build_report, load_runs
from sleuth.agent.report.html import confusion_panels
from sleuth.agent.report.plots import short_caption
from sleuth.agent.report.summary import conclusion, effect, examples, finding_groups
from sleuth.agent.session import Session
from tests.fakeworld import fake_backends, new_session
from tests.test_report import CAT, Dom

ANSWER = ("Baseline for cat: 10/300 = 3.3% [1.8%, 6.0%]. 127 candidates screened on 5953 images; 30 tests, 24 "
          "supported, 17 confirmed. Confirmed findings, grouped by the wrong label: Failing as crab: 'a realistic "
          "photograph of a cat against a blue background.' 27x [17, inf] (also phrased 'a realistic photograph of a "
          "cat in a swamp.'). Failing as snow leopard: 'a realistic photograph of a cat. it is in the snow.' 21.6x "
          "[13.3, 34.8]; 'a realistic photograph of a cat in the mountains.' 12.3x [7.13, 21.2]. Searched for effects "
          "down to 2x the class rate; not reached: 1.5x (the images left cannot pay for more screening).")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Session:
    session = new_session(fake_backends(), tmp_path_factory.mktemp("runs") / "cat", budget=20_000)
    assert session.run(ProtocolV1Planner("cat", CAT, baseline_n=1000)).status == "completed"
    return session


def test_summary_comes_first_with_a_row_per_confirmed_finding(run: Session) -> None:
    html = build_report(run.run_dir)
    [report] = load_runs(run.run_dir)
    [f] = report.findings
    dom = Dom(html)
    [row] = dom.rows["summary"]
    text = " ".join(" ".join(row).split())
    r = effect(f)
    assert f.finding_id in text and "…cat. it is in the snow." in text
    assert f"{r.ratio:.3g}× [{r.low:.3g}, {r.high:.3g}]" in text  # the confirmation's, as the bar draws it
    assert f"{f.confirmation.hypothesis.k}/{f.confirmation.hypothesis.n}" in text
    assert "supported (adj. p" in text  # the counterfactual verdict
    # The bar: the interval's span and the estimate's tick inside it, on one log scale.
    bar = re.search(r"<div class='rbar'.*?</div>", html[html.index("table class='summary'"):]).group(0)  # type: ignore[union-attr]
    left, span = map(float, re.search(r"class='ci' style='left:([\d.]+)%;width:([\d.]+)%", bar).groups())  # type: ignore[union-attr]
    tick = float(re.search(r"class='pt' style='left:calc\(([\d.]+)%", bar).group(1))  # type: ignore[union-attr]
    assert 0 <= left < tick < left + span <= 100
    # Three example images of the finding, and the summary before the full findings table and every grid.
    summary = html[html.index("table class='summary'"):html.index("</table>", html.index("table class='summary'"))]
    shown = examples(report, f)
    # Failure images of the finding's caption (the fake world draws them alike: one distinct image), at most three.
    own = {x for g in finding_groups(report, f) if g.failures for x in g.refs}
    own |= {x.edited for p in report.pairs for x in p.flips if x.failed_after and p.after_caption == f.caption}
    assert 1 <= len(shown) <= 3 and set(shown) <= own and summary.count("<img ") == len(shown)
    assert html.index("table class='summary'") < html.index('table class="findings"') < html.index("class='grid'")


def test_image_grids_and_pairs_are_collapsed_under_their_finding(run: Session) -> None:
    html = build_report(run.run_dir)
    grids = re.findall(r"<details class='images'( open)?><summary>", html)
    assert grids and not any(grids)  # all closed
    assert html.count("class='grid'") == html.count("<details class='images'>") - html.count("class='pairs'")
    # The finding's own images come first, under its id and caption.
    first = html.index("<h3>Failure images</h3>")
    assert html.index("f1: …cat. it is in the snow.", first) < html.index("Other samples", first)


def test_the_conclusion_is_broken_into_parts() -> None:
    out = conclusion(ANSWER)
    dom = Dom(out)
    assert dom.tags["p"] == 2 and dom.tags["ul"] == 3  # the list of failure modes, one sub-list per mode
    items = re.findall(r"<li><b>(.*?)</b>", out)
    assert items == ["Failing as crab", "Failing as snow leopard"]
    assert out.count("<li>&#x27;a realistic") == 3  # one item per finding
    assert "Searched for effects" in out.split("</ul>")[-1]  # the closing sentence stands apart
    assert conclusion("snow </body> breaks cats") == ("<div class='answer'><h3>Conclusion</h3>"
                                                      "<p>snow &lt;/body&gt; breaks cats</p></div>")


def test_plot_titles_keep_the_words_that_differ(run: Session) -> None:
    fly = "a realistic photograph of a fly"
    assert short_caption(f"{fly} in a swamp", fly, 40) == "…fly in a swamp"
    long = f"{CAT}. the cat is grey. there is a person next to it. it is in the snow."
    cut = short_caption(long, CAT, 48)
    assert len(cut) <= 48 and cut.startswith("…cat. the cat is grey.") and cut.endswith("it is in the snow.")
    [report] = load_runs(Path(run.run_dir))
    titles = [p.title for p in confusion_panels(report)]
    assert titles and all("in the snow" in t for t in titles)
