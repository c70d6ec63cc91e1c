"""The HTML report: one self-contained file (inline CSS and SVG; no script, no external loads).

``write_report(result, path)`` writes the report of a :class:`laggard.whatif.core.Analysis` and, unless
given one, the Perfetto trace it links to beside it; ``write_html`` writes only the page. Later
work adds its own sections without touching this module: ``top_sections`` go right under the
headline numbers (e.g. findings), ``extra_sections`` after the built-in charts; each is an HTML
string, best built with :func:`section` so it shares the page's look. Every text that comes from
data is escaped; section bodies passed in are trusted HTML (escape what you put in them).

The parts live in their own modules: ``heatmap`` (DP x stage), ``stepheat`` (worker x step),
``timeline`` (the worst step, measured vs ideal), ``tables``, ``findings``; ``page`` has the shared
look (sections, formatting, glossary, CSS).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import numpy as np

from laggard.errors import LaggardError
from laggard.optable.hosts import cpu_job
from laggard.report import plots
from laggard.report.heatmap import HeatGrid, heatmap_section, worker_grid
from laggard.report.page import (
    CSS,
    GLOSSARY,
    NOISE,
    finite,
    fmt,
    level,
    pct,
    ranks_text,
    rich_text,
    secs,
    section,
)
from laggard.report.stepheat import stepheat_section
from laggard.report.tables import arrivals_section, method_section, warnings_section, workers_section
from laggard.report.timeline import timeline_section, worst_step

if TYPE_CHECKING:
    from laggard.results.analysis import Analysis

FIDELITY_WARN = 0.10  # replay error above which the report says to treat attributions with care
# the Perfetto trace written beside a report holds at most this many events (whole steps, first
# steps first): ~50 MB of JSON, which ui.perfetto.dev opens in seconds; --perfetto writes up to 2M
BESIDE_MAX_EVENTS = 500_000


# ---------------------------------------------------------------- public API


def perfetto_beside(html_path: str | Path) -> Path:
    """Where ``write_report`` puts the Perfetto trace when it is not given one: NAME.perfetto.json.gz."""
    p = Path(html_path)
    return p.with_name(p.stem + ".perfetto.json.gz")


def write_report(result: Analysis, path: str | Path, *, perfetto: str | Path | None = None) -> tuple[Path, Path | None]:
    """Write the HTML report to ``path`` and link the Perfetto trace ``perfetto`` from it; without
    ``perfetto``, write the trace beside the report first (:func:`perfetto_beside`). Returns both
    paths (the trace None when the analysis carries no op table)."""
    trace: Path | None = Path(perfetto) if perfetto is not None else None
    if trace is None and result.base is not None:
        from laggard.report.perfetto import write_perfetto

        trace = write_perfetto(result, perfetto_beside(path), max_events=BESIDE_MAX_EVENTS)
    return write_html(result, path, perfetto=trace), trace


def write_html(
    result: Analysis,
    path: str | Path,
    *,
    top_sections: Sequence[str] | None = None,
    extra_sections: Sequence[str] | None = None,
    title: str | None = None,
    perfetto: str | Path | None = None,
) -> Path:
    """Write the report to ``path`` (parents created); ``perfetto``: a trace file to link (relative
    to the report). See :func:`render_html` for the sections."""
    p = Path(path)
    link = None
    if perfetto is not None:
        link = quote(Path(os.path.relpath(Path(perfetto).resolve(), p.resolve().parent)).as_posix())
    page = render_html(result, top_sections=top_sections, extra_sections=extra_sections, title=title,
                       perfetto_href=link)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(page, encoding="utf-8")
    except OSError as e:
        raise LaggardError(f"{p}: cannot write the HTML report ({e.strerror or e})") from None
    return p


def render_html(
    result: Analysis,
    *,
    top_sections: Sequence[str] | None = None,
    extra_sections: Sequence[str] | None = None,
    title: str | None = None,
    perfetto_href: str | None = None,
) -> str:
    """The report as one HTML string.

    Order: header and headline numbers; ``top_sections`` (by default the diagnosis findings); the
    DP x stage heatmap; the worker x step heatmap; the worst step's timeline; the Perfetto link;
    stages and DP ranks; op types; steps; workers; arrivals; ``extra_sections``; warnings; method.
    """
    if top_sections is None and getattr(result, "diagnosis", None) is not None:
        from laggard.report.findings import findings_html

        found = findings_html(result)
        top_sections = [found] if found else None
    name = result.meta.name
    page_title = title or f"laggard report: {name}"
    body = [
        _header(result, title or name),
        _kpis(result),
        *(top_sections or ()),
        heatmap_section(result),
        stepheat_section(result, worst_step(result)),
        timeline_section(result),
        _perfetto_section(perfetto_href),
        _stage_dp_section(result),
        _optype_section(result),
        _steps_section(result),
        workers_section(result),
        arrivals_section(result),
        *(extra_sections or ()),
        warnings_section(result),
        method_section(),
    ]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta name="generator" content="laggard">\n'
        f"<title>{escape(page_title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n"
        + "\n".join(b for b in body if b)
        + "\n</main>\n</body>\n</html>\n"
    )


def _perfetto_section(href: str | None) -> str:
    if href is None:
        return ""
    body = ('<p>Every op of every worker, measured and in the ideal replay: '
            f'<a id="perfetto-link" href="{escape(href)}" '
            f'download>{escape(href)}</a> (Chrome trace-event JSON, beside this report).</p>'
            '<p class="note">To look at it: open <a href="https://ui.perfetto.dev" rel="noopener">ui.perfetto.dev</a>, '
            "choose <em>Open trace file</em> and pick the file (or drag it onto the page); it is read in your "
            "browser, nothing is uploaded. Each worker is a process named e.g. “measured dp0/pp1 (rank 4)”; "
            "the ideal replay's processes follow the measured ones. Keys: W/S zoom, A/D pan.</p>")
    return section("The full timeline in Perfetto", body, id="perfetto")


# ---------------------------------------------------------------- header and numbers


def _header(res: Analysis, heading: str) -> str:
    m = res.meta
    layout = f"DP {m.dp_size} × PP {m.pp_size} × TP {m.tp_size}"
    for dim, size in (("CP", m.cp_size), ("DSP", m.dsp_size), ("EP", m.ep_size)):
        if size > 1:
            layout += f" × {dim} {size}"
    if m.vpp_size > 1:
        layout += f" (VPP {m.vpp_size})"
    facts = [
        layout,
        f"{m.num_gpus:,} GPUs" if m.world_size is not None else None,
        f"{res.num_workers:,} workers",
        f"{len(res.steps):,} steps" + (f" ({res.steps[0]}–{res.steps[-1]})" if len(res.steps) > 1 else ""),
        f"{res.num_ops:,} ops",
    ]
    chips = "".join(f'<span class="chip">{escape(f)}</span>' for f in facts if f)
    return (
        '<header class="top">'
        '<div class="brand">laggard · straggler report</div>'
        f"<h1>{escape(heading)}</h1>"
        f'<div class="source">{escape(m.source)}</div>'
        f'<div class="chips">{chips}</div>'
        "</header>"
    )


def replay_error(res: Analysis) -> tuple[float, float]:
    """(mean, max) over steps of |replayed - wall-clock| / wall-clock step time (the replay with the
    steps back to back: a wall-clock step overlaps the one before where ranks start it apart)."""
    meas = np.asarray(res.step_wall_s, dtype=float)
    sim = np.asarray(res.step_replayed_wall_s, dtype=float)
    ok = meas > 0
    if not ok.any():
        return float("nan"), float("nan")
    err = np.abs(sim[ok] - meas[ok]) / meas[ok]
    return float(err.mean()), float(err.max())


def _goes_away(share: float | None, when: str) -> str:
    """What a fix share (M_W, M_S) means, in words, including values outside 0-100%."""
    if share is not None and share < 0:  # their ops were faster than ideal more than slower
        if share < -NOISE:
            return (f"none of the slowdown goes away when {when}: the replay gets slower (its ops are faster "
                    "than the average the ideal uses), so it is not what slows the job")
        return f"none of the slowdown goes away when {when} (within noise: it is no slower than average)"
    if share is not None and share > 1 + NOISE:
        return (f"of the slowdown goes away when {when}: more than all of it, since the rest of the job is "
                "faster than the average the ideal uses; this part explains the whole slowdown")
    return f"of the slowdown goes away when {when}"


def _kpi(label: str, value: str, sub: str, lvl: str = "neutral", term: str | None = None) -> str:
    title = f' title="{escape(GLOSSARY[term])}"' if term else ""
    return (
        f'<div class="kpi {lvl}"{title}><div class="kpi-label">{escape(label)}</div>'
        f'<div class="kpi-value">{escape(value)}</div><div class="kpi-sub">{rich_text(sub)}</div></div>'
    )


def _kpis(res: Analysis) -> str:
    S = res.slowdown
    cards = [
        _kpi("Straggler slowdown S", fmt(S), f"steps take **{fmt(S, 2)}×** as long as with no stragglers", level(S),
             "S"),
        _kpi("Waste", pct(res.waste), "of the job's GPU time is lost to stragglers (1 − 1/S)", level(S), "waste"),
        _kpi("Step time", secs(res.T_s), f"replayed; **{secs(res.T_ideal_s)}** if every op took its ideal time"),
    ]
    gh = res.gpu_hours
    if gh is not None:
        # a job that ran on CPUs spent rank-hours, not GPU-hours: the same figure, named for what it counts
        hours, unit = ("rank-hours", "CPU ranks") if cpu_job(res.meta.extra) else ("GPU-hours", "GPUs")
        cards.append(_kpi(f"{hours[0].upper()}{hours[1:]} wasted", f"{gh * res.waste:,.2f}",
                          f"of {gh:,.2f} {hours} traced on {res.meta.num_gpus:,} {unit}"))
    fixed = res.fixed_workers
    who = (f"the worst worker (rank {ranks_text(fixed)}) runs" if len(fixed) == 1
           else f"the worst {len(fixed)} workers (ranks {ranks_text(fixed)}) run")
    cards.append(_kpi("M_W: worst workers explain", pct(res.M_W), _goes_away(res.M_W, f"{who} ideally"),
                      "neutral", "M_W"))
    last = max(res.by_stage) if res.by_stage else None
    cards.append(_kpi("M_S: last stage explains", pct(res.M_S),
                      _goes_away(res.M_S, f"the last stage (stage {last}) runs ideally"), "neutral", "M_S"))
    mean_err, max_err = replay_error(res)
    lvl = "warn" if finite(mean_err) and mean_err > FIDELITY_WARN else "neutral"
    sub = (f"mean per-step gap between the replay and the trace (max {pct(max_err)}); "
           f"time left out of the replay: {pct(res.replay_fidelity - 1)}")
    if lvl == "warn":
        sub += "; **the replay does not match the trace well: read the attributions with care**"
    cards.append(_kpi("Replay fidelity", f"{pct(mean_err)} error", sub, lvl, "fidelity"))
    return (f'<section class="kpis" id="summary">{"".join(cards)}</section>'
            '<p class="note hint">Hover a number for what it means; the glossary is at the end of the page.</p>')


# ---------------------------------------------------------------- bars


def _stage_dp_section(res: Analysis) -> str:
    stages = sorted(res.by_stage)
    last = stages[-1] if stages else None
    st_cols = [plots.RED if s == last else plots.BLUE for s in stages]
    st_svg = plots.bars_svg([str(s) for s in stages], [res.by_stage[s] for s in stages], horizontal=False,
                            colours=st_cols, category_label="pipeline stage", value_label="S_stage",
                            reference=res.slowdown, reference_label="S (all ops measured)", width_in=5.2,
                            prefix="stages")
    dps = sorted(res.by_dp_rank)
    dp_vals = [res.by_dp_rank[d] for d in dps]
    dp_svg = plots.bars_svg([str(d) for d in dps], dp_vals, horizontal=False, category_label="DP rank",
                            value_label="S_dp", reference=res.slowdown, reference_label="S (all ops measured)",
                            width_in=5.2, prefix="dpranks")
    body = ('<div class="two">'
            f'<figure class="chart"><figcaption>By pipeline stage (last stage in red)</figcaption>{st_svg}</figure>'
            f'<figure class="chart"><figcaption>By DP rank</figcaption>{dp_svg}</figure></div>')
    howto = [
        "Each bar is the job's slowdown when only that stage (or DP rank) keeps its measured durations and "
        "everything else runs ideally. A bar at 1 contributes nothing; a bar reaching the dotted line "
        "explains the whole slowdown on its own.",
        "**A tall last-stage bar**: the last stage carries more work than the others (output layer, loss); "
        "rebalance the layers across stages.",
        "**One tall stage bar that is not the last**: either that stage is overloaded or one worker in it is "
        "slow; the heatmap above tells which.",
        "**One tall DP bar**: a straggler sits in that replica; the heatmap shows its stage.",
    ]
    return section("Stages and DP ranks", body, id="stages", howto=howto)


def _optype_section(res: Analysis) -> str:
    items = sorted(res.by_optype.items(), key=lambda kv: (-(kv[1] if finite(kv[1]) else -1.0), kv[0]))
    comm = _comm_types(res)
    labels = [k for k, _ in items]
    cols = [plots.COMM if k in comm else plots.COMPUTE for k in labels]
    legend = {plots.COMPUTE: "compute / other", plots.COMM: "communication"} if comm else None
    svg = plots.bars_svg(labels, [v for _, v in items], horizontal=True, colours=cols, legend=legend,
                         reference=res.slowdown, reference_label="S (all ops measured)",
                         value_label="S_t: slowdown with only this op type measured", prefix="optypes")
    howto = [
        "Each bar is the job's slowdown when only that op type keeps its measured durations. The longest "
        "bars name what makes the job slow; bars at 1 do not matter.",
        "**Compute bars (forward/backward)**: slow computation: a slow GPU, or uneven work between "
        "microbatches or ranks (sequence lengths).",
        "**Communication bars** (all-gather, reduce-scatter, pipeline send/receive): slow links or a slow "
        "peer; a pipeline-communication bar often mirrors a slow neighbouring stage.",
        "The bars do not add up to S: op types interact through the dependencies.",
    ]
    return section("Op types", f'<figure class="chart">{svg}</figure>', id="optypes", howto=howto)


def _comm_types(res: Analysis) -> set[str]:
    """Attribution types of communication ops (empty without the baseline)."""
    b = res.base
    if b is None or not len(b.attr_code):
        return set()
    from laggard.optable.ops import COMM_KINDS

    comm_kind = np.array([k in COMM_KINDS for k in b.kinds], dtype=bool)
    is_comm = comm_kind[b.kind_code]
    codes = np.unique(b.attr_code[is_comm])
    return {b.attr_names[int(c)] for c in codes}


def _steps_section(res: Analysis) -> str:
    if not res.steps:
        return section("Steps", "<p>No steps.</p>", id="steps")
    svg = plots.per_step_svg(res.steps, [res.per_step[s] for s in res.steps], res.step_measured_s,
                             res.step_simulated_s, res.step_ideal_s, overall=res.slowdown, prefix="steps")
    howto = [
        "Top: each step's time as traced, as replayed with the measured durations, and as replayed with ideal "
        "durations. Bottom: the slowdown of each step (replayed / ideal).",
        "**A flat, high slowdown**: a persistent straggler (the same worker or stage every step): hardware or "
        "the model split.",
        "**Spikes**: transient stragglers: garbage collection, a noisy neighbour, an unlucky batch of long "
        "sequences.",
        "**A gap between traced and replayed**: time the replay leaves out (kernel-launch and CPU stalls "
        "between ops); it is not counted in S.",
    ]
    return section("Steps", f'<figure class="chart">{svg}</figure>', id="steps", howto=howto)


__all__ = ["CSS", "HeatGrid", "perfetto_beside", "render_html", "replay_error", "section", "worker_grid", "write_html",
           "write_report"]
