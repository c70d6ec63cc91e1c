"""``gc``: rare long forward passes on different ranks at different steps, the backward passes of
the same microbatches untouched; or garbage collections traced as their own ops. Where the trace
records every collection (the Tracer's), a stall must have one inside it; where the importer took
the pauses out of the ops (CPU profiler traces: ``HOST_GAP_CUT_KEY``), a stretched forward is the
busy host, and collections, which no op records there, are not named."""

from __future__ import annotations

import numpy as np

from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx, weights_of
from laggard.diagnose.findings import Candidate
from laggard.engine.spikes import SpikeConfig, spikes
from laggard.results.diagnosis import Finding
from laggard.whatif.custom import Change


def robust_outliers(ctx: Ctx, mask: np.ndarray, cfg: DiagnoseConfig) -> tuple[np.ndarray, np.ndarray]:
    """Ops in ``mask`` far above what they should take (``laggard.engine.spikes``: the median of their
    (rank, op type); a forward pass against its own backward); returns (outlier mask, expected)."""
    key = ctx.rank * (len(ctx.names) + 1) + ctx.name
    return spikes(ctx.w, key, mask, SpikeConfig(mad=cfg.gc_mad, rel=cfg.gc_rel), partner=ctx.partner)


def detect(ctx: Ctx, cfg: DiagnoseConfig) -> list[Candidate]:
    fwd_out, fmed = robust_outliers(ctx, ctx.fwd, cfg)
    bwd_out, _ = robust_outliers(ctx, ctx.bwd, cfg)
    gc_ops = ctx.gc
    gc_time = float(ctx.w[gc_ops].sum()) / max(len(ctx.base.graph.steps), 1)
    traced = gc_time >= cfg.gc_traced_share * ctx.T
    if records_collections(ctx):  # a stall no collection ran in is not GC
        fwd_out &= _collected_in(ctx, fwd_out, fmed, gc_ops, cfg.gc_traced_cover)
    elif ctx.host_passes:
        # the importer took the pauses inside an op out of it (host time, before the op): what still
        # stretches a forward pass is the host being busy, not a collection, which no op records here
        fwd_out[:] = False
    n_out = int(fwd_out.sum())
    if n_out < 2 and not traced:
        return []
    if n_out >= 2:
        # the backward of a stalled forward's microbatch should be normal (a forward judged against
        # its own backward is a stall by construction; the check is for those without one)
        alone = fwd_out & (ctx.partner < 0)
        kf, kb = ctx.microbatch_keys(alone), ctx.microbatch_keys(bwd_out)
        paired = np.isin(kf, kb).sum() / n_out
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
            + ("; traced garbage collections ran inside them" if records_collections(ctx) else "")
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


def records_collections(ctx: Ctx) -> bool:
    """Whether the trace has every garbage collection as an op: the Tracer's, unless it ran with
    ``record_gc=False`` (traces from before job.json said so were all taken with it on). A ``gc`` op
    elsewhere (Megatron's timers) is one point of the step, not every collection."""
    meta = ctx.base.job.meta
    return meta.source == "laggard-tracer" and bool(meta.extra.get("record_gc", True))


def _collected_in(ctx: Ctx, stalled: np.ndarray, expected: np.ndarray, gc_ops: np.ndarray,
                  cover: float) -> np.ndarray:
    """Which ``stalled`` ops spent at least ``cover`` of their excess (over ``expected``) in traced
    collections on their own rank. A trace that records collections (the Tracer's ``record_gc``: every
    one, through ``gc.callbacks``) tells a GC pause from the other things that stall a forward pass on
    a busy host (the process descheduled, a noisy neighbour): where ranks share too few cores, such
    stalls are as long as a GC pause, with no collection or only a brief one inside them, and without
    this check they read as GC on healthy ranks."""
    start, end = ctx.base.start_s, ctx.base.end_s
    g = np.flatnonzero(gc_ops)  # the collections, once (a few per rank and step), not every op per stall
    g_rank, g_start, g_end = ctx.rank[g], start[g], end[g]
    out = np.zeros(len(stalled), dtype=bool)
    for i in np.flatnonzero(stalled):
        on = (g_rank == ctx.rank[i]) & (g_end > start[i]) & (g_start < end[i])
        inside = float(np.sum(np.minimum(g_end[on], end[i]) - np.maximum(g_start[on], start[i])))
        out[i] = inside >= cover * (ctx.w[i] - expected[i])
    return out
