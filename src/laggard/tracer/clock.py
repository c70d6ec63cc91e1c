"""One timeline for all ranks: per-rank clock offsets measured at start-up.

Two ways, both collective calls every rank makes when its tracer starts:

- ``barrier`` (what NDTimeline does): every rank leaves a barrier, reads its clock, and the
  readings are gathered. A barrier releases all ranks at nearly the same instant, so rank r's
  offset to rank 0 is ``t_0 - t_r``; the median over a few rounds rejects a round where one rank
  was descheduled. Cheap at any scale, but only as good as the barrier's release skew (we saw
  0.1-0.4 ms with four processes on two cores).
- ``pingpong`` (default): rank 0 exchanges a few timestamps with each rank in turn; the round
  with the shortest round trip gives ``offset = (t_send + t_recv) / 2 - t_remote``, off by at most
  half that round trip (tens of microseconds on one host). Sequential in the ranks: about
  ``world_size x rounds`` round trips at start-up.

Rank 0's wall clock anchors the timeline, so aligned timestamps are nanoseconds since the Unix
epoch as rank 0 sees it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

ALIGN_ROUNDS = 7


@dataclass(kw_only=True, slots=True)
class ClockSync:
    """How to map this rank's clock to the job's timeline: ``aligned = local + offset_ns``."""

    offset_ns: int
    offsets_ns: list[int]  # every rank's offset to rank 0's clock (before the epoch anchor)
    error_ns: int  # how far the alignment may be off (largest over ranks)
    rounds: int
    method: str = "local"

    def to_json(self) -> dict[str, object]:
        return {"method": self.method, "offsets_to_rank0_ns": self.offsets_ns, "error_ns": self.error_ns,
                "rounds": self.rounds}


def offsets_from_samples(samples_ns: np.ndarray) -> tuple[np.ndarray, int]:
    """Per-rank offsets to rank 0 from clock readings taken just after barriers.

    ``samples_ns`` has shape (rounds, world_size): row k holds every rank's reading after barrier k.
    Returns (offset per rank, so that ``reading + offset`` is on rank 0's clock; the error bound:
    the largest spread of one rank's per-round offsets, ns).
    """
    s = np.asarray(samples_ns, dtype=np.int64)
    if s.ndim != 2 or s.shape[0] < 1:
        raise ValueError("samples_ns must have shape (rounds, world_size)")
    per_round = s[:, :1] - s  # (rounds, world)
    offsets = np.median(per_round, axis=0).round().astype(np.int64)
    spread = int((per_round.max(axis=0) - per_round.min(axis=0)).max()) if s.shape[0] > 1 else 0
    return offsets, spread


def offset_from_pingpong(t_send_ns: np.ndarray, t_remote_ns: np.ndarray, t_recv_ns: np.ndarray) -> tuple[int, int]:
    """Offset of a remote clock to the local one from ping-pong rounds (send, remote reading, receive).

    Returns (offset so that ``remote + offset`` is on the local clock; error bound: half the
    shortest round trip). The round with the shortest round trip is the least delayed one.
    """
    t1, t2, t3 = (np.asarray(a, dtype=np.int64) for a in (t_send_ns, t_remote_ns, t_recv_ns))
    rtt = t3 - t1
    k = int(np.argmin(rtt))
    return int((t1[k] + t3[k]) // 2 - t2[k]), int(rtt[k] // 2)


def local_sync(clock_ns: Callable[[], int]) -> ClockSync:
    """A single process: anchor the local clock to the wall clock."""
    return ClockSync(offset_ns=time.time_ns() - clock_ns(), offsets_ns=[0], error_ns=0, rounds=0)


def align_clocks(clock_ns: Callable[[], int], *, method: str = "pingpong", rounds: int = ALIGN_ROUNDS) -> ClockSync:
    """Collective over the default group: every rank must call it. Needs torch.distributed."""
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    if method == "barrier":
        out = torch.zeros(rounds, world, dtype=torch.int64, device=device)
        mine = torch.zeros(1, dtype=torch.int64, device=device)
        for k in range(rounds):
            dist.barrier()
            mine.fill_(clock_ns())
            parts = [torch.zeros_like(mine) for _ in range(world)]
            dist.all_gather(parts, mine)
            out[k] = torch.cat(parts)
        offsets, spread = offsets_from_samples(out.cpu().numpy())
        errors = np.full(world, spread, dtype=np.int64)
    elif method == "pingpong":
        offsets = np.zeros(world, dtype=np.int64)
        errors = np.zeros(world, dtype=np.int64)
        buf = torch.zeros(1, dtype=torch.int64, device=device)
        for r in range(1, world):
            if rank == 0:
                t = np.zeros((3, rounds), dtype=np.int64)
                for k in range(rounds):
                    t[0, k] = clock_ns()
                    dist.send(buf, r)
                    dist.recv(buf, r)
                    t[2, k] = clock_ns()
                    t[1, k] = int(buf.item())
                offsets[r], errors[r] = offset_from_pingpong(t[0], t[1], t[2])
            elif rank == r:
                for _ in range(rounds):
                    dist.recv(buf, 0)
                    buf.fill_(clock_ns())
                    dist.send(buf, 0)
        shared = torch.tensor(np.stack([offsets, errors]), dtype=torch.int64, device=device)
        dist.broadcast(shared, src=0)
        offsets, errors = (a.cpu().numpy() for a in shared)
    else:
        raise ValueError(f"clock alignment method must be pingpong or barrier, not {method!r}")
    # rank 0's wall-clock epoch minus its clock, shared by all
    anchor = torch.tensor([time.time_ns() - clock_ns()], dtype=torch.int64, device=device)
    dist.broadcast(anchor, src=0)
    return ClockSync(
        offset_ns=int(offsets[rank]) + int(anchor.item()),
        offsets_ns=[int(o) for o in offsets],
        error_ns=int(errors.max()) if len(errors) else 0,
        rounds=rounds,
        method=method,
    )
