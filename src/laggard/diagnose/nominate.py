"""Every detector's nominees for a job (not yet scored): one module per cause, listed here."""

from __future__ import annotations

from laggard.diagnose import comm, gc, launch, sequence, stage, worker
from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx
from laggard.diagnose.findings import Candidate

# the cause each detector nominates (``Finding.cause``)
CAUSE_OF = {"stage": "stage-imbalance", "worker": "worker", "sequence": "sequence-imbalance", "gc": "gc",
            "comm": "comm", "launch": "launch-delay"}


def candidates(ctx: Ctx, cfg: DiagnoseConfig, causes: tuple[str, ...] | None = None) -> list[Candidate]:
    """Every detector's nominees (not yet scored); with ``causes``, only those of the detectors of
    these causes (the others do not run: on a healthy 4,096-worker job the unused ones were 10 s)."""
    def wanted(detector: str) -> bool:
        return causes is None or CAUSE_OF[detector] in causes

    out: list[Candidate] = []
    if wanted("stage") or wanted("worker") or wanted("sequence"):
        loads = ctx.worker_loads()
        load = {int(r): float(x) for r, x in zip(ctx.ranks, loads, strict=True)}
        slow = worker.slow_workers(ctx, cfg, load)
        if wanted("stage"):
            out += stage.detect(ctx, cfg, load, slow)
        if wanted("worker"):
            out += worker.detect(ctx, cfg, load, slow)
        if wanted("sequence"):
            out += sequence.detect(ctx, cfg, slow)
    for name, det in (("gc", gc.detect), ("comm", comm.detect), ("launch", launch.detect)):
        if wanted(name):
            out += det(ctx, cfg)
    return out


__all__ = ["CAUSE_OF", "candidates"]
