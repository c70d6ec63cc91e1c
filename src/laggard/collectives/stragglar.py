"""StragglAR: AllReduce that uses the straggler's delay (Devraj et al., "Efficient AllReduce with
Stragglers", 2025), written from the paper's description for any number of ranks.

Phase 1 (only the on-time ranks): a ring ReduceScatter of ``n-1`` chunks among the ``n-1`` ranks that
are not the straggler, run while the straggler is still busy. Phase 2 (once it arrives): the schedule of
``laggard.collectives.schedule`` (``n-2+log2(n)`` rounds for powers of two), moving about ``s`` bytes per
rank instead of the ring's ``2(n-1)/n * s``.

Any rank may be named the straggler: the schedule's labels are mapped to group ranks at run time. The
result is exact (bit-identical on every rank, exact for integers) whoever really arrives last; a wrong
guess only costs time, because the real straggler then holds up phase 1.

Under NCCL (not tested here) phase 1 could be ``ncclReduceScatter`` on a pre-built sub-communicator per
possible straggler; the p2p version is used everywhere so it needs no sub-groups and no participation of
the straggler. See ``laggard.collectives.p2p`` for the other NCCL notes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.distributed as dist

from laggard.collectives.p2p import chunk_bounds, flat_view, group_ranks, reducer_for, run_plan, write_back
from laggard.collectives.schedule import RankPlan, rank_plan, stragglar_schedule
from laggard.errors import LaggardError


@dataclass(kw_only=True, slots=True)
class PhaseTimes:
    """Host timestamps (``time.perf_counter``, seconds) of one call on one rank, filled if passed in."""

    start_s: float = 0.0
    phase1_end_s: float = 0.0
    end_s: float = 0.0


@lru_cache(maxsize=256)
def _plans(num_ranks: int, label: int) -> tuple[RankPlan, RankPlan | None]:
    sched = stragglar_schedule(num_ranks)
    p1 = rank_plan(sched.phase1, label) if label < sched.straggler else None
    return rank_plan(sched.phase2, label), p1


def label_to_rank(num_ranks: int, straggler: int) -> list[int]:
    """Group rank of each schedule label: on-time labels follow the straggler cyclically, the last
    label is the straggler."""
    return [(straggler + 1 + i) % num_ranks for i in range(num_ranks - 1)] + [straggler]


def stragglar_allreduce(tensor: torch.Tensor, straggler: int | None = None,
                        group: dist.ProcessGroup | None = None, op: object = dist.ReduceOp.SUM, *,
                        times: PhaseTimes | None = None) -> torch.Tensor:
    """AllReduce ``tensor`` in place expecting ``straggler`` (a rank of ``group``; default: its last
    rank) to arrive last; returns ``tensor``.

    Every rank must pass the same ``straggler``. Works for any group size >= 2, any shape, dtype and
    number of elements (chunks may be uneven or empty). ``times`` records phase timestamps.
    """
    reducer = reducer_for(op)
    me, ranks = group_ranks(group)
    n = len(ranks)
    if me < 0:  # not a member of the group: nothing to do, as torch's collectives
        return tensor
    if times is not None:
        times.start_s = time.perf_counter()
    strag = n - 1 if straggler is None else straggler
    if isinstance(strag, bool) or not isinstance(strag, int) or not 0 <= strag < n:
        raise LaggardError(f"StragglAR: straggler must be a rank of the group (0..{n - 1}), got {straggler!r}")
    flat = flat_view(tensor)
    if n == 1 or flat.numel() == 0:
        if times is not None:
            times.phase1_end_s = times.end_s = time.perf_counter()
        return tensor
    labels = label_to_rank(n, strag)
    peers = [ranks[g] for g in labels]
    label = labels.index(me)
    phase2, phase1 = _plans(n, label)
    bounds = chunk_bounds(flat.numel(), n - 1)
    sizes = bounds[1:] - bounds[:-1]
    scratch = torch.empty(int(sizes.max()), dtype=flat.dtype, device=flat.device)
    if phase1 is not None:
        run_plan(flat, phase1, peers, bounds, reducer, group, scratch)
    if times is not None:
        times.phase1_end_s = time.perf_counter()
    run_plan(flat, phase2, peers, bounds, reducer, group, scratch)
    write_back(tensor, flat)
    if times is not None:
        times.end_s = time.perf_counter()
    return tensor
