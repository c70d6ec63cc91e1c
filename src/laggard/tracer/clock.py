"""One timeline for all ranks: per-rank clock offsets measured at start-up.

Three ways, all collective calls over the world group that every rank makes when its tracer
starts (``Tracer.__init__``, right after ``init_process_group``), never later: at start-up no
rank can be inside a sub-group collective, so alignment cannot deadlock with the job's own
communication. ``auto`` (the tracer's default) picks ``pingpong`` when the default group has a
gloo backend and ``collective`` otherwise (NCCL).

- ``barrier`` (what NDTimeline does): every rank leaves a barrier, reads its clock, and the
  readings are gathered. A barrier releases all ranks at nearly the same instant, so rank r's
  offset to rank 0 is ``t_0 - t_r``; the median over a few rounds rejects a round where one rank
  was descheduled. Only as good as the barrier's release skew (0.1-0.4 ms with four processes on
  two cores), and its error bound is a spread, not a guarantee.
- ``pingpong``: rank 0 exchanges a few timestamps with each rank in turn; the round with the
  shortest round trip gives ``offset = (t_send + t_recv) / 2 - t_remote``, off by at most half
  that round trip (tens of microseconds on one host). It needs host-blocking send/recv: true on
  gloo; on NCCL (send/recv return once enqueued) the device is synchronised after each transfer.
  Sequential in the ranks: about ``world_size x rounds`` round trips at start-up.
- ``collective``: every rank reads its clock just before and just after each of a few dozen small
  all_gathers (on NCCL the tensors live on the device and the device is synchronised around each
  call, so the readings bracket the transfer, not its enqueueing). Causality bounds each offset:
  nobody leaves a collective before everybody has entered it (``offsets_from_collective``). The
  error bound is guaranteed, not estimated; the cost is ``rounds`` collectives whatever the world
  size. Entry and exit times are exchanged by one last all_gather.

Rank 0's wall clock anchors the timeline, so aligned timestamps are nanoseconds since the Unix
epoch as rank 0 sees it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

ALIGN_ROUNDS = 7  # ping-pong and barrier rounds (pingpong: per rank, sequential)
# collective rounds: one small all_gather each (~1 ms on a busy host, well under on NCCL); on 2-4
# gloo ranks sharing 2 cores, 41 rounds found a quiet round for each bound where 15 often did not
COLLECTIVE_ROUNDS = 48
METHODS = ("auto", "pingpong", "barrier", "collective")


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


def offsets_from_collective(enter_ns: np.ndarray, exit_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank offsets to rank 0 from clock readings taken around collectives every rank joined.

    ``enter_ns``/``exit_ns`` have shape (rounds, world_size): rank r read ``enter_ns[k, r]`` just
    before collective k and ``exit_ns[k, r]`` just after it completed on that rank. No rank
    completes a collective before every rank has entered it, so in every round
    ``exit_r + offset_r >= enter_0`` and ``exit_0 >= enter_r + offset_r``: rank r's offset lies in
    ``[max_k(enter_0 - exit_r), min_k(exit_0 - enter_r)]`` whatever the network and the scheduler
    did. Each bound comes from its own least-delayed round (the min-delay estimate); the offset is
    the interval's midpoint and the error bound its half width. Bounds that contradict each other
    (a clock stepped during alignment) fall back to the midpoint of the round with the shortest
    collectives. Returns (offset per rank so that ``reading + offset`` is on rank 0's clock,
    error bound per rank).
    """
    s = np.asarray(enter_ns, dtype=np.int64)
    e = np.asarray(exit_ns, dtype=np.int64)
    if s.ndim != 2 or s.shape != e.shape or s.shape[0] < 1:
        raise ValueError("enter_ns and exit_ns must have the same shape (rounds, world_size)")
    if (e < s).any():
        raise ValueError("a collective cannot complete before it was entered (exit_ns < enter_ns)")
    lo = (s[:, :1] - e).max(axis=0)
    hi = (e[:, :1] - s).min(axis=0)
    est = lo + (hi - lo) // 2
    err = hi - est
    bad = lo > hi
    if bad.any():
        width = (e[:, :1] - s[:, :1]) + (e - s)  # each round's interval width, per rank
        k = np.argmin(width, axis=0)
        cols = np.arange(s.shape[1])
        mid = ((s[k, 0] + e[k, 0]) - (s[k, cols] + e[k, cols])) // 2
        est = np.where(bad, mid, est)
        err = np.where(bad, width[k, cols] // 2, err)
    est[0], err[0] = 0, 0
    return est, err


def local_sync(clock_ns: Callable[[], int]) -> ClockSync:
    """A single process: anchor the local clock to the wall clock."""
    return ClockSync(offset_ns=time.time_ns() - clock_ns(), offsets_ns=[0], error_ns=0, rounds=0)


def backend_name() -> str:
    """The default group's backend: ``gloo``, ``nccl``, or for a group with one per device type (what
    ``init_process_group()`` without a backend, and ``init_device_mesh``, make) its config, such
    as ``cpu:gloo,cuda:nccl`` (``get_backend`` says ``undefined`` there)."""
    import torch.distributed as dist

    name = str(dist.get_backend())
    if name == "undefined" and hasattr(dist, "get_backend_config"):
        name = str(dist.get_backend_config())
    return name


def resolve_method(method: str, backend: str) -> str:
    """``auto``: ping-pong where blocking host-side p2p exists (a gloo backend), collectives elsewhere."""
    if method not in METHODS:
        raise ValueError(f"clock alignment method must be one of {', '.join(METHODS)}, not {method!r}")
    if method != "auto":
        return method
    return "pingpong" if "gloo" in backend else "collective"


def align_clocks(clock_ns: Callable[[], int], *, method: str = "auto", rounds: int | None = None) -> ClockSync:
    """Collective over the default (world) group: every rank must call it, at the same point.

    Only called when the tracer starts (after ``init_process_group``, before training issues
    collectives on sub-groups), so it cannot interleave with the job's own collectives. Needs
    torch.distributed. With a CUDA-only backend (NCCL) the exchanged tensors live on the current
    device and the device is synchronised around every timed call, so host readings bracket the
    transfer itself rather than its enqueueing.
    """
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    backend = backend_name()
    method = resolve_method(method, backend)
    if rounds is None:
        rounds = COLLECTIVE_ROUNDS if method == "collective" else ALIGN_ROUNDS
    # gloo carries CPU tensors and blocks the host until done; a group with both backends (the
    # default of init_process_group() without one) uses NCCL where there is a GPU
    on_cpu = "gloo" in backend and not ("nccl" in backend and torch.cuda.is_available())
    device = torch.device("cpu") if on_cpu else torch.device("cuda", torch.cuda.current_device())

    def sync() -> None:
        if not on_cpu:
            torch.cuda.synchronize(device)

    if method == "barrier":
        offsets, errors = _by_barrier(clock_ns, rounds, world, device, sync)
    elif method == "pingpong":
        offsets, errors = _by_pingpong(clock_ns, rounds, world, rank, device, sync)
    else:
        offsets, errors = _by_collective(clock_ns, rounds, world, device, sync)
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


def _by_barrier(clock_ns: Callable[[], int], rounds: int, world: int, device: Any,
                sync: Callable[[], None]) -> tuple[np.ndarray, np.ndarray]:
    import torch
    import torch.distributed as dist

    out = torch.zeros(rounds, world, dtype=torch.int64, device=device)
    mine = torch.zeros(1, dtype=torch.int64, device=device)
    for k in range(rounds):
        dist.barrier()
        sync()
        mine.fill_(clock_ns())
        parts = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(parts, mine)
        out[k] = torch.cat(parts)
    offsets, spread = offsets_from_samples(out.cpu().numpy())
    return offsets, np.full(world, spread, dtype=np.int64)


def _by_pingpong(clock_ns: Callable[[], int], rounds: int, world: int, rank: int, device: Any,
                 sync: Callable[[], None]) -> tuple[np.ndarray, np.ndarray]:
    import torch
    import torch.distributed as dist

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
                sync()
                t[2, k] = clock_ns()
                t[1, k] = int(buf.item())
            offsets[r], errors[r] = offset_from_pingpong(t[0], t[1], t[2])
        elif rank == r:
            for _ in range(rounds):
                dist.recv(buf, 0)
                sync()  # NCCL: recv returns once enqueued; read the clock when the data is here
                buf.fill_(clock_ns())
                dist.send(buf, 0)
                sync()
    shared = torch.tensor(np.stack([offsets, errors]), dtype=torch.int64, device=device)
    dist.broadcast(shared, src=0)
    offsets, errors = (a.cpu().numpy() for a in shared)
    return offsets, errors


def _by_collective(clock_ns: Callable[[], int], rounds: int, world: int, device: Any,
                   sync: Callable[[], None]) -> tuple[np.ndarray, np.ndarray]:
    import torch
    import torch.distributed as dist

    mine = torch.zeros(1, dtype=torch.int64, device=device)
    parts = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)  # warm-up (NCCL builds its communicator here) and first release
    sync()
    times = np.zeros((2, rounds), dtype=np.int64)
    for k in range(rounds):
        # the previous collective released every rank at about the same time: entries are close
        times[0, k] = clock_ns()
        mine.fill_(times[0, k])
        dist.all_gather(parts, mine)
        sync()
        times[1, k] = clock_ns()
    local = torch.tensor(times, dtype=torch.int64, device=device)
    gathered = [torch.zeros_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)
    both = torch.stack(gathered).cpu().numpy()  # (world, 2, rounds)
    return offsets_from_collective(both[:, 0, :].T, both[:, 1, :].T)
