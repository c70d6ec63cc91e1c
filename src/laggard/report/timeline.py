"""The step drill-down: the worst step's ops per worker as an inline SVG timeline, measured above
and idealised below, on one time axis.

One lane per worker (sorted by DP rank, then stage, so each pipeline's cascade reads top to
bottom); in a lane, compute (and untraced host time) in the upper band, communication in the lower
one. A communication op is drawn in two parts: the time it waited for its peers (pale) and its
transfer (solid), so the waits a straggler causes are visible. The ideal panel is the replay of
the same step with every op at its ideal duration (``Analysis.timelines``); its lanes end where the
step would end without stragglers.

The SVG is compact: one path per colour with one ``M x y h w`` stroke per op (runs that touch
merged), labels with a tooltip per lane. Over ``MAX_LANES`` workers, the lanes of the top finding's
workers and of the slowest workers in the step are kept and the rest counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

import numpy as np

from laggard.engine.gaps import HOST_KIND
from laggard.optable.ops import COMM_KINDS, is_gc_name
from laggard.report import plots
from laggard.report.heatmap import top_outline
from laggard.report.page import secs, section

if TYPE_CHECKING:
    from laggard.results.analysis import Analysis

MAX_LANES = 32  # workers drawn; more lanes stop being readable in a page-wide figure
LABEL_W = 112  # px for the lane labels
PLOT_W = 880  # px for the time axis
LANE_H = 16  # px per worker lane: compute band, communication band, spacing
COMP_H, COMM_H = 8, 5
PANEL_GAP = 40  # px between the panels (room for the ideal panel's title)
MIN_MERGE_PX = 0.4  # ops of one colour closer than this on a band are drawn as one stroke
PALETTE = ("#2f6db3", "#3c8d5a", "#8e5bb5", "#c2a01b", "#1b9aaa", "#b5546b", "#6b7f2a", "#4b5dc4")
HOST_COLOUR = "#b8c2cc"
GC_COLOUR = "#c8382c"
COMM_COLOUR = {"collective": "#e07b24", "p2p": "#7a4f2a"}
WAIT_OPACITY = 0.28


@dataclass(kw_only=True, slots=True)
class StepOps:
    """The ops of one step drawn in one panel: lane, band, start/end (s from the step start), colour."""

    lane: np.ndarray
    is_comm: np.ndarray
    start_s: np.ndarray
    busy_s: np.ndarray  # start of the transfer (comm) or of the op (compute): before it, a wait
    end_s: np.ndarray
    colour: list[str]  # per op


def worst_step(res: Analysis) -> int | None:
    """The step with the highest slowdown (the first of ties)."""
    return max(res.steps, key=lambda s: (res.per_step[s], -s)) if res.steps else None


def pick_lanes(res: Analysis, step_index: int, *, max_lanes: int = MAX_LANES) -> tuple[list[int], int]:
    """Ranks to draw (sorted by DP rank, stage) and how many workers are left out.

    Over ``max_lanes``: the top finding's workers (or its stage's), then the slowest workers in the
    step (per-step S_w when the analysis kept it, else the overall S_w).
    """
    workers = list(res.by_worker)
    if len(workers) > max_lanes:
        score = {int(w["rank"]): float(w["slowdown"]) for w in workers}
        dps, stages = sorted(res.by_dp_rank), sorted(res.by_stage)
        dp_s, pp_s = res.step_by_dp_s, res.step_by_stage_s
        if dp_s is not None and pp_s is not None and dp_s.shape[1] == len(dps) and pp_s.shape[1] == len(stages):
            d_of, p_of = {d: i for i, d in enumerate(dps)}, {p: i for i, p in enumerate(stages)}
            for w in workers:
                if int(w["dp_rank"]) in d_of and int(w["stage"]) in p_of:
                    score[int(w["rank"])] = min(dp_s[step_index, d_of[int(w["dp_rank"])]],
                                                pp_s[step_index, p_of[int(w["stage"])]])
        out = top_outline(res)
        named = set(out.ranks) | {int(w["rank"]) for w in workers if int(w["stage"]) in set(out.stages)}
        order = sorted(workers, key=lambda w: (int(w["rank"]) not in named, -score[int(w["rank"])], int(w["rank"])))
        workers = order[:max_lanes]
    workers.sort(key=lambda w: (int(w["dp_rank"]), int(w["stage"]), int(w["rank"])))
    return [int(w["rank"]) for w in workers], len(res.by_worker) - len(workers)


def _colours(res: Analysis, sel: np.ndarray) -> tuple[np.ndarray, dict[str, str]]:
    """Colour per selected op and the legend (label -> colour): compute op types by their time in
    the step (the busiest get the palette), host time grey, GC red, communication by kind."""
    assert res.base is not None
    b = res.base
    kinds = np.array(b.kinds, dtype=object)[b.kind_code[sel]]
    names = np.array(b.names, dtype=object)[b.name_code[sel]]
    dur = b.end_s[sel] - b.start_s[sel]
    out = np.empty(len(sel), dtype=object)
    legend: dict[str, str] = {}
    comm = np.isin(kinds, list(COMM_KINDS))
    host = kinds == HOST_KIND
    gc = np.array([is_gc_name(str(n)) for n in names], dtype=bool) & ~comm
    rest = ~(comm | host | gc)
    totals: dict[str, float] = {}
    for n, d in zip(names[rest].tolist(), dur[rest].tolist(), strict=True):
        totals[n] = totals.get(n, 0.0) + d
    ranked = sorted(totals, key=lambda n: -totals[n])
    lut = {n: PALETTE[i] if i < len(PALETTE) else plots.GREY for i, n in enumerate(ranked)}
    for n in ranked[: len(PALETTE)]:
        legend[n] = lut[n]
    if len(ranked) > len(PALETTE):
        legend["other compute"] = plots.GREY
    out[rest] = [lut[n] for n in names[rest].tolist()]
    out[host] = HOST_COLOUR
    out[gc] = GC_COLOUR
    p2p = comm & (kinds != "collective")
    out[comm & ~p2p] = COMM_COLOUR["collective"]
    out[p2p] = COMM_COLOUR["p2p"]
    if host.any():
        legend["untraced host time"] = HOST_COLOUR
    if gc.any():
        legend["gc"] = GC_COLOUR
    if (comm & ~p2p).any():
        legend["collective (transfer)"] = COMM_COLOUR["collective"]
    if p2p.any():
        legend["pipeline send/recv (transfer)"] = COMM_COLOUR["p2p"]
    if comm.any():
        legend["waiting for peers (pale)"] = "wait"
    return out, legend


def step_ops(res: Analysis, step_index: int, ranks: list[int]) -> tuple[StepOps, StepOps, dict[str, str]]:
    """Measured and ideal ops of the step on the given workers, times from the step's start."""
    assert res.base is not None
    b, g = res.base, res.base.graph
    in_step = g.op_step == step_index
    lane_of = np.full(max(int(b.rank.max()), *ranks) + 1, -1, dtype=np.int64)
    lane_of[ranks] = np.arange(len(ranks))
    sel = np.flatnonzero(in_step & (lane_of[b.rank] >= 0))
    colour, legend = _colours(res, sel)
    comm = np.isin(np.array(b.kinds, dtype=object)[b.kind_code[sel]], list(COMM_KINDS))
    lane = lane_of[b.rank[sel]]
    origin = float(b.start_s[in_step].min()) if in_step.any() else 0.0
    m_start, m_end = b.start_s[sel] - origin, b.end_s[sel] - origin
    member = g.op_group[sel] >= 0
    # a member's transfer ends it; before the transfer it waited for the other participants
    m_busy = np.where(member, np.maximum(m_end - b.measured[sel], m_start), m_start)
    _, ideal_end = res.timelines()
    from laggard.engine.replay import op_starts

    i_start_all = op_starts(g, ideal_end)
    i_start, i_end = i_start_all[sel], ideal_end[sel]
    i_busy = np.where(member, np.maximum(i_end - b.ideal[sel], i_start), i_start)
    cols = colour.tolist()
    measured = StepOps(lane=lane, is_comm=comm, start_s=m_start, busy_s=m_busy, end_s=m_end, colour=cols)
    ideal = StepOps(lane=lane, is_comm=comm, start_s=i_start, busy_s=i_busy, end_s=i_end, colour=cols)
    return measured, ideal, legend


