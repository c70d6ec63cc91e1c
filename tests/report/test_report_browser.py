"""The HTML reports of the published traces in a real browser (headless Debian Chromium through
Playwright, ``laggard.report.browser``): the heatmaps, the step timeline and the findings are
rendered (present, visible, non-zero size). Screenshots are kept as test artefacts in the directory
printed (``LAGGARD_SCREENSHOTS`` to choose it)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from laggard.report.browser import find_chromium
from laggard.report.html import write_report
from laggard.results.analysis import Analysis

EXE, WHY = find_chromium()
pytestmark = pytest.mark.skipif(EXE is None, reason=f"no headless Chromium: {WHY}")

# what must be on screen: selector -> the least count of visible, non-empty elements
EXPECTED = {
    "#findings table.findings tbody tr": 1,
    "#workers-heatmap svg": 1,
    "#stepheat-svg": 1,
    "#stepheat-svg g.row": 1,
    "#timeline-svg": 1,
    "#timeline-svg text.lane": 2,
    "#perfetto-link": 1,
}


@pytest.fixture(scope="module")
def page():
    from laggard.report.browser import open_page

    with open_page() as p:
        yield p


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = Path(os.environ["LAGGARD_SCREENSHOTS"]) if os.environ.get("LAGGARD_SCREENSHOTS") else \
        tmp_path_factory.mktemp("screenshots")
    d.mkdir(parents=True, exist_ok=True)
    print(f"\nreport screenshots: {d}")
    return d


def problems(page, url: str) -> list[str]:
    """What is missing or invisible on the report at ``url`` (empty when all is rendered)."""
    page.goto(url)
    page.wait_for_load_state("load")
    out = []
    for sel, least in EXPECTED.items():
        boxes = [el.bounding_box() for el in page.query_selector_all(sel) if el.is_visible()]
        sized = [b for b in boxes if b and b["width"] > 0 and b["height"] > 0]
        if len(sized) < least:
            out.append(f"{sel}: {len(sized)} visible with a size (want >= {least})")
    return out


@pytest.mark.parametrize("name", ["AR", "ST"])
def test_report_renders_in_chromium(name: str, analyses: dict[str, Analysis], page, shots: Path,
                                    tmp_path: Path) -> None:
    res = analyses[name]
    html, _ = write_report(res, tmp_path / f"{name}.html")
    assert problems(page, html.resolve().as_uri()) == []
    # the DP x stage heatmap draws one cell per worker; the step heatmap and timeline one row/lane each
    assert len(page.query_selector_all("#workers-heatmap [id^='heat-cell-']")) == res.num_workers
    assert len(page.query_selector_all("#stepheat-svg g.row")) == res.num_workers
    assert len(page.query_selector_all("#timeline-svg text.lane")) == 2 * res.num_workers
    outline = page.query_selector("[id^='stepheat-hot-']")
    assert outline is not None and outline.bounding_box()["height"] > 0
    page.screenshot(path=str(shots / f"report-{name}.png"), full_page=True)
    page.query_selector("#step-timeline").screenshot(path=str(shots / f"timeline-{name}.png"))
    assert (shots / f"report-{name}.png").stat().st_size > 50_000


def test_a_report_without_the_heatmap_fails_the_check(analyses: dict[str, Analysis], page,
                                                      tmp_path: Path) -> None:
    """The check itself can fail: the same report with its step heatmap cut out is caught."""
    html, _ = write_report(analyses["ST"], tmp_path / "ST.html")
    text = html.read_text(encoding="utf-8")
    broken = tmp_path / "broken.html"
    broken.write_text(re.sub(r'<svg class="chart-svg stepheat".*?</svg>', "", text, flags=re.S), encoding="utf-8")
    found = problems(page, broken.resolve().as_uri())
    assert any(p.startswith("#stepheat-svg") for p in found), found
