"""Warm-up steps: the first steps of a job run slower (allocator, compilation, caches, data-loader
start-up) and are not the steady state a straggler analysis is about. Detected from step-time
settling: the leading steps whose span is well above the median of the rest are skipped."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from laggard.errors import LaggardError
from laggard.ops import Job


@dataclass(kw_only=True, slots=True)
class WarmupConfig:
    # a leading step is warm-up while it takes 1.5x the median step after it: steady-state steps of
    # the published traces and the demo job vary by under 10%; first steps of a real job (allocator,
    # compilation) by 2-30x
    settle_ratio: float = 1.5
    # never skip more than half the steps, and keep at least 3 (a verdict needs steps to compare)
    max_share: float = 0.5
    min_left: int = 3


def step_spans_s(job: Job) -> tuple[np.ndarray, np.ndarray]:
    """(steps in order, each step's span: last end - first start over every rank)."""
    step = job.column("step").astype(np.int64)
    start = job.column("start_ns").astype(np.int64)
    end = start + job.column("dur_ns").astype(np.int64)
    steps, inv = np.unique(step, return_inverse=True)
    lo = np.full(len(steps), np.iinfo(np.int64).max)
    hi = np.full(len(steps), np.iinfo(np.int64).min)
    np.minimum.at(lo, inv, start)
    np.maximum.at(hi, inv, end)
    return steps, (hi - lo) * 1e-9


def detect_warmup(job: Job, cfg: WarmupConfig | None = None) -> int:
    """How many leading steps are warm-up (0 when the steps are settled from the start)."""
    cfg = cfg or WarmupConfig()
    steps, span = step_spans_s(job)
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
    out.load_args["steps"] = ",".join(str(int(s)) for s in steps[n:]) if len(steps) - n <= 8 else f"{steps[n]}-{steps[-1]}"
    return out, [int(s) for s in steps[:n]]


__all__ = ["WarmupConfig", "detect_warmup", "skip_warmup", "step_spans_s"]