def _strokes(ops: StepOps, y0: float, px_per_s: float) -> dict[tuple[str, bool, int], list[str]]:
    """Path segments per (colour, is-wait, band height): ``M x y h w`` strokes, touching runs merged."""
    segs: dict[tuple[str, bool, int], list[tuple[float, float, float]]] = {}
    band_y = np.where(ops.is_comm, LANE_H - 3 - COMM_H / 2, 1 + COMP_H / 2)
    for a, b, wait in ((ops.start_s, ops.busy_s, True), (ops.busy_s, ops.end_s, False)):
        x0 = LABEL_W + a * px_per_s
        x1 = LABEL_W + b * px_per_s
        y = y0 + ops.lane * LANE_H + band_y
        keep = (x1 - x0) > 0.05
        for i in np.flatnonzero(keep & (ops.is_comm | ~wait)).tolist():
            h = COMM_H if ops.is_comm[i] else COMP_H
            segs.setdefault((ops.colour[i], wait, h), []).append((float(y[i]), float(x0[i]), float(x1[i])))
    out: dict[tuple[str, bool, int], list[str]] = {}
    for key, items in segs.items():
        items.sort()
        merged: list[list[float]] = []
        for y, a, b in items:
            if merged and merged[-1][0] == y and a - merged[-1][2] < MIN_MERGE_PX:
                merged[-1][2] = max(merged[-1][2], b)
            else:
                merged.append([y, a, b])
        out[key] = [f"M{a:.1f} {y:g}h{b - a:.1f}" for y, a, b in merged]
    return out


