"""A job with nothing injected reads as one: its diagnosis is headed by what the verdict says
(healthy; no straggler stands out; why the job straggles only where a finding names a straggler), a
finding whose evidence says no link stands out carries no pattern of one slow link, the heatmap
outlines only workers beyond the job's noise, and colour scales of slowdowns start at 1.0."""

from __future__ import annotations

import dataclasses
import io
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from laggard.analysis.pipeline import analyze
from laggard.errors import LaggardError, LaggardWarning
from laggard.io import load_job
from laggard.report import plots
from laggard.report.findings import PATTERN, findings_html, heading, pattern, print_findings
from laggard.report.heatmap import OutlineConfig, outlined_workers, standing_out, worker_grid
from laggard.report.html import render_html
from laggard.results.analysis import Analysis
from laggard.results.diagnosis import Diagnosis, Finding

CORPUS = Path(__file__).parents[1] / "data" / "corpus"
DASHBOARD = Path(__file__).parents[2] / "src" / "laggard" / "monitor" / "dashboard.html"
STRAGGLES = "Diagnosis: why this job straggles"
NO_STRAGGLER = "Diagnosis: no straggler stands out"


def _analyze(job: str) -> Analysis:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        return analyze(load_job(CORPUS / job / "trace"))


@pytest.fixture(scope="module")
def tail_job() -> Analysis:
    """A clean dp 1 x pp 3 demo job (tests/data/corpus/README.md): the slow tail every link shares."""
    return _analyze("job057")


@pytest.fixture(scope="module")
def demo_job() -> Analysis:
    """A clean dp 2 x pp 2 demo job, the layout of `make demo`: a low-confidence op type, no rank."""
    return _analyze("c26gc_job028")


def _terminal(res: Analysis) -> str:
    con = Console(width=100, record=True, file=io.StringIO(), highlight=False)
    print_findings(res, con)
    return con.export_text()


def _h2(page: str) -> list[str]:
    return re.findall(r"<h2>([^<]*)", page)


def test_clean_tail_is_no_straggler(tail_job: Analysis) -> None:
    d = tail_job.diagnosis
    assert d is not None and d.verdict == "straggling" and d.findings, d
    f = d.findings[0]
    assert f.cause == "comm" and f.everywhere and "no link stands out" in f.evidence, f
    page = render_html(tail_job)
    assert NO_STRAGGLER in _h2(page) and STRAGGLES not in page
    assert "no rank, stage or link is slow beyond the job&#x27;s noise" in page
    # the pattern line says what the evidence says: no one link, not "slow transfers on one link"
    assert PATTERN["comm"] not in page
    assert "pattern: the same slow tail on many links and ranks alike: no one link or group stands out" in page
    text = _terminal(tail_job)
    assert "verdict: straggling, but no straggler stands out" in text
    assert "no rank, stage or link is slow" in re.sub(r"\s+", " ", text)


def test_clean_demo_layout_is_no_straggler(demo_job: Analysis) -> None:
    d = demo_job.diagnosis
    assert d is not None and d.verdict == "straggling" and d.findings, d
    assert all(f.confidence == "low" and not f.localized for f in d.findings), d.findings
    page = render_html(demo_job)
    assert NO_STRAGGLER in _h2(page) and STRAGGLES not in page
    # its workers' S_w differ by a few thousandths: none is outlined, and the lead says so
    assert not re.findall(r'id="(?:heat|stepheat)-hot-[^"]+"', page)
    assert "Outlined: none, since no worker stands out from the others beyond the job&#x27;s noise" in page


def test_healthy_and_straggler_headings(ar: Analysis) -> None:
    healthy = _analyze("job009")  # a clean dp 1 x pp 4 demo job that stays healthy
    assert healthy.diagnosis is not None and healthy.diagnosis.verdict == "healthy"
    assert _h2(findings_html(healthy)) == ["Diagnosis: healthy"]
    # a slow worker is a straggler: the heading keeps why the job straggles, the terminal its verdict
    assert _h2(findings_html(ar)) == [STRAGGLES]
    assert "verdict: straggling\n" in _terminal(ar)


