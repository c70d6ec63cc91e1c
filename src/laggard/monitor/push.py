"""``laggard monitor push``: stream an existing trace into a collector as if the job were running.

Each rank's ops are cut into one batch per step (in step order, ranks interleaved), with the
pace of the trace's own step times divided by ``speed`` (0: as fast as possible).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from laggard.optable.ops import Job, to_numpy
from laggard.wire.batch import encode_batch
from laggard.wire.client import Client


@dataclass(kw_only=True, slots=True)
class PushResult:
    num_batches: int
    num_ops: int
    num_duplicates: int
    wall_s: float


def step_batches(job: Job) -> list[tuple[int, int, pa.Table]]:
    """(step, rank, ops) in step order: what each rank would have sent after each step."""
    t = job.table
    step, rank = to_numpy(t.column("step")), to_numpy(t.column("rank"))
    order = np.lexsort((rank, step))
    t = t.take(pa.array(order))
    step, rank = step[order], rank[order]
    cut = np.flatnonzero((np.diff(step) != 0) | (np.diff(rank) != 0)) + 1
    bounds = np.concatenate([[0], cut, [len(step)]])
    return [(int(step[a]), int(rank[a]), t.slice(a, b - a)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def push_job(job: Job, client: Client, *, job_id: str, speed: float = 1.0,
             on_step: Callable[[int, int], None] | None = None) -> PushResult:
    t0 = time.perf_counter()
    batches = step_batches(job)
    steps = sorted({s for s, _, _ in batches})
    start, dur = to_numpy(job.table.column("start_ns")), to_numpy(job.table.column("dur_ns"))
    st = to_numpy(job.table.column("step"))
    seqs: dict[int, int] = {}
    n_ops = n_dup = 0
    meta = job.meta.to_json()
    i = 0
    for k, s in enumerate(steps):
        if speed > 0:
            m = st == s
            step_s = float((start[m] + dur[m]).max() - start[m].min()) * 1e-9
            time.sleep(max(step_s, 0.0) / speed)
        while i < len(batches) and batches[i][0] == s:
            _, r, table = batches[i]
            seq = seqs.get(r, 0)
            seqs[r] = seq + 1
            ans = client.post_batch(encode_batch(table, job_id=job_id, rank=r, seq=seq, meta=meta))
            n_ops += ans.get("accepted", 0)
            n_dup += bool(ans.get("duplicate"))
            i += 1
        if on_step is not None:
            on_step(k + 1, len(steps))
    return PushResult(num_batches=len(batches), num_ops=n_ops, num_duplicates=n_dup, wall_s=time.perf_counter() - t0)
