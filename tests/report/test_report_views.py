"""The report's drill-down views: per-worker x per-step heatmap, the worst step's timeline, the
Perfetto link, every worker listed, the glossary tooltips. Ground truth comes from the published
traces themselves (read here with pyarrow, not through laggard) and from what the paper says was
injected: AR slowed one worker (rank 0, dp0/pp0), ST has a heavy last stage (stage 3)."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from laggard.report.html import perfetto_beside, render_html, write_report
from laggard.report.stepheat import step_grid
from laggard.report.timeline import worst_step
from laggard.results.analysis import Analysis

COMM = ("send", "recv", "gather", "reduce")  # NDTimeline op names of transfers and collectives


def _raw_step(nd_dir: Path, name: str, step: int):
    t = pq.read_table(nd_dir / f"trace-{name}.parquet").to_pandas()
    return t[t.step == step]


def test_step_heatmap_ar_slow_worker_every_step(ar: Analysis) -> None:
    g = step_grid(ar)
    assert g is not None and g.values.shape == (16, len(ar.steps))
    hottest = {g.ranks[int(i)] for i in np.argmax(g.values, axis=0)}
    assert hottest == {0}  # the slowed worker is the hottest cell of every step
    page = render_html(ar)
    assert re.findall(r'id="stepheat-hot-([^"]+)"', page) == ["rank-0"]
    assert 'data-rows="16"' in page and f'data-cols="{len(ar.steps)}"' in page


def test_step_heatmap_st_outlines_the_stage(st: Analysis) -> None:
    page = render_html(st)
    assert re.findall(r'id="stepheat-hot-([^"]+)"', page) == ["stage-3"]
    g = step_grid(st)
    assert g is not None
    rows = [r for r, s in enumerate(g.stage) if s == 3]
    assert rows == [len(g.stage) - 2, len(g.stage) - 1]  # one block at the bottom (sorted by stage)
    # the heavy stage is hotter than every other stage in most steps
    other = np.array([s != 3 for s in g.stage])
    assert (g.values[~other].min(axis=0) > g.values[other].max(axis=0)).mean() > 0.9


def test_timeline_matches_the_raw_trace(ar: Analysis, nd_dir: Path) -> None:
    step = worst_step(ar)
    assert step == max(ar.per_step, key=ar.per_step.get)
    page = render_html(ar)
    svg = re.search(r'<svg class="chart-svg timeline"[^>]*>', page)
    assert svg is not None
    attrs = dict(re.findall(r'(data-[\w-]+)="([^"]*)"', svg.group(0)))
    assert int(attrs["data-step"]) == step and attrs["data-lanes"] == "16"
    raw = _raw_step(nd_dir, "AR", step)
    span = float((raw.start_ts + raw.duration).max() - raw.start_ts.min())
    assert float(attrs["data-measured-s"]) == pytest.approx(span, rel=1e-3)
    assert float(attrs["data-ideal-s"]) == pytest.approx(ar.step_ideal_s[ar.steps.index(step)], rel=1e-4)
    assert float(attrs["data-ideal-s"]) < 0.6 * span  # the slowed worker doubles the step
    lanes = {(p, int(r)): (float(c), float(w)) for p, r, c, w in re.findall(
        r'class="lane" data-panel="(\w+)" data-rank="(\d+)" data-compute-s="([^"]+)" data-wait-s="([^"]+)"', page)}
    assert len(lanes) == 32
    # compute per lane as traced: rank 0 against a peer of its stage, from the parquet directly
    comp = raw[~raw.optype.str.contains("|".join(COMM))].groupby("rank").duration.sum()
    assert lanes["measured", 0][0] / lanes["measured", 4][0] == pytest.approx(comp[0] / comp[4], rel=0.02)
    # the others wait for it: their waiting time dwarfs rank 0's
    assert lanes["measured", 4][1] > 5 * lanes["measured", 0][1]
    # in the ideal replay rank 0 computes like its peers
    assert lanes["ideal", 0][0] == pytest.approx(lanes["ideal", 4][0], rel=0.05)


def test_every_worker_listed_and_collapsed(ar: Analysis) -> None:
    page = render_html(ar)
    sec = page[page.index('id="worst-workers"'):page.index('id="warnings"')]
    open_part, _, more = sec.partition("<details")
    ranks_open = re.findall(r"<tr><td>\d+<td>(\d+)<", open_part)
    ranks_more = re.findall(r"<tr><td>\d+<td>(\d+)<", more)
    assert len(ranks_open) == 12 and len(ranks_more) == 4
    assert sorted(map(int, ranks_open + ranks_more)) == sorted(w["rank"] for w in ar.by_worker)
    assert "the other 4 workers" in more


def test_tooltips_explain_out_of_range_shares(st: Analysis, ar: Analysis) -> None:
    assert st.M_S > 1.0 and ar.M_S < 0  # 121.9% and -0.1% on the published traces
    page = render_html(st)
    titles = [unescape(t) for t in re.findall(r'title="([^"]+)"', page)]
    ms = [t for t in titles if t.startswith("The share of the slowdown (T - T_ideal) that goes away when the last")]
    assert ms and "Over 100%" in ms[0] and "Negative" in ms[0]
    assert any(t.startswith("Worker slowdown") for t in titles)  # S_w
    assert any("worst 3% of workers" in t for t in titles)  # M_W
    kpi = re.search(r"M_S: last stage explains.*?kpi-sub\">(.*?)</div>", page, re.S)
    assert kpi and "more than all of it" in kpi.group(1)
    ar_page = render_html(ar)
    kpi = re.search(r"M_S: last stage explains.*?kpi-sub\">(.*?)</div>", ar_page, re.S)
    assert kpi and "within noise" in kpi.group(1)
    assert "hot in the S_w heatmap" not in page + ar_page


def test_perfetto_written_beside_and_linked(st: Analysis, tmp_path: Path) -> None:
    html, trace = write_report(st, tmp_path / "r.html")
    assert trace == perfetto_beside(html) == tmp_path / "r.perfetto.json.gz" and trace.stat().st_size > 10_000
    page = html.read_text(encoding="utf-8")
    assert 'id="perfetto-link" href="r.perfetto.json.gz"' in page and "ui.perfetto.dev" in page
    own = tmp_path / "elsewhere" / "t.json"
    own.parent.mkdir()
    own.write_text("{}")
    html2, trace2 = write_report(st, tmp_path / "sub" / "r2.html", perfetto=own)
    assert trace2 == own and not perfetto_beside(html2).exists()
    assert 'href="../elsewhere/t.json"' in html2.read_text(encoding="utf-8")


def test_cli_html_writes_the_trace_beside(nd_dir: Path, tmp_path: Path) -> None:
    from laggard.cli.base import main

    html = tmp_path / "r.html"
    assert main(["analyze", str(nd_dir / "trace-ST.parquet"), "--html", str(html), "-q"]) == 0
    assert (tmp_path / "r.perfetto.json.gz").exists()
    blocked = tmp_path / "b.html"
    (tmp_path / "b.perfetto.json.gz").mkdir()  # the trace's place is taken by a directory: exit 2 before work
    assert main(["analyze", str(nd_dir / "trace-ST.parquet"), "--html", str(blocked), "-q"]) == 2
    assert not blocked.exists()


def test_reports_stay_small(ar: Analysis, st: Analysis) -> None:
    assert len(render_html(ar).encode()) < 260_000
    assert len(render_html(st).encode()) < 200_000


def test_thousand_workers_stay_readable(tmp_path: Path) -> None:
    from laggard.analysis.pipeline import analyze
    from laggard.groundtruth.inject import parse_injections
    from laggard.groundtruth.synth import SynthConfig, synthesize

    job = synthesize(SynthConfig(dp=256, pp=4, steps=3, microbatches=2, seed=1),
                     parse_injections(["slow-worker:rank=517,factor=2"]))
    res = analyze(job, skip_steps=0)
    page = render_html(res)
    lanes = set(re.findall(r'class="lane" data-panel="measured" data-rank="(\d+)"', page))
    assert len(lanes) == 32 and "517" in lanes
    assert "992 more workers are left out" in page
    g = step_grid(res)
    assert g is not None and len(g.ranks) == 64 and 517 in g.ranks and g.num_left_out == 960
    assert len(re.findall(r"<tr><td>\d+<td>\d+<", page)) == 1024  # every worker is listed
    assert len(page.encode()) < 1_500_000
