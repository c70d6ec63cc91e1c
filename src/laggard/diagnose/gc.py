"""``gc``: rare long forward passes on different ranks at different steps, the backward passes of
the same microbatches untouched; or garbage collections traced as their own ops."""

from __future__ import annotations

import numpy as np

from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx, weights_of
from laggard.diagnose.findings import Candidate, Finding
from laggard.ops import is_gc_name
from laggard.spikes import SpikeConfig, spikes
from laggard.whatif_custom import Change


def robust_outliers(ctx: Ctx, mask: np.ndarray, cfg: DiagnoseConfig) -> tuple[np.ndarray, np.ndarray]:
    """Ops in ``mask`` far above the median of their (rank, op type); returns (outlier mask, median)."""
    key = ctx.rank * (len(ctx.names) + 1) + ctx.name
    return spikes(ctx.w, key, mask, SpikeConfig(mad=cfg.gc_mad, rel=cfg.gc_rel))


def stalls(ctx: Ctx, cfg: DiagnoseConfig) -> tuple[np.ndarray, np.ndarray]:
    """Forward passes stalled the way a GC pause stalls them (far over their median, the backward
    of the same microbatch not): (mask, the median of each op's (rank, op type)). Other fixes keep
    these stalls as they are, so that a fix of the compute (a stage, the sequence balance) does not
    also take the GC pauses away and leave them nothing to explain."""
    fwd_out, fmed = robust_outliers(ctx, ctx.fwd, cfg)
    bwd_out, _ = robust_outliers(ctx, ctx.bwd, cfg)
    if fwd_out.any():
        rows = np.flatnonzero(fwd_out)
        fwd_out[rows[np.isin(ctx.microbatch_keys(fwd_out), ctx.microbatch_keys(bwd_out))]] = False
    return fwd_out, fmed


def keep_stalls(ctx: Ctx, cfg: DiagnoseConfig, w: np.ndarray) -> np.ndarray:
    """``w`` (a fix's weights) with the GC stalls put back on top of the fixed forward passes."""
    stalled, fmed = stalls(ctx, cfg)
    out = w.copy()
    extra = ctx.w[stalled] - fmed[stalled]
    out[stalled] = w[stalled] * fmed[stalled] / np.maximum(ctx.w[stalled], 1e-12) + extra
    return out


def detect(ctx: Ctx, cfg: DiagnoseConfig) -> list[Candidate]:
    fwd_out, fmed = robust_outliers(ctx, ctx.fwd, cfg)
    bwd_out, _ = robust_outliers(ctx, ctx.bwd, cfg)
    gc_ops = np.array([is_gc_name(n) for n in ctx.names] + [False])[ctx.name]
    gc_time = float(ctx.w[gc_ops].sum()) / max(len(ctx.base.graph.steps), 1)
    traced = gc_time >= cfg.gc_traced_share * ctx.T
    n_out = int(fwd_out.sum())
    if n_out < 2 and not traced:
        return []
    if n_out >= 2:
        # the backward of a stalled forward's microbatch should be normal
        kf, kb = ctx.microbatch_keys(fwd_out), ctx.microbatch_keys(bwd_out)
        paired = np.isin(kf, kb).mean()
        ranks = np.unique(ctx.rank[fwd_out])
        steps = np.unique(ctx.step[fwd_out])
        if paired > cfg.gc_paired_max or len(ranks) < 2 or len(steps) < 2:
            if not traced:
                return []
            n_out = 0
    changes = []
    if n_out:  # the forward op types that stalled, despiked (the same rule as above)
        changes += [Change(action="despike", selector=f"optype={ctx.names[int(c)]},kind=compute")
                    for c in np.unique(ctx.name[fwd_out])]
    changes += [Change(action="zero", selector=f"optype={ctx.names[int(c)]}") for c in np.unique(ctx.name[gc_ops])]
    if n_out:
        extra = ctx.w[fwd_out] - fmed[fwd_out]
        ev = (
            f"{n_out} forward passes stalled by +{1e3 * float(np.median(extra)):.1f} ms (median) on "
            f"{len(np.unique(ctx.rank[fwd_out]))} ranks across {len(np.unique(ctx.step[fwd_out]))} steps while the "
            "backward passes of the same microbatches ran normally"
        )
    else:
        ev = f"traced garbage collections take {1e3 * gc_time:.1f} ms per step"
    stalled = fwd_out if n_out else np.zeros(len(fwd_out), dtype=bool)
    finding = Finding(
        cause="gc",
        workers=[ctx.worker_of[int(r)] for r in np.unique(ctx.rank[stalled])][:16],
        steps=ctx.steps_of(stalled | gc_ops),
        evidence=ev,
        fix="enable planned GC: `laggard.mitigate.PlannedGC` (automatic GC off, collect on all ranks at the same step, "
        "e.g. every 200 steps or adaptively; gc.freeze() after start-up)",
    )
    return [Candidate(finding=finding, changes=changes, weights=weights_of(ctx, changes))]
