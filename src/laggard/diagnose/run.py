"""The diagnosis's front door: every detector's candidates, scored jointly into findings and a
verdict (``diagnose``); ``too_little`` says when a job cannot be judged."""

from __future__ import annotations

from typing import TYPE_CHECKING

from laggard.diagnose import comm, gc, launch, sequence, stage, worker
from laggard.diagnose.config import DiagnoseConfig
from laggard.diagnose.context import Ctx
from laggard.diagnose.explain import attribute
from laggard.diagnose.findings import Candidate
from laggard.results.diagnosis import Diagnosis

if TYPE_CHECKING:
    from laggard.results.analysis import Analysis


def candidates(ctx: Ctx, cfg: DiagnoseConfig) -> list[Candidate]:
    """Every detector's nominees (not yet scored)."""
    loads = ctx.worker_loads()
    load = {int(r): float(x) for r, x in zip(ctx.ranks, loads, strict=True)}
    slow = worker.slow_workers(ctx, cfg, load)
    out = stage.detect(ctx, cfg, load, slow) + worker.detect(ctx, cfg, load, slow) + sequence.detect(ctx, cfg, slow)
    for det in (gc.detect, comm.detect, launch.detect):
        out += det(ctx, cfg)
    return out


def diagnose(res: Analysis, *, threshold: float | None = None, config: DiagnoseConfig | None = None) -> Diagnosis:
    """Findings for an analysed job, strongest first; a healthy job (slowdown below ``threshold``)
    gets none."""
    if res.base is None:
        raise ValueError("diagnose needs the Analysis of a job (with its base)")
    # the threshold in force: ``threshold``, else the config's, else HEALTHY_THRESHOLD (both given
    # and different: an error, never one silently over the other)
    cfg = (config or DiagnoseConfig()).with_threshold(threshold)
    reason = too_little(res, cfg)
    if reason:
        return Diagnosis(verdict="not enough to judge", threshold=cfg.threshold, findings=[], reason=reason)
    ctx = Ctx(res)
    total = ctx.T_meas / ctx.T_ideal if ctx.T_ideal > 0 else 1.0
    if max(res.slowdown, res.replay_fidelity, total) < cfg.threshold or ctx.gap <= 0:
        return Diagnosis(verdict="healthy", threshold=cfg.threshold, findings=[])
    return attribute(ctx, candidates(ctx, cfg), cfg)


def too_little(res: Analysis, cfg: DiagnoseConfig) -> str:
    """Why the job cannot be judged (empty when it can): straggling needs workers to compare and
    steps to compare them over."""
    if res.num_workers < cfg.min_workers:
        return (f"{res.num_workers} worker: straggling is one worker waiting for another, so a job needs at least "
                f"{cfg.min_workers} to judge")
    if len(res.steps) < cfg.min_steps:
        return f"{len(res.steps)} step(s) after warm-up: at least {cfg.min_steps} are needed to judge"
    return ""


__all__ = ["candidates", "diagnose", "too_little"]
