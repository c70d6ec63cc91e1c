"""The self-contained HTML report (laggard.report.html / plots)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from laggard.errors import LaggardError
from laggard.report.html import render_html, section, worker_grid, write_html
from laggard.results.analysis import Analysis


@pytest.fixture(scope="module")
def ar_html(ar: Analysis, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("html") / "sub" / "report.html"
    p = write_html(ar, out)
    assert p == out and out.exists()
    return out.read_text(encoding="utf-8")


def assert_self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page.lower()
    assert not re.search(r"""src\s*=\s*["']?\s*(?:https?:)?//""", page, re.I)
    # the only link out is one a reader clicks (ui.perfetto.dev), never a resource the page loads
    hrefs = re.findall(r"""<(\w+)[^>]*\shref\s*=\s*["']?\s*((?:https?:)?//[^"' >]*)""", page, re.I)
    assert all(tag == "a" and url == "https://ui.perfetto.dev" for tag, url in hrefs), hrefs
    assert not re.search(r"url\(\s*['\"]?(?:https?:)?//", page, re.I)
    assert "@import" not in page and "<link" not in page.lower()
    assert "@font-face" not in page  # SVG text stays text: no embedded fonts


def test_report_is_self_contained(ar_html: str) -> None:
    assert_self_contained(ar_html)
    assert ar_html.count("<svg") >= 5  # heatmap, stage, DP rank, op type, steps
    assert "<text" in ar_html


def test_heatmap_cells_and_slowed_worker(ar: Analysis, ar_html: str) -> None:
    cells = re.findall(r'id="heat-cell-dp(\d+)-pp(\d+)"', ar_html)
    assert len(cells) == ar.meta.dp_size * ar.meta.pp_size == 16
    assert len(set(cells)) == 16
    assert 'data-cells="16"' in ar_html
    # worker rank 0 (dp0, stage 0) runs 2x slower: it is the one outlined
    hot = re.findall(r'id="heat-hot-(dp\d+-pp\d+)"', ar_html)
    assert hot == ["dp0-pp0"]
    # its tooltip names it with its value
    assert re.search(r"<title>dp0 / pp0 \(rank 0\): S_w = 1\.9\d+</title>", ar_html)


def test_headline_numbers(ar: Analysis, ar_html: str) -> None:
    assert f"{ar.slowdown:.3f}" in ar_html
    assert f"{100 * ar.waste:.1f}%" in ar_html
    assert "GPU-hours wasted" in ar_html
    assert "Replay fidelity" in ar_html and "M_W" in ar_html and "M_S" in ar_html
    assert "DP 4 × PP 4 × TP 4" in ar_html
    for name in ar.by_optype:
        assert name in ar_html
    assert ar_html.count("How to read this") >= 4


def test_stage_heatmap_for_last_stage_straggler(st: Analysis) -> None:
    page = render_html(st)
    assert len(re.findall(r'id="heat-cell-dp\d+-pp\d+"', page)) == 8
    # the stage-imbalance finding outlines its whole stage (one band), not one worker's cell
    assert st.diagnosis is not None and st.diagnosis.findings[0].cause == "stage-imbalance"
    assert re.findall(r'id="heat-(hot-[^"]+)"', page) == ["hot-stage-3"]


def test_escapes_text(st: Analysis) -> None:
    evil = "<script>alert('x')</script>"
    res = dataclasses.replace(st, meta=dataclasses.replace(st.meta, name=evil, source="a&b"),
                              warnings=["<b>bold</b> warning"])
    page = render_html(res)
    assert_self_contained(page)
    assert evil not in page and "<b>bold</b>" not in page
    assert "&lt;script&gt;" in page and "&lt;b&gt;bold&lt;/b&gt; warning" in page and "a&amp;b" in page


def test_commands_in_text_are_code_not_backticks(st: Analysis) -> None:
    """Findings and notes mark commands with backticks (plain text); the page shows them as <code>."""
    page = render_html(st)
    assert "`" not in page
    assert re.search(r"<code>laggard partition [^<]+--num-layers N</code>", page)


