"""Every detector's nominees for a job (not yet scored): one module per cause, listed here."""

from __future__ import annotations

from laggard.diagnose import comm, extra, gc, launch, sequence, stage, worker
from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx
from laggard.diagnose.findings import Candidate

# the cause each detector nominates (``Finding.cause``)
CAUSE_OF = {"stage": "stage-imbalance", "worker": "worker", "sequence": "sequence-imbalance", "gc": "gc",
            "comm": "comm", "launch": "launch-delay", "extra": "extra-work"}


def candidates(ctx: Ctx, cfg: DiagnoseConfig, causes: tuple[str, ...] | None = None,
               stalled: set[int] | None = None) -> list[Candidate]:
    """Every detector's nominees (not yet scored); with ``causes``, only those of the detectors of
    these causes (the others do not run: on a large job each one is a pass over every op, wasted
    where its nominees would be dropped).
    ``stalled``: ranks already found stalled in host time (on the job with that stall fixed, their
    peers' compute still holds what the stall cost them: ``worker.yardsticks``)."""
    def wanted(detector: str) -> bool:
        return causes is None or CAUSE_OF[detector] in causes

    out: list[Candidate] = []
    # first: the ranks stalled in host time are no yardstick of their peers' compute on a CPU host
    hosts = launch.detect(ctx, cfg) if wanted("launch") else []
    if wanted("stage") or wanted("worker") or wanted("sequence"):
        loads = ctx.worker_loads()
        load = {int(r): float(x) for r, x in zip(ctx.ranks, loads, strict=True)}
        stalled = (stalled or set()) | set(launch.own_ranks(hosts))
        slow = worker.slow_workers(ctx, cfg, load, stalled=stalled)
        if wanted("stage"):
            out += stage.detect(ctx, cfg, load, slow)
        if wanted("worker"):
            out += worker.detect(ctx, cfg, load, slow)
        if wanted("sequence"):
            out += sequence.detect(ctx, cfg, slow)
    for name, det in (("gc", gc.detect), ("comm", comm.detect), ("extra", extra.detect)):
        if wanted(name):
            out += det(ctx, cfg)
    return out + hosts


__all__ = ["CAUSE_OF", "candidates"]
