"""``launch-delay``: measured steps longer than the replay of the traced ops: untraced CPU gaps."""

from __future__ import annotations

import numpy as np

from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx
from laggard.diagnose.findings import Candidate, Finding


def detect(ctx: Ctx, cfg: DiagnoseConfig) -> list[Candidate]:
    ls = ctx.res.launch_slowdown
    if ls < cfg.threshold:
        return []
    base = ctx.base
    g = base.graph
    owner = np.repeat(np.arange(g.num_ops), np.diff(g.dep_ptr))
    ready = np.zeros(g.num_ops)
    if len(owner):
        np.maximum.at(ready, owner, base.end_s[g.dep_idx])
    has_dep = np.diff(g.dep_ptr) > 0
    gaps = np.where(has_dep & ~ctx.synced, np.maximum(base.start_s - ready, 0.0), 0.0)
    per_rank = np.bincount(np.searchsorted(ctx.ranks, ctx.rank), weights=gaps, minlength=len(ctx.ranks))
    per_type = np.bincount(ctx.name, weights=gaps, minlength=len(ctx.names))
    nsteps = max(len(g.steps), 1)
    worst = int(np.argmax(per_rank))
    finding = Finding(
        cause="launch-delay",
        workers=[ctx.worker_of[int(ctx.ranks[worst])]],
        evidence=(
            f"measured steps take {ctx.T_meas:.4g} s but the replay of the traced ops takes {ctx.T:.4g} s "
            f"({ls:.3f}x): untraced gaps of {1e3 * per_rank[worst] / nsteps:.1f} ms per step on rank "
            f"{int(ctx.ranks[worst])}, mostly before {ctx.names[int(np.argmax(per_type))]}"
        ),
        fix="find the CPU-side work between kernel launches (data loading, Python overhead, host contention): "
        "profile the host, overlap data loading, use CUDA graphs",
        score=min((ctx.T_meas - ctx.T) / ctx.gap, 1.0) if ctx.gap > 0 else 0.0,
        gain=ls,
    )
    finding.share = finding.score
    return [Candidate(finding=finding, weights=None)]
