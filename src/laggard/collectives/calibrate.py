"""Measure the cost-model parameters on this machine with the backend in use.

Inside a running process group (every rank calls ``measure_in_group``):

* ``alpha_s`` and ``beta_s_per_byte``: ping-pong between group ranks 0 and 1 (the others wait) over a
  range of sizes, one-way time = round trip / 2, least-squares line ``t = alpha + beta * bytes``;
* ``gamma_s_per_byte``: an in-place add of two float32 buffers on rank 0;
* ``num_links``: every rank sends a chunk to its right neighbour and receives one from its left at once
  (a ring round); if that is slower per byte than one lone transfer, the machine is carrying fewer
  than ``n`` transfers at full speed and ``num_links = n * beta / beta_all``. On GPUs with a switch this
  comes out as about ``n`` (no contention); on a CPU host it is about the number of free cores.

``calibrate(num_ranks)`` starts a local gloo group for it. Timings are medians of repeats; a busy
machine makes them noisy, which is why the benchmark measures them in the same run as the algorithms.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.distributed as dist

from laggard.collectives.cost import CostParams

DEFAULT_SIZES_BYTES = (4 << 10, 64 << 10, 512 << 10, 2 << 20, 8 << 20)


def _pingpong_s(buf: torch.Tensor, me: int, peer: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        if me == 0:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)
        times.append((time.perf_counter() - t0) / 2)
    return float(np.median(times))


def measure_in_group(group: dist.ProcessGroup | None = None, *,
                     sizes_bytes: tuple[int, ...] = DEFAULT_SIZES_BYTES, repeats: int = 5) -> CostParams:
    """Collective over ``group`` (>= 2 ranks): every rank gets the same ``CostParams``."""
    g = group if group is not None else dist.group.WORLD
    me = dist.get_rank(g)
    ranks = dist.get_process_group_ranks(g)
    n = len(ranks)
    sizes = np.array(sorted(sizes_bytes), dtype=np.float64)
    one_way = np.zeros(sizes.size)
    for i, size in enumerate(sizes):
        buf = torch.zeros(max(1, int(size) // 4), dtype=torch.float32)
        dist.barrier(group=g)
        if me in (0, 1):
            _pingpong_s(buf, me, ranks[1 - me], 1)  # warm the connection
            one_way[i] = _pingpong_s(buf, me, ranks[1 - me], repeats)
    # concurrent ring round at the largest size
    big = torch.zeros(max(1, int(sizes[-1]) // 4), dtype=torch.float32)
    got = torch.empty_like(big)
    all_s = []
    for _ in range(repeats + 1):
        dist.barrier(group=g)
        t0 = time.perf_counter()
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, big, ranks[(me + 1) % n], g),
                                        dist.P2POp(dist.irecv, got, ranks[(me - 1) % n], g)])
        for w in works:
            w.wait()
        all_s.append(time.perf_counter() - t0)
    concurrent = torch.tensor([float(np.median(all_s[1:]))], dtype=torch.float64)
    dist.all_reduce(concurrent, op=dist.ReduceOp.MAX, group=g)
    gamma = torch.zeros(1, dtype=torch.float64)
    if me == 0:
        a = torch.ones(int(sizes[-1]) // 4, dtype=torch.float32)
        b = torch.ones_like(a)
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            a.add_(b)
            ts.append(time.perf_counter() - t0)
        gamma[0] = float(np.median(ts)) / (a.numel() * 4)
    fit = torch.zeros(2, dtype=torch.float64)
    if me == 0:
        beta, alpha = np.polyfit(sizes, one_way, 1)
        fit[0] = max(float(alpha), 1e-7)
        fit[1] = max(float(beta), 1e-13)
    dist.broadcast(fit, src=ranks[0], group=g)
    dist.broadcast(gamma, src=ranks[0], group=g)
    alpha, beta = float(fit[0]), float(fit[1])
    beta_all = max((float(concurrent[0]) - alpha) / float(sizes[-1]), 1e-15)
    links = n * beta / beta_all
    num_links = math.inf if links >= n else max(links, 1.0)
    return CostParams(alpha_s=alpha, beta_s_per_byte=beta, gamma_s_per_byte=float(gamma[0]),
                      num_links=num_links, source=f"measured: gloo, {n} local processes")


def _calibrate_worker(rank: int, world_size: int, repeats: int) -> dict:
    return measure_in_group(repeats=repeats).to_json()


def calibrate(num_ranks: int = 2, *, repeats: int = 5, timeout_s: float = 300.0) -> CostParams:
    """Start ``num_ranks`` local gloo processes and measure ``CostParams`` among them."""
    from laggard.collectives.launch import run_workers

    d = run_workers(_calibrate_worker, num_ranks, repeats, timeout_s=timeout_s)[0]
    return CostParams(alpha_s=d["alpha_s"], beta_s_per_byte=d["beta_s_per_byte"],
                      gamma_s_per_byte=d["gamma_s_per_byte"],
                      num_links=math.inf if d["num_links"] is None else d["num_links"], source=d["source"])