def _panel(ops: StepOps, y0: float, px_per_s: float, span_s: float, title: str, pid: str) -> list[str]:
    parts = [f'<g id="{pid}"><text x="{LABEL_W}" y="{y0 - 8}" font-size="11" font-weight="600">{escape(title)}</text>']
    for (colour, wait, h), segs in sorted(_strokes(ops, y0, px_per_s).items()):
        op = f' stroke-opacity="{WAIT_OPACITY}"' if wait else ""
        parts.append(f'<path stroke="{colour}" stroke-width="{h}"{op} d="{"".join(segs)}"/>')
    x_end = LABEL_W + span_s * px_per_s
    n = int(ops.lane.max()) + 1 if len(ops.lane) else 0
    parts.append(f'<line x1="{x_end:.1f}" x2="{x_end:.1f}" y1="{y0 - 4}" y2="{y0 + n * LANE_H}" stroke="#1f2933" '
                 f'stroke-dasharray="3 2"><title>end of the step: {secs(span_s)}</title></line></g>')
    return parts


def _ticks(span_s: float) -> list[float]:
    raw = span_s / 6 if span_s > 0 else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(span_s / step) + 1)]


def timeline_svg(res: Analysis, step_index: int, ranks: list[int]) -> tuple[str, dict[str, str], float, float]:
    """(SVG, legend, measured span s, ideal span s) of the step on these workers."""
    measured, ideal, legend = step_ops(res, step_index, ranks)
    assert res.base is not None
    b = res.base
    in_step = b.graph.op_step == step_index
    m_span = float(b.end_s[in_step].max() - b.start_s[in_step].min()) if in_step.any() else 0.0
    i_span = float(res.step_ideal_s[step_index])
    span = max(m_span, i_span, 1e-9)
    px = PLOT_W / span
    n = len(ranks)
    panel_h = n * LANE_H
    y1 = 24
    y2 = y1 + panel_h + PANEL_GAP
    axis_y = y2 + panel_h + 6
    width, height = LABEL_W + PLOT_W + 20, axis_y + 30
    worker = {int(w["rank"]): w for w in res.by_worker}
    parts = [f'<svg class="chart-svg timeline" id="timeline-svg" xmlns="http://www.w3.org/2000/svg" '
             f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'aria-label="step timeline" data-lanes="{n}" data-step="{res.steps[step_index]}" '
             f'data-measured-s="{m_span:.6g}" data-ideal-s="{i_span:.6g}" fill="none">']
    parts += _panel(measured, y1, px, m_span, f"measured (as traced): {secs(m_span)}", "timeline-measured")
    parts += _panel(ideal, y2, px, i_span, f"ideal replay (every op at its ideal duration): {secs(i_span)}",
                    "timeline-ideal")
    for y0, ops, name in ((y1, measured, "measured"), (y2, ideal, "ideal")):
        for lane, r in enumerate(ranks):
            w = worker.get(r, {"dp_rank": "?", "stage": "?"})
            on = ops.lane == lane
            wait = float(np.sum((ops.busy_s - ops.start_s)[on & ops.is_comm]))
            comp = float(np.sum((ops.end_s - ops.start_s)[on & ~ops.is_comm]))
            tip = f"rank {r} (dp{w['dp_rank']}/pp{w['stage']}): compute {secs(comp)}, waiting for peers {secs(wait)}"
            parts.append(f'<text class="lane" data-panel="{name}" data-rank="{r}" data-compute-s="{comp:.6g}" '
                         f'data-wait-s="{wait:.6g}" x="{LABEL_W - 6}" y="{y0 + lane * LANE_H + 11}" font-size="9.5" '
                         f'text-anchor="end" fill="#1f2933"><title>{escape(tip)}</title>'
                         f"dp{w['dp_rank']}/pp{w['stage']} r{r}</text>")
    for t in _ticks(span):
        x = LABEL_W + t * px
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y1 - 4}" y2="{axis_y}" stroke="#d9dee4" stroke-width=".6"/>'
                     f'<text x="{x:.1f}" y="{axis_y + 12}" font-size="9" text-anchor="middle" fill="#616e7c">'
                     f"{secs(t) if t > 0 else '0'}</text>")
    parts.append("</svg>")
    return "".join(parts), legend, m_span, i_span


