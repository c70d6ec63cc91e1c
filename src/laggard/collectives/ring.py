"""Ring AllReduce over point-to-point ops: the like-for-like baseline for StragglAR.

Same building blocks as StragglAR (``batch_isend_irecv`` rounds, the same chunking and reduction
code), so a comparison measures the algorithm, not the library. ``2(n-1)`` rounds of ``s/n`` bytes:
a ReduceScatter then an AllGather; every rank must have arrived before the first round completes.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.distributed as dist

from laggard.collectives.p2p import chunk_bounds, flat_view, group_ranks, reducer_for, run_plan, write_back
from laggard.collectives.schedule import RankPlan, rank_plan, ring_allreduce_schedule


@lru_cache(maxsize=64)
def _ring_plan(num_ranks: int, label: int) -> RankPlan:
    return rank_plan(ring_allreduce_schedule(num_ranks), label)


def ring_allreduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                   op: object = dist.ReduceOp.SUM) -> torch.Tensor:
    """AllReduce ``tensor`` in place with a ring of p2p transfers; returns ``tensor``.

    Any shape, dtype and size (chunks may be uneven or empty). Every rank of ``group`` must call it.
    """
    reducer = reducer_for(op)
    me, ranks = group_ranks(group)
    n = len(ranks)
    if me < 0:  # not a member of the group: nothing to do, as torch's collectives
        return tensor
    flat = flat_view(tensor)
    if n > 1 and flat.numel() > 0:
        run_plan(flat, _ring_plan(n, me), ranks, chunk_bounds(flat.numel(), n), reducer, group)
    write_back(tensor, flat)
    return tensor
