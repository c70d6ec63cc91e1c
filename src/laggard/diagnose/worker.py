"""``worker``: workers whose compute is well above their peers' (the other DP replicas of their
stage), every one of them named: one slow GPU or eight, on one stage, one DP rank or scattered.

Compared with the peers of their own stage, a heavy stage does not make its workers look slow, and
a worker is not hidden by another cause that slows a different part of the job (the S_w heatmap is
a replay of the whole job, where one slow pipeline hides another)."""

from __future__ import annotations

import numpy as np

from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx
from laggard.diagnose.findings import Candidate, Finding


def slow_workers(ctx: Ctx, cfg: DiagnoseConfig, load: dict[int, float]) -> list[int]:
    """Ranks computing ``worker_ratio`` x their stage peers, worst first. Every stage of one DP rank
    may be slow at once (one bad node): a DP rank's data cannot make it look so, since sequence
    imbalance is redrawn every step and the load is a median over steps."""
    ranks = sorted(load)
    stage = np.array([ctx.worker_of[r]["stage"] for r in ranks])
    lv = np.array([load[r] for r in ranks])
    if ctx.num_dp > 1:
        from laggard.diagnose.context import peer_median

        ref = peer_median(lv, stage)
    else:  # no DP replicas: compare with the other stages
        ref = np.full(len(lv), float(np.median(lv)))
    rel = lv / np.maximum(ref, 1e-12)
    keep = rel >= cfg.worker_ratio
    order = np.argsort(-rel[keep], kind="stable")
    return [int(r) for r in np.array(ranks)[keep][order]]


def detect(ctx: Ctx, cfg: DiagnoseConfig, load: dict[int, float], cells: list[int]) -> list[Candidate]:
    if not cells:
        return []
    on = np.isin(ctx.rank, cells) & ctx.compute
    ref, ok = ctx.group_mean(ctx.compute & ~np.isin(ctx.rank, cells), [ctx.name, ctx.pp])
    if not ok[on].any():
        return []
    from laggard.diagnose.context import existing, weights_of
    from laggard.whatif_custom import Change

    # each slow worker's compute set to its stage peers' mean, op type by op type
    changes = [Change(action="peer", selector=s)
               for r in cells for s in existing(ctx, [f"rank={r},kind=compute", f"rank={r},kind=other"])]
    sw = {x["rank"]: x["slowdown"] for x in ctx.res.by_worker}
    r0 = cells[0]
    mine = (ctx.rank == r0) & ctx.compute
    ratio = ctx.w[mine].sum() / max(ref[mine].sum(), 1e-12)
    wk = ctx.worker_of[r0]
    names = ", ".join(f"rank {r} (dp{ctx.worker_of[r]['dp_rank']}/pp{ctx.worker_of[r]['stage']})" for r in cells[:4])
    more = f" and {len(cells) - 4} more" if len(cells) > 4 else ""
    f = Finding(
        cause="worker",
        workers=[ctx.worker_of[r] for r in cells],
        stages=sorted({ctx.worker_of[r]["stage"] for r in cells}),
        evidence=(
            f"{names}{more}: S_w={sw[r0]:.3f} vs {np.median(list(sw.values())):.3f} (median worker); rank {r0}'s "
            f"compute takes {ratio:.2f}x what its peers on stage {wk['stage']} take"
        ),
        fix=(
            f"drain the node of rank {r0}" + (f" (and of {len(cells) - 1} more)" if len(cells) > 1 else "")
            + " and check it (thermal throttling, clocks, ECC errors, noisy neighbours)"
        ),
    )
    return [Candidate(finding=f, changes=changes, weights=weights_of(ctx, changes))]