def _legend_html(legend: dict[str, str]) -> str:
    items = []
    for label, colour in legend.items():
        style = (f"background:{COMM_COLOUR['collective']};opacity:{WAIT_OPACITY}" if colour == "wait"
                 else f"background:{colour}")
        items.append(f'<span class="key"><i style="{style}"></i>{escape(label)}</span>')
    return f'<div class="legend">{"".join(items)}</div>'


def timeline_section(res: Analysis) -> str:
    step = worst_step(res)
    if res.base is None or step is None:
        return ""
    k = res.steps.index(step)
    ranks, left_out = pick_lanes(res, k)
    svg, legend, m_span, i_span = timeline_svg(res, k, ranks)
    note = (f'<p class="note">{left_out:,} more workers are left out: shown are the top finding\'s workers and '
            f"the slowest in this step, {len(ranks)} in all.</p>") if left_out else ""
    lead = (f"Step {step}, the worst step (S = {res.per_step[step]:.3f}): each worker's ops as traced (top) "
            f"and in the ideal replay of the same step (bottom), on one time axis. The step took {secs(m_span)}; "
            f"without stragglers it would take {secs(i_span)}. In each lane, compute is the upper band and "
            "communication the lower one; a pale stretch before a transfer is time spent waiting for peers. "
            "Hover a worker's name for its compute and waiting time.")
    howto = [
        "**One lane whose compute bars are longer** while the others show long pale waits: that worker is the "
        "straggler; everyone else waits for it at the next transfer or collective.",
        "**Long pale waits on the first or last stage**: a pipeline bubble grown by a slow stage next to it.",
        "**Grey stretches** (untraced host time): the CPU was busy between ops (kernel launches, data loading).",
        "Every op of this step and every other is in the Perfetto file linked below.",
    ]
    body = f'<figure class="chart timeline-fig"><div class="scroll">{svg}</div>{_legend_html(legend)}</figure>{note}'
    return section(f"Step {step} up close: measured vs ideal", body, id="step-timeline", lead=lead, howto=howto)


__all__ = ["StepOps", "pick_lanes", "step_ops", "timeline_section", "timeline_svg", "worst_step"]
