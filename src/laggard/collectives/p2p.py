"""Run a round-based schedule over ``torch.distributed`` point-to-point ops (``batch_isend_irecv``).

Shared by the ring baseline and StragglAR. One round = at most one ``isend`` and one ``irecv`` per rank,
posted together and waited on; a received chunk is either added (into a scratch buffer first, so a
rank may send and reduce the same chunk in one round) or received in place.

Backends. Tested on gloo (CPU). Under NCCL the same code runs with CUDA tensors; what differs:
``batch_isend_irecv`` becomes one ``ncclGroupStart/End`` per round on NCCL's stream and ``wait()``
only orders the current CUDA stream after it (the reduction kernel then runs on the current stream, so
the order is still right); the first p2p batch of a group must include every rank (do a warm-up
collective first); and host timestamps need ``torch.cuda.synchronize()`` or CUDA events.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

from laggard.collectives.schedule import RankPlan
from laggard.errors import LaggardError

Reducer = Callable[[torch.Tensor, torch.Tensor], None]

_REDUCERS: dict[object, Reducer] = {
    dist.ReduceOp.SUM: lambda acc, x: acc.add_(x),
    dist.ReduceOp.PRODUCT: lambda acc, x: acc.mul_(x),
    dist.ReduceOp.MAX: lambda acc, x: torch.maximum(acc, x, out=acc),
    dist.ReduceOp.MIN: lambda acc, x: torch.minimum(acc, x, out=acc),
}


def reducer_for(op: object) -> Reducer:
    """The in-place reduction for ``op`` (SUM, PRODUCT, MAX, MIN: commutative, so every rank that
    finalises a chunk gets the same bits)."""
    for key, fn in _REDUCERS.items():
        if op == key:
            return fn
    raise LaggardError(f"unsupported reduce op {op!r}: use SUM, PRODUCT, MAX or MIN")


def chunk_bounds(numel: int, num_chunks: int) -> np.ndarray:
    """Element offsets of ``num_chunks`` near-equal chunks (sizes differ by at most one)."""
    return (np.arange(num_chunks + 1, dtype=np.int64) * int(numel)) // int(num_chunks)


def group_ranks(group: dist.ProcessGroup | None) -> tuple[int, list[int]]:
    """(this process's rank in ``group`` or -1 if it is not a member, the global rank of every group rank)."""
    if not dist.is_initialized():
        raise LaggardError("torch.distributed is not initialised: call init_process_group first")
    g = group if group is not None else dist.group.WORLD
    ranks = dist.get_process_group_ranks(g)
    return dist.get_rank(g), list(ranks)


def flat_view(tensor: torch.Tensor) -> torch.Tensor:
    """A 1-D contiguous tensor sharing storage with ``tensor`` when possible (else a copy)."""
    if not isinstance(tensor, torch.Tensor):
        raise LaggardError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    return tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)


def write_back(tensor: torch.Tensor, flat: torch.Tensor) -> None:
    """Copy the result back if ``flat`` is not a view of ``tensor``."""
    if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(flat.view(tensor.shape))


def run_plan(flat: torch.Tensor, plan: RankPlan, peers: list[int], bounds: np.ndarray,
             reducer: Reducer, group: dist.ProcessGroup | None, scratch: torch.Tensor | None = None) -> None:
    """Execute one rank's plan on ``flat`` (chunked by ``bounds``); ``peers[label]`` is a global rank."""
    if plan.num_rounds == 0:
        return
    sizes = np.diff(bounds)
    if scratch is None and plan.recv_reduce.any():
        scratch = torch.empty(int(sizes.max(initial=0)), dtype=flat.dtype, device=flat.device)
    send_peer, send_chunk = plan.send_peer.tolist(), plan.send_chunk.tolist()
    recv_peer, recv_chunk, recv_reduce = plan.recv_peer.tolist(), plan.recv_chunk.tolist(), plan.recv_reduce.tolist()
    b = bounds.tolist()
    for r in range(plan.num_rounds):
        ops = []
        if send_peer[r] >= 0:
            c = send_chunk[r]
            if b[c + 1] > b[c]:
                ops.append(dist.P2POp(dist.isend, flat[b[c]:b[c + 1]], peers[send_peer[r]], group))
        target = None
        if recv_peer[r] >= 0:
            c = recv_chunk[r]
            if b[c + 1] > b[c]:
                if recv_reduce[r]:
                    assert scratch is not None
                    target = flat[b[c]:b[c + 1]]
                    buf = scratch[: b[c + 1] - b[c]]
                else:
                    buf = flat[b[c]:b[c + 1]]
                ops.append(dist.P2POp(dist.irecv, buf, peers[recv_peer[r]], group))
        if not ops:
            continue
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        if target is not None:
            reducer(target, buf)