def test_rich_text_markup() -> None:
    from laggard.report.page import rich_text

    assert rich_text("run `a <b>` **now**") == "run <code>a &lt;b&gt;</code> <strong>now</strong>"
    assert rich_text("a lone ` stays") == "a lone ` stays"


def test_extra_sections_placement(st: Analysis) -> None:
    findings = section("Findings <1>", "<p>FINDINGS-BODY</p>", id="findings", howto=["**a** & b"])
    appendix = section("Appendix", "<p>APPENDIX-BODY</p>")
    page = render_html(st, top_sections=[findings], extra_sections=[appendix])
    assert "Findings &lt;1&gt;" in page and "<strong>a</strong> &amp; b" in page
    i_find, i_heat = page.index("FINDINGS-BODY"), page.index('id="workers-heatmap"')
    i_worst, i_app, i_warn = page.index('id="worst-workers"'), page.index("APPENDIX-BODY"), page.index('id="warnings"')
    assert page.index('id="summary"') < i_find < i_heat < i_worst < i_app < i_warn


def _big(st: Analysis, dp: int, pp: int) -> Analysis:
    rng = np.random.default_rng(1)
    by_dp = {d: 1.0 + abs(float(rng.normal(0, 0.005))) for d in range(dp)}
    by_pp = {p: 1.0 + abs(float(rng.normal(0, 0.005))) for p in range(pp)}
    by_dp[137] = by_pp[pp - 2] = 1.5
    workers = [{"dp_rank": d, "stage": p, "rank": p * dp + d, "slowdown": min(by_dp[d], by_pp[p])}
               for d in range(dp) for p in range(pp)]
    workers.sort(key=lambda w: (-w["slowdown"], w["rank"]))
    return dataclasses.replace(
        st, by_dp_rank=by_dp, by_stage=by_pp, by_worker=workers, num_workers=dp * pp,
        fixed_workers=[w["rank"] for w in workers[: max(1, len(workers) * 3 // 100)]],
        meta=dataclasses.replace(st.meta, dp_size=dp, pp_size=pp, world_size=dp * pp),
        diagnosis=None,  # ST's findings do not describe these made-up workers: M_W's standouts are outlined
    )


def test_large_grid_is_binned(st: Analysis) -> None:
    big = _big(st, 512, 4)
    g = worker_grid(big)
    assert g.values.shape == (64, 4) and g.row_bin == 8 and g.col_bin == 1
    assert g.row_labels[17] == "dp 136–143"
    assert g.values[17, 2] == pytest.approx(1.5)  # the bin keeps its worst worker
    assert g.highlight == [(17, 2)]
    page = render_html(big)
    assert_self_contained(page)
    assert len(re.findall(r'id="heat-cell-r\d+-c\d+"', page)) == 64 * 4
    assert 'id="heat-hot-r17-c2"' in page
    assert "each row merges 8 DP ranks" in page
    assert len(page) < 1_500_000


def test_unwritable_path(st: Analysis, unwritable_dir: Path) -> None:
    with pytest.raises(LaggardError, match="cannot write") as e:
        write_html(st, unwritable_dir / "r.html")
    assert "\n" not in str(e.value)


def test_cli_end_to_end(nd_dir: Path, tmp_path: Path) -> None:
    from laggard.cli.base import main

    html, trace = tmp_path / "r.html", tmp_path / "t.json"
    code = main(["analyze", str(nd_dir / "trace-ST.parquet"), "--html", str(html), "--perfetto", str(trace), "-q"])
    assert code == 0
    assert html.stat().st_size > 10_000 and trace.stat().st_size > 10_000
    assert_self_contained(html.read_text(encoding="utf-8"))


def test_negative_fix_share_is_worded() -> None:
    from laggard.report.html import _goes_away

    assert _goes_away(0.5, "stage 3 runs ideally") == "of the slowdown goes away when stage 3 runs ideally"
    assert _goes_away(-0.024, "rank 0 runs ideally").startswith("none of the slowdown goes away")