def test_words_follow_the_findings_not_the_trace(st: Analysis) -> None:
    """The same wording rule on made-up findings: a job-wide tail is no straggler; a named link is."""
    tail = Finding(cause="comm", evidence="transfers on 4 links share the same slow tail; no link stands out")
    link = Finding(cause="comm", workers=[{"rank": 1, "dp_rank": 0, "stage": 1}], evidence="a slow link")
    assert pattern(tail) != PATTERN["comm"] and "no one link" in pattern(tail)
    assert pattern(link) == PATTERN["comm"]
    for found, title in (([tail], NO_STRAGGLER), ([tail, link], STRAGGLES)):
        d = Diagnosis(verdict="straggling", threshold=1.05, findings=found)
        assert heading(d) == title
        assert _h2(findings_html(dataclasses.replace(st, diagnosis=d))) == [title]
    assert heading(Diagnosis(verdict="cannot judge", threshold=1.05, findings=[],
                             reason="x")) == "Diagnosis: cannot judge"


def test_outline_rule_on_a_small_matrix() -> None:
    grid = np.full((2, 2), 1.07)
    grid[1, 1] = 1.08
    assert not standing_out(grid).any()  # a 1.08 among 1.07s is noise
    grid[1, 1] = 1.6
    assert standing_out(grid).tolist() == [[False, False], [False, True]]
    # no worker in a cell (NaN) is no yardstick; one slow worker of two still stands out
    assert standing_out(np.array([[1.0, np.nan], [1.6, np.nan]])).tolist() == [[False, False], [True, False]]
    assert not standing_out(np.array([1.6])).any()
    # the bar is the config's: at 60 robust sigmas (a floor of 1%) a 1.6 among 1.07s is within it
    assert not standing_out(grid, OutlineConfig(mad_k=60.0)).any()
    with pytest.raises(LaggardError, match="OutlineConfig.noise_floor"):
        OutlineConfig(noise_floor=0.0)


def test_heatmap_outlines_only_beyond_noise(st: Analysis) -> None:
    def job(slowdowns: list[float]) -> Analysis:
        workers = [{"dp_rank": i % 2, "stage": i // 2, "rank": i, "slowdown": s} for i, s in enumerate(slowdowns)]
        workers.sort(key=lambda w: -w["slowdown"])
        return dataclasses.replace(st, by_worker=workers, fixed_workers=[workers[0]["rank"]], diagnosis=None,
                                   by_dp_rank={0: 1.0, 1: 1.0}, by_stage={0: 1.0, 1: 1.0}, num_workers=4)

    noise = job([1.07, 1.07, 1.07, 1.08])
    assert outlined_workers(noise) == [] and worker_grid(noise).highlight == []
    slow = job([1.07, 1.07, 1.07, 1.6])
    assert [w["rank"] for w in outlined_workers(slow)] == [3] and worker_grid(slow).highlight == [(1, 1)]


def test_colour_scale_starts_at_one() -> None:
    lo, hi = plots.heat_range([1.115, 1.149])
    assert lo == plots.HEAT_LO == 1.0 and hi == pytest.approx(1.0 + plots.MIN_SPAN)
    assert plots.heat_range([0.9, 2.4]) == (1.0, 2.4)  # values under 1 are noise; the scale stretches up only
    # a mild slowdown everywhere reads pale: in the first third of the scale, not its red end
    for v in (1.115, 1.149):
        assert (v - lo) / (hi - lo) < 1 / 3
    svg = plots.heatmap_svg(np.array([[1.115, 1.149]]), ["dp 0"], ["0", "1"], cell_ids=[["a", "b"]], prefix="t")
    fills = re.findall(r'<g id="t-[ab]">\s*<path [^>]*style="fill: (#[0-9a-f]{6})', svg)
    assert len(fills) == 2 and plots.heat_colour(1.149, hi) in fills
    assert all(plots.text_on(c) == plots.INK for c in fills)  # pale: dark text on them


def test_dashboard_scale_is_the_reports() -> None:
    js = DASHBOARD.read_text(encoding="utf-8")
    m = re.search(r"const HEAT_LO = ([\d.]+), MIN_SPAN = ([\d.]+);", js)
    assert m and float(m.group(1)) == plots.HEAT_LO and float(m.group(2)) == plots.MIN_SPAN
    assert "lo = Math.min(...vals)" not in js
