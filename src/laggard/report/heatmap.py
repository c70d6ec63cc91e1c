"""The report's DP rank x stage heatmap of S_w, and what the top finding outlines in it.

Rows are DP ranks, columns stages (both binned to fit the page: a merged cell shows its worst
worker). The outline follows the diagnosis: a stage-imbalance finding outlines its whole stage (a
column band), a worker finding its workers' cells; without findings the workers M_W fixes that
stand out beyond the job's noise are outlined (``standing_out``, thresholds in ``OutlineConfig``):
a 1.08 among 1.07s is noise, and nothing is outlined.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from laggard.diagnose.noise import MAD_SIGMA
from laggard.errors import LaggardError
from laggard.report import plots
from laggard.report.page import NOISE, section

if TYPE_CHECKING:
    from laggard.results.analysis import Analysis

MAX_ROWS = 64  # heatmap rows (DP ranks) before neighbouring ranks are merged into one row
MAX_COLS = 48  # heatmap columns (stages) before neighbouring stages are merged


@dataclass(frozen=True, kw_only=True, slots=True)
class OutlineConfig:
    """When a worker's S_w stands out in the heatmap without a finding to say which: every rule must hold."""

    # over the other workers' median by 3 robust sigmas (1.4826 x their MAD): a cell of alike workers
    # does so with p = 0.13% under a normal spread, about one cell in 700
    mad_k: float = 3.0
    # the sigma is at least 1% (the diagnosis's noise floor, ``DiagnoseConfig.noise_floor``): workers
    # that read alike to three decimals have a MAD near 0, and a 1.08 among 1.07s is then no outlier
    noise_floor: float = 0.01
    # ...its excess S_w - 1 at least half the worst worker's: the outline marks the worst, not a tail
    of_top: float = 0.5
    # ...and above the noise the report calls out nowhere (``page.NOISE``)
    min_excess: float = NOISE
    max_outlined: int = 24  # heatmap cells outlined at most: more is a pattern, which the lead names

    def __post_init__(self) -> None:
        for name, ok in (("mad_k", self.mad_k >= 0), ("noise_floor", self.noise_floor > 0),
                         ("of_top", 0 <= self.of_top <= 1), ("max_outlined", self.max_outlined >= 1)):
            if not ok:
                raise LaggardError(f"OutlineConfig.{name}={getattr(self, name)}: out of range")


def standing_out(values: np.ndarray, cfg: OutlineConfig | None = None) -> np.ndarray:
    """Which cells of ``values`` (any shape; NaN: no worker) stand out beyond the others' noise: each
    of the ``max_outlined`` highest judged against every other finite cell (leaving itself out, so that
    one slow worker of two is not its own yardstick): over their median by ``mad_k`` robust sigmas,
    the sigma at least ``noise_floor``. A mask of ``values``' shape; none with fewer than two cells."""
    cfg = cfg or OutlineConfig()
    v = np.asarray(values, dtype=float)
    flat = v.ravel()
    out = np.zeros(flat.shape, dtype=bool)
    idx = np.flatnonzero(np.isfinite(flat))
    if len(idx) < 2:
        return out.reshape(v.shape)
    order = idx[np.argsort(-flat[idx], kind="stable")][: cfg.max_outlined]
    for i in order.tolist():
        others = flat[idx[idx != i]]
        med = float(np.median(others))
        sigma = max(MAD_SIGMA * float(np.median(np.abs(others - med))), cfg.noise_floor)
        out[i] = flat[i] > med + cfg.mad_k * sigma
    return out.reshape(v.shape)


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
        if not self.ranks:
            return "none, since no worker stands out from the others beyond the job's noise"
        return "the workers that stand out beyond the job's noise among the worst 3% (the ones M_W fixes)"


def top_outline(res: Analysis, cfg: OutlineConfig | None = None) -> Outline:
    """The top finding's stage (stage-imbalance) or workers; else M_W's workers that stand out."""
    d = res.diagnosis
    f = d.findings[0] if d is not None and d.findings else None
    if f is not None and f.cause == "stage-imbalance" and f.stages:
        return Outline(cause=f.cause, stages=[int(s) for s in f.stages])
    if f is not None and f.workers:
        return Outline(cause=f.cause, ranks=[int(w["rank"]) for w in f.workers])
    return Outline(ranks=[int(w["rank"]) for w in outlined_workers(res, cfg=cfg)])


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


def worker_grid(res: Analysis, *, max_rows: int = MAX_ROWS, max_cols: int = MAX_COLS,
                cfg: OutlineConfig | None = None) -> HeatGrid:
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
    out = top_outline(res, cfg)
    by_rank = {int(w["rank"]): w for w in res.by_worker}
    hot = sorted({(r_of[int(by_rank[r]["dp_rank"])], c_of[int(by_rank[r]["stage"])])
                  for r in out.ranks[: (cfg or OutlineConfig()).max_outlined] if r in by_rank})
    bands = sorted({(c_of[s], f"hot-stage-{s}" if cb == 1 else f"hot-c{c_of[s]}") for s in out.stages if s in c_of})
    return HeatGrid(values=vals, row_labels=row_labels, col_labels=col_labels, cell_ids=ids, tooltips=tips,
                    highlight=hot, bands=bands, row_bin=rb, col_bin=cb)


def outlined_workers(res: Analysis, *, cfg: OutlineConfig | None = None) -> list[dict[str, Any]]:
    """The workers M_W fixes that stand out beyond the job's noise (``standing_out`` over every
    worker's S_w), their excess S_w - 1 at least ``of_top`` of the worst worker's and over
    ``min_excess``; at most ``max_outlined`` of them, worst first."""
    cfg = cfg or OutlineConfig()
    if not res.by_worker:
        return []
    fixed = set(res.fixed_workers)
    s_w = np.array([float(w["slowdown"]) for w in res.by_worker])
    beyond = standing_out(s_w, cfg)
    worst = float(np.nanmax(s_w)) if np.isfinite(s_w).any() else 1.0
    cut = 1.0 + max(cfg.of_top * (worst - 1.0), cfg.min_excess)
    hot = [w for w, out in zip(res.by_worker, beyond.tolist(), strict=True)
           if out and int(w["rank"]) in fixed and float(w["slowdown"]) >= cut]
    return sorted(hot, key=lambda w: -float(w["slowdown"]))[: cfg.max_outlined]


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


__all__ = ["HeatGrid", "Outline", "OutlineConfig", "heatmap_section", "outlined_workers", "standing_out", "top_outline",
           "worker_grid"]
