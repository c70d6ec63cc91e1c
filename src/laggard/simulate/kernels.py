"""Vectorised Monte-Carlo kernels, one per synchronisation policy.

Every kernel simulates a chunk of ``n`` trials at once (arrays of shape (n, K) or (n, steps, K))
and returns per-trial sums that ``policies`` aggregates:

* ``step``      the step (barrier) time of the trial,
* ``busy``      GPU-seconds of compute launched (including backup copies and dropped work),
* ``useful``    GPU-seconds of compute that counts toward the update,
* ``capacity``  GPU-seconds available (machines x time), so idle = 1 - busy / capacity.

Multi-step kernels (SSP, async) return per-run sums and the per-step increments of the global
progress (the time at which every worker has finished step i) in ``increments``.
"""

from __future__ import annotations

import math

import numpy as np

from laggard.simulate.base import Distribution

Out = dict[str, np.ndarray]


def bsp(dist: Distribution, rng: np.random.Generator, n: int, k: int) -> Out:
    """Bulk-synchronous: a barrier every step, the step takes the slowest worker's time."""
    t = dist.sample_jobs(rng, n, k)
    step = t.max(axis=1)
    work = t.sum(axis=1)
    return {"step": step, "busy": work, "useful": work, "capacity": k * step}


def backup(dist: Distribution, rng: np.random.Generator, n: int, k: int, copies: int) -> Out:
    """Every worker's task also runs on ``copies`` backup machines; the first to finish wins.

    The others are cancelled then, so each of the copies+1 machines is busy for the min time.
    """
    t = dist.sample_jobs(rng, n, k)
    if copies:
        np.minimum(t, dist.sample(rng, (n, k, copies)).min(axis=2), out=t)
    step = t.max(axis=1)
    useful = t.sum(axis=1)
    return {"step": step, "busy": (copies + 1) * useful, "useful": useful, "capacity": (copies + 1) * k * step}


def speculate(
    dist: Distribution, rng: np.random.Generator, n: int, k: int, multiplier: float, quantile: float
) -> Out:
    """Spark-style speculation: once a ``quantile`` of the tasks has finished, every task still
    running past ``multiplier`` x the median finished duration gets one copy on a free worker.

    The copy starts at max(time the quantile is reached, multiplier x median) and the task ends
    when the original or the copy finishes; the copy runs on a worker that finished already.
    """
    t = dist.sample_jobs(rng, n, k)
    copy = dist.sample(rng, (n, k))
    num_done = max(1, math.floor(quantile * k))
    order = np.sort(t, axis=1)
    reached = order[:, num_done - 1]
    median = np.median(order[:, :num_done], axis=1)
    launch = np.maximum(reached, multiplier * median)[:, None]
    late = t > launch
    done = np.where(late, np.minimum(t, launch + copy), t)
    copy_busy = np.where(late, done - launch, 0.0).sum(axis=1)
    step = done.max(axis=1)
    useful = done.sum(axis=1)
    return {"step": step, "busy": useful + copy_busy, "useful": useful, "capacity": k * step,
            "num_copies": late.sum(axis=1).astype(np.float64)}


def drop(dist: Distribution, rng: np.random.Generator, n: int, k: int, num_drop: int) -> Out:
    """The barrier waits for the fastest K - m workers; the m slowest are cut off (work lost)."""
    t = dist.sample_jobs(rng, n, k)
    keep = k - num_drop
    step = np.partition(t, keep - 1, axis=1)[:, keep - 1]
    counted = t <= step[:, None]
    useful = np.where(counted, t, 0.0).sum(axis=1)
    busy = np.minimum(t, step[:, None]).sum(axis=1)
    return {"step": step, "busy": busy, "useful": useful, "capacity": k * step}


