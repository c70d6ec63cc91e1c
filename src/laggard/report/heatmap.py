"""The report's DP rank x stage heatmap of S_w, and what the top finding outlines in it.

Rows are DP ranks, columns stages (both binned to fit the page: a merged cell shows its worst
worker). The outline follows the diagnosis: a stage-imbalance finding outlines its whole stage (a
column band), a worker finding its workers' cells; without findings the workers M_W fixes that
clearly stand out are outlined.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from laggard.report import plots
from laggard.report.page import NOISE, section

if TYPE_CHECKING:
    from laggard.results.analysis import Analysis

MAX_ROWS = 64  # heatmap rows (DP ranks) before neighbouring ranks are merged into one row
MAX_COLS = 48  # heatmap columns (stages) before neighbouring stages are merged
MAX_OUTLINED = 24  # heatmap cells outlined at most


@dataclass(kw_only=True, slots=True)
class Outline:
    """What the top finding points at: whole stages, or single workers (ranks)."""

    cause: str = ""
    stages: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)

    def describe(self) -> str:
        if self.stages:
            return f"the {self.cause} finding's stage " + ", ".join(str(s) for s in self.stages)
        if self.cause:
            return f"the {self.cause} finding's worker" + ("s" if len(self.ranks) > 1 else "")
        return "the workers that clearly stand out among the worst 3% (the ones M_W fixes)"


def top_outline(res: Analysis) -> Outline:
    """The top finding's stage (stage-imbalance) or workers; else M_W's clear standouts."""
    d = res.diagnosis
    f = d.findings[0] if d is not None and d.findings else None
    if f is not None and f.cause == "stage-imbalance" and f.stages:
        return Outline(cause=f.cause, stages=[int(s) for s in f.stages])
    if f is not None and f.workers:
        return Outline(cause=f.cause, ranks=[int(w["rank"]) for w in f.workers])
    return Outline(ranks=[int(w["rank"]) for w in outlined_workers(res)])


@dataclass(kw_only=True, slots=True)
class HeatGrid:
    """The S_w grid as drawn: rows = DP ranks (or bins of them), columns = stages (or bins)."""

    values: np.ndarray
    row_labels: list[str]
    col_labels: list[str]
    cell_ids: list[list[str]]
    tooltips: list[list[str]]
    highlight: list[tuple[int, int]]
    bands: list[tuple[int, str]]  # (column, gid): whole columns outlined (a stage)
    row_bin: int  # DP ranks per row
    col_bin: int  # stages per column


def _bins(values: list[int], limit: int) -> tuple[int, list[list[int]]]:
    size = max(1, math.ceil(len(values) / limit))
    return size, [values[i : i + size] for i in range(0, len(values), size)]


def _span(vals: list[int], what: str) -> str:
    return f"{what} {vals[0]}" if len(vals) == 1 else f"{what} {vals[0]}–{vals[-1]}"


def worker_grid(res: Analysis, *, max_rows: int = MAX_ROWS, max_cols: int = MAX_COLS) -> HeatGrid:
    """Bin the per-worker S_w into at most max_rows x max_cols cells (the maximum of each bin)."""
    dps = sorted({int(w["dp_rank"]) for w in res.by_worker})
    stages = sorted({int(w["stage"]) for w in res.by_worker})
    rb, rows = _bins(dps, max_rows)
    cb, cols = _bins(stages, max_cols)
    r_of = {d: i for i, grp in enumerate(rows) for d in grp}
    c_of = {s: j for j, grp in enumerate(cols) for s in grp}
    vals = np.full((len(rows), len(cols)), np.nan)
    who: dict[tuple[int, int], dict[str, Any]] = {}
    for w in res.by_worker:
        key = (r_of[int(w["dp_rank"])], c_of[int(w["stage"])])
        s = float(w["slowdown"])
        if not (np.isfinite(vals[key]) and vals[key] >= s):
            vals[key] = s
            who[key] = w
    binned = rb > 1 or cb > 1
    row_labels = [_span(g, "dp") for g in rows]
    col_labels = [_span(g, "pp") if cb > 1 else str(g[0]) for g in cols]
    ids, tips = [], []
    for i, rg in enumerate(rows):
        id_row, tip_row = [], []
        for j, cg in enumerate(cols):
            id_row.append(f"cell-r{i}-c{j}" if binned else f"cell-dp{rg[0]}-pp{cg[0]}")
            w = who.get((i, j))
            if w is None:
                tip_row.append(f"{_span(rg, 'dp')} / {_span(cg, 'pp')}: no worker in the trace")
            else:
                where = f"{_span(rg, 'dp')} / {_span(cg, 'pp')}: max " if binned else ""
                tip_row.append(f"{where}dp{w['dp_rank']} / pp{w['stage']} (rank {w['rank']}): "
                               f"S_w = {float(w['slowdown']):.4f}")
        ids.append(id_row)
        tips.append(tip_row)
    out = top_outline(res)
    by_rank = {int(w["rank"]): w for w in res.by_worker}
    hot = sorted({(r_of[int(by_rank[r]["dp_rank"])], c_of[int(by_rank[r]["stage"])])
                  for r in out.ranks[:MAX_OUTLINED] if r in by_rank})
    bands = sorted({(c_of[s], f"hot-stage-{s}" if cb == 1 else f"hot-c{c_of[s]}") for s in out.stages if s in c_of})
    return HeatGrid(values=vals, row_labels=row_labels, col_labels=col_labels, cell_ids=ids, tooltips=tips,
                    highlight=hot, bands=bands, row_bin=rb, col_bin=cb)


def outlined_workers(res: Analysis, *, limit: int = MAX_OUTLINED) -> list[dict[str, Any]]:
    """The workers M_W fixes that clearly stand out.

    A worker stands out when its excess S_w - 1 is at least half the worst worker's (and above
    noise); at most ``limit`` of them, worst first.
    """
    if not res.by_worker:
        return []
    fixed = set(res.fixed_workers)
    worst = max(float(w["slowdown"]) for w in res.by_worker)
    cut = 1.0 + max(0.5 * (worst - 1.0), NOISE)
    hot = [w for w in res.by_worker if int(w["rank"]) in fixed and float(w["slowdown"]) >= cut]
    return sorted(hot, key=lambda w: -float(w["slowdown"]))[:limit]


def heatmap_section(res: Analysis) -> str:
    if not res.by_worker:
        return section("Who is slow: workers", "<p>No workers in the analysis.</p>", id="workers-heatmap")
    g = worker_grid(res)
    svg = plots.heatmap_svg(g.values, g.row_labels, g.col_labels, cell_ids=g.cell_ids, tooltips=g.tooltips,
                            highlight=g.highlight, bands=g.bands, cbar_label="S_w  (1 = not slowed)", prefix="heat")
    nr, nc = g.values.shape
    note = []
    if g.row_bin > 1:
        note.append(f"each row merges {g.row_bin} DP ranks")
    if g.col_bin > 1:
        note.append(f"each column merges {g.col_bin} stages")
    lead = ("S_w of each worker: the slowdown of the job when only that worker's DP rank, or only its stage, "
            f"keeps its measured durations (the smaller of the two). Outlined: {top_outline(res).describe()}. "
            "Hover a cell for its exact value.")
    if note:
        lead += " To fit the page, " + " and ".join(note) + "; a merged cell shows the worst worker in it."
    body = (f'<figure class="chart heatmap" data-rows="{nr}" data-cols="{nc}" data-cells="{nr * nc}">'
            f'<div class="scroll">{svg}</div></figure>')
    howto = [
        "**One hot cell**: one worker is slow (a faulty or throttled GPU, a busy host, a bad link). Through the "
        "pipeline and the gradient sync it holds back every other worker; look at that host first.",
        "**A hot row**: a whole DP replica is slow on every stage: its data is heavier (longer sequences) or "
        "its nodes share a slow network path.",
        "**A hot column**: one stage is slow on every DP rank: the model is split unevenly across stages.",
        "**A hot last column**: the last stage also runs the output layer and the loss; give it fewer "
        "layers (M_S shows how much that would recover).",
        "**Everything pale but S high**: the slowdown is not tied to particular workers; see the op types "
        "and steps below (e.g. sequence-length imbalance between microbatches, slow collectives).",
        "Values a little below 1 are noise: ideal durations are averages.",
    ]
    return section("Who is slow: worker slowdown by DP rank and stage", body, id="workers-heatmap",
                   lead=lead, howto=howto)


__all__ = ["HeatGrid", "Outline", "heatmap_section", "outlined_workers", "top_outline", "worker_grid"]
