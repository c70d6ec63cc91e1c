"""Warm-up steps: the first steps of a job run slower (allocator, compilation, caches, data-loader
start-up) and are not the steady state a straggler analysis is about. Detected from step-time
settling: the leading steps in which the typical rank computes far longer than in the rest are
skipped. Warm-up slows every rank; a straggler in the first steps (a GC pause, one slow worker)
slows one rank and stretches the others' collectives, so neither the step's span nor any one rank's
comm time is the measure (in a pipeline, or with pauses on several ranks, every rank's comm holds
waits). The step's typical time is the median over ranks of each rank's compute time and of how
late it entered the step (its first op after the step's earliest; the trace's first step only):
processes start seconds apart in import, process-group set-up and model build, so the first step
begins late on most ranks, where a straggler enters late alone."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from laggard.errors import LaggardError
from laggard.optable.ops import COMM_KINDS, Job, unique_inverse


@dataclass(kw_only=True, slots=True)
class WarmupConfig:
    # a leading step is warm-up while its typical rank computes 1.5x as long as in the median step
    # after it: steady-state steps of the published traces and the demo job vary by under 10%; first
    # steps of a real job (allocator, compilation) by 2-30x
    settle_ratio: float = 1.5
    # never skip more than half the steps, and keep at least 3 (a verdict needs steps to compare)
    max_share: float = 0.5
    min_left: int = 3


def typical_compute_s(job: Job) -> tuple[np.ndarray, np.ndarray]:
    """(steps in order, the median over ranks of each rank's non-communication time in the step and
    its lateness into the trace's first step; every op's time where the trace has no other op)."""
    step = job.column("step").astype(np.int64, copy=False)  # read only here: no copies of the columns
    rank = job.column("rank").astype(np.int64, copy=False)
    dur = job.column("dur_ns").astype(np.float64)
    code, labels = job.codes("kind")
    comm = np.isin(code, [i for i, k in enumerate(labels) if k in COMM_KINDS])
    use = ~comm if (~comm).any() else np.ones(len(step), dtype=bool)
    steps, sinv = unique_inverse(step)
    ranks, rinv = unique_inverse(rank)
    cell = sinv[use] * len(ranks) + rinv[use]
    shape = (len(steps), len(ranks))
    busy = np.bincount(cell, weights=dur[use], minlength=shape[0] * shape[1]).reshape(shape)
    # lateness in the trace's first step only: a later step's late ranks are the previous step's tail
    # (a host stall before the step, a straggler), which the step's compute already speaks for
    head = np.flatnonzero(sinv == 0)
    entered = np.full(len(ranks), np.inf)  # each rank's first op of the step (inf: it ran none)
    np.minimum.at(entered, rinv[head], job.column("start_ns")[head].astype(np.float64))
    if len(head):
        busy[0] += np.where(np.isfinite(entered), entered - entered.min(), 0.0)
    return steps, np.median(busy, axis=1) * 1e-9


def detect_warmup(job: Job, cfg: WarmupConfig | None = None) -> int:
    """How many leading steps are warm-up (0 when the steps are settled from the start)."""
    cfg = cfg or WarmupConfig()
    steps, span = typical_compute_s(job)
    limit = min(int(len(steps) * cfg.max_share), len(steps) - cfg.min_left)
    n = 0
    while n < limit and span[n] > cfg.settle_ratio * float(np.median(span[n + 1:])):
        n += 1
    return n


def skip_warmup(job: Job, skip_steps: int | None = None, cfg: WarmupConfig | None = None) -> tuple[Job, list[int]]:
    """The job without its first ``skip_steps`` steps (None: detected); returns (job, skipped steps)."""
    if skip_steps is not None and skip_steps < 0:
        raise LaggardError(f"--skip-steps must be >= 0 (got {skip_steps})")
    steps = np.unique(job.column("step"))
    n = detect_warmup(job, cfg) if skip_steps is None else skip_steps
    if n == 0:
        return job, []
    if n >= len(steps):
        raise LaggardError(f"--skip-steps {n}: the trace has only {len(steps)} step(s) ({steps[0]} to {steps[-1]})")

    import pyarrow as pa

    keep = np.isin(job.column("step"), steps[n:])
    out = Job(table=job.table.filter(pa.array(keep)), meta=job.meta, warnings=list(job.warnings),
              load_args=dict(job.load_args))
    # a finding's command must replay the same steps
    out.load_args["steps"] = (",".join(str(int(s)) for s in steps[n:]) if len(steps) - n <= 8
                              else f"{steps[n]}-{steps[-1]}")
    return out, [int(s) for s in steps[:n]]


__all__ = ["WarmupConfig", "detect_warmup", "skip_warmup", "typical_compute_s"]