def greedy_finish(dur: np.ndarray, total: int) -> np.ndarray | None:
    """Finish time of every worker when ``total`` pieces are handed out greedily.

    ``dur`` is (n, L, K): the durations of the pieces worker w would run, in order. Greedy
    assignment (the next piece goes to the worker that is free first) starts exactly the
    ``total`` earliest start times, where piece j of worker w would start when its piece j-1
    ends. So the threshold tau is the total-th smallest start, worker w runs its pieces starting
    at or before tau, and finishes when the last of them ends. Returns (n, K), or None when some
    worker would need more than L pieces (draw longer streams).
    """
    n, length, k = dur.shape
    if total >= length * k:
        return None
    fin = np.cumsum(dur, axis=1)
    start = fin - dur
    tau = np.partition(start.reshape(n, length * k), total - 1, axis=1)[:, total - 1]
    taken = (start <= tau[:, None, None]).sum(axis=1)  # pieces run by each worker, (n, K)
    if (taken >= length).any():
        return None
    return np.take_along_axis(fin, (taken - 1)[:, None, :], axis=1)[:, 0, :]


def overdecompose(
    dist: Distribution, rng: np.random.Generator, n: int, k: int, pieces: int, *, max_rounds: int = 6
) -> Out:
    """The step's work is cut into K x p pieces (1/p of a worker step each), handed out greedily
    to whichever worker is free first (dynamic assignment, like a work queue).

    Every worker gets a stream of L pieces drawn like steps of that worker (a trace keeps its
    persistent speed), each divided by p; see ``greedy_finish``. If some worker would need more
    than L pieces, the chunk is drawn again with L doubled.
    """
    length = 2 * pieces + 4
    for _ in range(max_rounds):
        dur = dist.sample_steps(rng, n, length, k)  # (n, L, K)
        dur *= 1.0 / pieces
        last = greedy_finish(dur, k * pieces)
        if last is not None:
            step = last.max(axis=1)
            work = last.sum(axis=1)
            return {"step": step, "busy": work, "useful": work, "capacity": k * step}
        length *= 2
    raise RuntimeError("over-decomposition: a worker needed more pieces than the simulation allows")


def ssp_progress(t: np.ndarray, staleness: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Stale-synchronous progress of runs with worker times ``t`` (n, steps, K).

    A worker may start step i once every worker has finished step i - 1 - s. Returns
    ``done_all`` (n, steps), the time every worker has finished step i, and ``wait`` (n,), the
    worker-seconds spent blocked. ``staleness=None``: no constraint (fully asynchronous).
    """
    n, num_steps, k = t.shape
    done_all = np.empty((n, num_steps))
    wait = np.zeros(n)
    if staleness is None:
        done_all[:] = np.cumsum(t, axis=1).max(axis=2)
        return done_all, wait
    prev = np.zeros((n, k))
    for i in range(num_steps):
        gate = i - 1 - staleness
        if gate >= 0:
            start = np.maximum(prev, done_all[:, gate][:, None])
            wait += (start - prev).sum(axis=1)
        else:
            start = prev
        prev = start + t[:, i, :]
        done_all[:, i] = prev.max(axis=1)
    return done_all, wait


def stale_synchronous(
    dist: Distribution, rng: np.random.Generator, n: int, k: int, num_steps: int, staleness: int | None
) -> Out:
    """Stale-synchronous parallel over runs of ``num_steps`` steps (see ``ssp_progress``): s = 0
    is BSP, ``staleness=None`` fully asynchronous. One Python iteration per step, vectorised over
    runs and workers. The run's step time is its wall-clock per step.
    """
    t = dist.sample_steps(rng, n, num_steps, k)  # (n, steps, K)
    done_all, wait = ssp_progress(t, staleness)
    # idle = blocked time before steps 1.. over (blocked + busy of the steps before them)
    busy_counted = t[:, :-1, :].sum(axis=(1, 2))
    return {
        "step": done_all[:, -1] / num_steps,
        "busy": busy_counted,
        "useful": busy_counted,
        "capacity": busy_counted + wait,
        "increments": np.diff(done_all, axis=1, prepend=0.0),
    }
