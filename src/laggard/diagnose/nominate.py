"""Every detector's nominees for a job (not yet scored): one module per cause, listed here."""

from __future__ import annotations

from laggard.diagnose import comm, gc, launch, sequence, stage, worker
from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx
from laggard.diagnose.findings import Candidate


def candidates(ctx: Ctx, cfg: DiagnoseConfig) -> list[Candidate]:
    """Every detector's nominees (not yet scored)."""
    loads = ctx.worker_loads()
    load = {int(r): float(x) for r, x in zip(ctx.ranks, loads, strict=True)}
    slow = worker.slow_workers(ctx, cfg, load)
    out = stage.detect(ctx, cfg, load, slow) + worker.detect(ctx, cfg, load, slow) + sequence.detect(ctx, cfg, slow)
    for det in (gc.detect, comm.detect, launch.detect):
        out += det(ctx, cfg)
    return out


__all__ = ["candidates"]
