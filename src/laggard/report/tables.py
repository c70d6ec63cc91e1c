"""The report's tables: every worker (the worst first), arrivals at collectives, warnings, and the
glossary of the numbers."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Any

from laggard.report import plots
from laggard.report.page import GLOSSARY, fmt, section, tip

if TYPE_CHECKING:
    from laggard.results.analysis import Analysis

TOP_WORKERS = 12  # rows shown open; the rest of the workers are in a collapsed <details>


def _worker_row(i: int, w: dict[str, Any], res: Analysis, vmax: float, fixed: set[int], *, colour: bool) -> str:
    """One row; optional end tags left out (valid HTML) and alignment in the CSS: a thousand rows stay small."""
    s = float(w["slowdown"])
    style = ""
    if colour:
        bg = plots.heat_colour(s, vmax)
        style = f' style="background:{bg};color:{plots.text_on(bg)}"'
    mark = "✔" if int(w["rank"]) in fixed else ""
    return (f"<tr><td>{i}<td>{int(w['rank'])}<td>{int(w['dp_rank'])}<td>{int(w['stage'])}<td{style}>{s:.3f}"
            f"<td>{fmt(res.by_dp_rank.get(int(w['dp_rank'])))}<td>{fmt(res.by_stage.get(int(w['stage'])))}<td>{mark}")


def _table(rows: list[str]) -> str:
    head = (f'<tr><th>#</th><th>rank</th><th>DP rank</th><th>stage</th><th{tip("S_w")}>S_w</th>'
            f'<th{tip("S_dp")}>S_dp</th><th{tip("S_stage")}>S_stage</th>'
            f'<th{tip("M_W")}>fixed in M_W</th></tr>')
    return f'<table class="data workers"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def workers_section(res: Analysis) -> str:
    """Every worker by S_w, worst first: the top ``TOP_WORKERS`` open, the rest collapsed."""
    if not res.by_worker:
        return ""
    vmax = plots.heat_vmax([w["slowdown"] for w in res.by_worker])
    fixed = set(res.fixed_workers)
    rows = [_worker_row(i, w, res, vmax, fixed, colour=i <= TOP_WORKERS) for i, w in enumerate(res.by_worker, 1)]
    body = _table(rows[:TOP_WORKERS])
    rest = rows[TOP_WORKERS:]
    if rest:
        body += (f'<details class="more-workers"><summary>the other {len(rest):,} workers</summary>'
                 f"{_table(rest)}</details>")
    return section("Workers, worst first", body, id="worst-workers",
                   lead=f"All {len(rows):,} workers by S_w = min(S_dp, S_stage), worst first. Ranks are global "
                   "ranks of the trace. Hover a column name for what it means.")


def arrivals_section(res: Analysis) -> str:
    """Arrival skew at collectives (``extras["arrivals"]``, e.g. from Kineto traces)."""
    arr = res.extras.get("arrivals") if res.extras else None
    if not arr:
        return ""
    offs = res.extras.get("clock_offsets_s") or {}
    rows = sorted(arr.items(), key=lambda kv: (-kv[1]["last_count"], -kv[1]["mean_lag_s"]))[:TOP_WORKERS]
    vmax = max((a["last_share"] for _, a in rows), default=0.0) or 1.0
    trs = []
    for rank, a in rows:
        share = float(a["last_share"])
        bar = ('<span class="bar" style="display:inline-block;height:.7em;'
               f'width:{100 * share / vmax:.0f}px;background:#c0392b"></span>')
        off = offs.get(rank)
        trs.append(
            f"<tr><td>{escape(str(rank))}</td><td class=\"num\">{int(a['last_count'])} "
            f"/ {int(a['num_collectives'])}</td>"
            f"<td>{bar} {100 * share:.0f}%</td><td class=\"num\">{1e3 * a['mean_lag_s']:.3f}</td>"
            f"<td class=\"num\">{1e3 * a['p99_lag_s']:.3f}</td>"
            f"<td class=\"num\">{'n/a' if off is None else f'{1e3 * off:.3f}'}</td></tr>"
        )
    groups = res.extras.get("arrivals_by_group") or {}
    gtxt = ""
    if len(groups) > 1:
        items = []
        for g, per in groups.items():
            worst = max(per.items(), key=lambda kv: (kv[1]["last_count"], kv[1]["mean_lag_s"]), default=None)
            if worst:
                items.append(
                    f"<li>group {escape(str(g))}: rank {escape(str(worst[0]))} last at "
                    f"{int(worst[1]['last_count'])} of {int(worst[1]['num_collectives'])}</li>"
                )
        gtxt = "<ul>" + "".join(items) + "</ul>"
    table = (
        '<table class="data"><thead><tr><th>rank</th><th class="num">arrived last</th><th>share</th>'
        '<th class="num">mean lag (ms)</th><th class="num">p99 lag (ms)</th><th class="num">clock offset (ms)</th>'
        "</tr></thead><tbody>" + "".join(trs) + "</tbody></table>" + gtxt
    )
    n = int(res.extras.get("num_collectives", 0))
    return section(
        "Arrivals at collectives", table, id="arrivals",
        lead=f"How late each rank reaches the {n:,} collectives, behind the first rank to arrive "
        "(clocks aligned on the collectives' end times; offsets removed are shown).",
        howto=["A rank that arrives **last** most often makes the others wait: "
               "look at its compute before the collective.",
               "Lags are start times of the collective on each rank minus the earliest start."],
    )


def warnings_section(res: Analysis) -> str:
    if not res.warnings:
        return section("Warnings", '<p class="note">No warnings.</p>', id="warnings")
    items = "".join(f"<li>{escape(w)}</li>" for w in res.warnings)
    return section("Warnings", f'<ul class="warnings">{items}</ul>', id="warnings", cls="warn",
                   lead="Parts of the trace were skipped or adjusted; the numbers above are for what remains.")


def method_section() -> str:
    """How the numbers are computed, in plain words (the glossary behind the tooltips)."""
    dl = [
        ("Replay", "Each step is replayed from its dependency graph (ops on a stream in order, collectives "
                   "waiting for all participants, pipeline sends for their receivers), without launch gaps."),
        ("Ideal duration", "The mean duration of the op's type over all workers, steps and microbatches "
                           "(compute), or the median transfer time (communication)."),
        ("S", GLOSSARY["S"]),
        ("Waste", GLOSSARY["waste"]),
        ("S_t, S_stage, S_dp", "The slowdown when only that op type, stage or DP rank keeps its measured "
                               "durations."),
        ("S_w", GLOSSARY["S_w"]),
        ("M_W", GLOSSARY["M_W"]),
        ("M_S", GLOSSARY["M_S"]),
    ]
    items = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in dl)
    body = (f'<dl class="defs">{items}</dl><p class="note">Method: what-if analysis after Lin et al., '
            "“Understanding Stragglers in Large Model Training Using What-if Analysis”, OSDI ’25. "
            f"Generated by laggard {escape(_version())}.</p>")
    return section("How these numbers are computed", body, id="method", cls="method")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("laggard")
    except PackageNotFoundError:
        return "(development)"


__all__ = ["TOP_WORKERS", "arrivals_section", "method_section", "warnings_section", "workers_section"]
