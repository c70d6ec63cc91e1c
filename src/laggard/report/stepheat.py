"""The per-worker x per-step slowdown heatmap: workers as rows, steps as columns.

A cell's colour is that worker's S_w in that step: min(S_dp, S_stage) of the step, each the step
time with only the worker's DP replica (or stage) measured over the step's ideal time. A straggler
that is there every step draws a hot row; a transient one (GC, a noisy neighbour) a few hot cells;
a heavy stage a hot band of rows. Rows are sorted by (stage, DP rank), so a stage is one block; the
top finding's workers or stage are outlined.

The SVG is written by hand, compact: one path per colour level (runs of equal cells merged), a
transparent strip per row and per column carrying the tooltip. Large jobs keep the rows that matter
(outlined first, then the worst) and say how many are left out; many steps are merged into bins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

import numpy as np

from laggard.report import plots
from laggard.report.heatmap import top_outline
from laggard.report.page import section

if TYPE_CHECKING:
    from laggard.results.analysis import Analysis

MAX_ROWS = 64  # workers drawn at most (the outlined ones, then the worst); a row per worker stays readable
MAX_COLS = 160  # step columns before neighbouring steps are merged (each column shows its bin's maximum)
NUM_LEVELS = 9  # colour levels: enough to read, few paths
LABEL_W = 118  # px for the row labels
HEAD_H = 30  # px for the step labels and the drill-down marker
PLOT_W = 900  # px the cells take at most
LEGEND_W = 34  # px per colour level in the legend


@dataclass(kw_only=True, slots=True)
class StepGrid:
    """The per-step S_w of the workers drawn (rows) over the steps (columns, possibly binned)."""

    values: np.ndarray  # rows x columns
    ranks: list[int]
    dp: list[int]
    stage: list[int]
    overall: list[float]  # each row's S_w over the whole trace
    col_steps: list[list[int]]  # the steps of each column
    step_slowdown: list[float]  # S of each column (max over its steps)
    num_left_out: int
    left_out_max: float  # the largest S_w among the rows left out


def step_grid(res: Analysis, *, max_rows: int = MAX_ROWS, max_cols: int = MAX_COLS) -> StepGrid | None:
    """The grid, or None when the analysis kept no per-step data that matches its workers."""
    dp_s, pp_s = res.step_by_dp_s, res.step_by_stage_s
    dps, stages = sorted(res.by_dp_rank), sorted(res.by_stage)
    if (dp_s is None or pp_s is None or not res.by_worker or dp_s.shape != (len(res.steps), len(dps))
            or pp_s.shape != (len(res.steps), len(stages))):
        return None
    ideal = np.asarray(res.step_ideal_s, dtype=float)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        s_dp, s_pp = (dp_s / ideal).T, (pp_s / ideal).T  # per DP rank / stage, per step
    d_of = {d: i for i, d in enumerate(dps)}
    p_of = {p: i for i, p in enumerate(stages)}
    workers = [w for w in res.by_worker if int(w["dp_rank"]) in d_of and int(w["stage"]) in p_of]
    out = top_outline(res)
    first = [w for w in workers if int(w["rank"]) in set(out.ranks) or int(w["stage"]) in set(out.stages)]
    keep: dict[int, dict] = {}
    for w in first[:max_rows] + workers:  # by_worker is sorted worst first
        if len(keep) >= max_rows:
            break
        keep.setdefault(int(w["rank"]), w)
    rows = sorted(keep.values(), key=lambda w: (int(w["stage"]), int(w["dp_rank"]), int(w["rank"])))
    left = [float(w["slowdown"]) for w in workers if int(w["rank"]) not in keep]
    vals = np.array([np.minimum(s_dp[d_of[int(w["dp_rank"])]], s_pp[p_of[int(w["stage"])]]) for w in rows])
    per_step = np.array([res.per_step[s] for s in res.steps], dtype=float)
    size = max(1, math.ceil(len(res.steps) / max_cols))
    cols = [list(range(i, min(i + size, len(res.steps)))) for i in range(0, len(res.steps), size)]
    if size > 1:
        vals = np.stack([np.nanmax(vals[:, c], axis=1) for c in cols], axis=1)
    return StepGrid(
        values=vals, ranks=[int(w["rank"]) for w in rows], dp=[int(w["dp_rank"]) for w in rows],
        stage=[int(w["stage"]) for w in rows], overall=[float(w["slowdown"]) for w in rows],
        col_steps=[[int(res.steps[i]) for i in c] for c in cols],
        step_slowdown=[float(np.nanmax(per_step[c])) for c in cols],
        num_left_out=len(left), left_out_max=max(left, default=float("nan")),
    )


def _levels(values: np.ndarray, vmax: float) -> np.ndarray:
    """Colour level 0..NUM_LEVELS-1 of each value on the [1, vmax] scale (NaN: -1)."""
    x = np.clip((values - 1.0) / max(vmax - 1.0, 1e-12), 0.0, 1.0)
    lv = np.minimum((x * NUM_LEVELS).astype(np.int64), NUM_LEVELS - 1)
    return np.where(np.isfinite(values), lv, -1)


def _cell_paths(levels: np.ndarray, cw: int, ch: int, vmax: float) -> list[str]:
    """One <path> per colour level; horizontal runs of one level become one rectangle."""
    runs: dict[int, list[str]] = {}
    for r, row in enumerate(levels):
        c = 0
        while c < len(row):
            e = c
            while e + 1 < len(row) and row[e + 1] == row[c]:
                e += 1
            if row[c] >= 0:
                w = (e - c + 1) * cw
                runs.setdefault(int(row[c]), []).append(f"M{LABEL_W + c * cw} {HEAD_H + r * ch}h{w}v{ch}h-{w}z")
            c = e + 1
    out = []
    for lv, parts in sorted(runs.items()):
        colour = plots.heat_colour(1.0 + (lv + 0.5) / NUM_LEVELS * (vmax - 1.0), vmax)
        out.append(f'<path class="lv{lv}" fill="{colour}" d="{"".join(parts)}"/>')
    return out


def _span(steps: list[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}–{steps[-1]}"


def stepheat_svg(g: StepGrid, *, worst_step: int | None, outline_ranks: set[int], outline_stages: set[int]) -> str:
    nr, nc = g.values.shape
    cw = max(2, min(40, PLOT_W // max(nc, 1)))
    ch = 14 if nr <= 24 else max(6, min(12, 560 // max(nr, 1)))
    width, height = LABEL_W + max(nc * cw, NUM_LEVELS * LEGEND_W + 20) + 12, HEAD_H + nr * ch + 44
    vmax = plots.heat_vmax(g.values)
    parts = [f'<svg class="chart-svg stepheat" id="stepheat-svg" xmlns="http://www.w3.org/2000/svg" '
             f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'aria-label="per-worker per-step slowdown" data-rows="{nr}" data-cols="{nc}">']
    parts += _cell_paths(_levels(g.values, vmax), cw, ch, vmax)
    fs = 10 if ch >= 10 else 7
    for r in range(nr):  # labels and a row-wide hover strip
        y = HEAD_H + r * ch
        vals = g.values[r][np.isfinite(g.values[r])]
        worst = int(np.nanargmax(g.values[r])) if len(vals) else 0
        tip = (f"rank {g.ranks[r]} (dp{g.dp[r]}/pp{g.stage[r]}): S_w {g.overall[r]:.3f} over the trace; per step "
               f"{vals.min():.3f}–{vals.max():.3f}, worst at {_span(g.col_steps[worst])}") if len(vals) else ""
        parts.append(f'<g class="row" data-rank="{g.ranks[r]}"><title>{escape(tip)}</title>'
                     f'<rect x="0" y="{y}" width="{LABEL_W + nc * cw}" height="{ch}" fill="transparent"/>'
                     f'<text x="{LABEL_W - 6}" y="{y + ch / 2 + fs * 0.35:.1f}" font-size="{fs}" text-anchor="end">'
                     f"dp{g.dp[r]}/pp{g.stage[r]} r{g.ranks[r]}</text></g>")
    every = max(1, math.ceil(nc * 34 / max(nc * cw, 1)))  # a step label every ~34 px
    for c in range(nc):
        x = LABEL_W + c * cw
        tip = f"{_span(g.col_steps[c])}: job slowdown S = {g.step_slowdown[c]:.3f}"
        label = (f'<text x="{x + cw / 2:.1f}" y="{HEAD_H - 12}" font-size="9" text-anchor="middle">'
                 f"{g.col_steps[c][0]}</text>") if c % every == 0 else ""
        parts.append(f'<g class="col"><title>{escape(tip)}</title>'
                     f'<rect x="{x}" y="{HEAD_H - 10}" width="{cw}" height="10" fill="transparent"/>{label}</g>')
        if worst_step is not None and worst_step in g.col_steps[c]:
            parts.append(f'<path id="stepheat-worst" d="M{x} {HEAD_H - 9}h{cw}l-{cw / 2:.1f} 7z" fill="#1f2933">'
                         f"<title>step {worst_step}: the worst step, drawn as a timeline below</title></path>")
    parts += _outlines(g, cw, ch, nc, outline_ranks, outline_stages)
    parts.append(_legend(vmax, HEAD_H + nr * ch + 12))
    parts.append("</svg>")
    return "".join(parts)


def _outlines(g: StepGrid, cw: int, ch: int, nc: int, ranks: set[int], stages: set[int]) -> list[str]:
    out = []
    w = nc * cw
    for s in sorted(stages):
        rows = [r for r, st in enumerate(g.stage) if st == s]
        if rows:  # rows are sorted by stage: the stage is one block
            y0, y1 = HEAD_H + rows[0] * ch, HEAD_H + (rows[-1] + 1) * ch
            out.append(f'<rect id="stepheat-hot-stage-{s}" class="outline" x="{LABEL_W + 1}" y="{y0 + 1}" '
                       f'width="{w - 2}" height="{y1 - y0 - 2}"><title>stage {s}: the top finding</title></rect>')
    for r, rank in enumerate(g.ranks):
        if rank in ranks and g.stage[r] not in stages:
            out.append(f'<rect id="stepheat-hot-rank-{rank}" class="outline" x="{LABEL_W + 1}" '
                       f'y="{HEAD_H + r * ch + 1}" width="{w - 2}" height="{ch - 2}">'
                       f"<title>rank {rank}: the top finding</title></rect>")
    return out


def _legend(vmax: float, y: int) -> str:
    sw = LEGEND_W
    parts = [f'<text x="{LABEL_W - 6}" y="{y + 10}" font-size="9" text-anchor="end">S_w in the step</text>']
    for lv in range(NUM_LEVELS):
        lo = 1.0 + lv / NUM_LEVELS * (vmax - 1.0)
        colour = plots.heat_colour(lo + 0.5 / NUM_LEVELS * (vmax - 1.0), vmax)
        x = LABEL_W + lv * sw
        label = "≤1" if lv == 0 else f"{lo:.2f}"
        parts.append(f'<rect x="{x}" y="{y}" width="{sw}" height="12" fill="{colour}"/>'
                     f'<text x="{x}" y="{y + 24}" font-size="8.5">{label}</text>')
    return "".join(parts)


def stepheat_section(res: Analysis, worst_step: int | None) -> str:
    g = step_grid(res)
    if g is None:
        return ""
    out = top_outline(res)
    svg = stepheat_svg(g, worst_step=worst_step, outline_ranks=set(out.ranks), outline_stages=set(out.stages))
    notes = []
    if g.num_left_out:
        notes.append(f"{g.num_left_out:,} more workers are left out (their S_w is at most {g.left_out_max:.3f}); "
                     f"shown: the outlined workers, then the worst, {len(g.ranks)} in all.")
    if len(g.col_steps[0]) > 1:
        notes.append(f"Each column merges {len(g.col_steps[0])} consecutive steps and shows their maximum.")
    lead = ("Each cell is one worker's S_w in one step: the step's slowdown when only that worker's DP replica "
            "(or only its stage) keeps its measured durations. Rows are workers sorted by stage, then DP rank; "
            f"columns are steps. Outlined: {out.describe()}; the marker on top is the worst step, "
            "drawn as a timeline below. Hover a row or a step number for its values.")
    foot = "".join(f'<p class="note">{escape(n)}</p>' for n in notes)
    howto = [
        "**A hot row across every step**: a persistent straggler (hardware, a throttled GPU, a busy host).",
        "**A hot band of rows**: a stage is heavier than the others (the model split).",
        "**Scattered hot cells**: transient stalls (garbage collection, noisy neighbours) or unlucky batches.",
        "**A hot column**: a step where everyone was slow (a network hiccup, a checkpoint).",
    ]
    body = f'<figure class="chart stepheat-fig"><div class="scroll">{svg}</div></figure>{foot}'
    return section("Who is slow, step by step", body, id="step-heatmap", lead=lead, howto=howto)


__all__ = ["StepGrid", "step_grid", "stepheat_section", "stepheat_svg"]
