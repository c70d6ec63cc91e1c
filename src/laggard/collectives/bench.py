"""Measure AllReduce with an injected straggler on real local processes (gloo over loopback).

Every repeat: all ranks pass a barrier, the straggler sleeps ``delay_s`` and then calls the AllReduce,
the others call it at once. The figure of merit is the time from the straggler's arrival to the last
rank's completion (``time.perf_counter`` is one clock for all processes of a host). The algorithms
(StragglAR, our p2p ring, torch's ``all_reduce``) take turns within each repeat, so drift in the
machine's load hits them alike. The cost-model parameters are measured in the same run, and the
model's prediction is reported beside the measurement.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from laggard.errors import LaggardError

ALGORITHMS = ("stragglar", "ring", "torch")
MAX_BENCH_RANKS = 64
MAX_SIZE_MB = 4096.0
# the phases rank 0 reports (``run_bench``'s ``on_progress``): the model's parameters, then the all-reduces
PHASE_CALIBRATE = "measuring the cost model"
PHASE_ALLREDUCE = "rank 0: warm-up, then timed"


@dataclass(kw_only=True, slots=True)
class BenchConfig:
    """One benchmark run (see ``laggard bench allreduce --help``)."""

    num_ranks: int = 8
    size_mb: float = 64.0
    delay_ms: float = 1000.0
    straggler: int | None = None  # default: the last rank
    repeats: int = 5
    algorithms: tuple[str, ...] = ALGORITHMS
    calibrate: bool = True
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        n = self.num_ranks
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= MAX_BENCH_RANKS:
            raise LaggardError(f"bench allreduce: --ranks must be an integer in 2..{MAX_BENCH_RANKS}, got {n!r}")
        if not (isinstance(self.size_mb, int | float) and math.isfinite(self.size_mb)
                and 0 < self.size_mb <= MAX_SIZE_MB):
            raise LaggardError(f"bench allreduce: --size-mb must be in (0, {MAX_SIZE_MB:g}], got {self.size_mb!r}")
        if not (isinstance(self.delay_ms, int | float) and math.isfinite(self.delay_ms) and self.delay_ms >= 0):
            raise LaggardError(f"bench allreduce: --delay-ms must be >= 0, got {self.delay_ms!r}")
        if self.straggler is not None and not 0 <= self.straggler < n:
            raise LaggardError(f"bench allreduce: --straggler must be a rank in 0..{n - 1}, got {self.straggler}")
        if not isinstance(self.repeats, int) or self.repeats < 1:
            raise LaggardError(f"bench allreduce: --repeats must be >= 1, got {self.repeats!r}")
        bad = [a for a in self.algorithms if a not in ALGORITHMS]
        if bad or not self.algorithms:
            raise LaggardError(f"bench allreduce: unknown algorithm(s) {bad} (known: {', '.join(ALGORITHMS)})")

    @property
    def size_bytes(self) -> int:
        return max(4, int(self.size_mb * 2**20) // 4 * 4)

    @property
    def straggler_rank(self) -> int:
        return self.num_ranks - 1 if self.straggler is None else self.straggler


def _bench_worker(rank: int, world_size: int, cfg: BenchConfig) -> dict:
    import torch
    import torch.distributed as dist

    from laggard.collectives.ring import ring_allreduce
    from laggard.collectives.stragglar import PhaseTimes, stragglar_allreduce

    strag = cfg.straggler_rank
    numel = cfg.size_bytes // 4
    # small integers: float32 sums are exact, so the result check is exact too
    src = (torch.arange(numel, dtype=torch.int32) % 97 + rank).to(torch.float32)
    expect = (torch.arange(numel, dtype=torch.int32) % 97).to(torch.float32) * world_size + sum(range(world_size))
    buf = torch.empty_like(src)

    def call(algo: str, times: PhaseTimes) -> None:
        if algo == "stragglar":
            stragglar_allreduce(buf, straggler=strag, times=times)
        elif algo == "ring":
            ring_allreduce(buf)
        else:
            dist.all_reduce(buf)

    from laggard.collectives.launch import report_progress

    params = None
    if cfg.calibrate:
        from laggard.collectives.calibrate import measure_in_group

        report_progress(0, None, PHASE_CALIBRATE)
        params = measure_in_group().to_json()
    out: dict = {"params": params, "samples": {a: [] for a in cfg.algorithms}, "correct": {}}
    total = len(cfg.algorithms) * (1 + cfg.repeats)
    report_progress(0, total, PHASE_ALLREDUCE)
    for algo in cfg.algorithms:  # warm-up (connections, allocator) and correctness
        buf.copy_(src)
        dist.barrier()
        call(algo, PhaseTimes())
        out["correct"][algo] = bool(torch.equal(buf, expect))
        report_progress(len(out["correct"]), total)
    for rep in range(cfg.repeats):
        order = cfg.algorithms[rep % len(cfg.algorithms):] + cfg.algorithms[: rep % len(cfg.algorithms)]
        for algo in order:
            buf.copy_(src)
            times = PhaseTimes()
            dist.barrier()
            if rank == strag and cfg.delay_ms > 0:
                time.sleep(cfg.delay_ms / 1000)
            arrive = time.perf_counter()
            call(algo, times)
            end = time.perf_counter()
            out["samples"][algo].append({"arrive_s": arrive, "end_s": end,
                                         "phase1_end_s": times.phase1_end_s if algo == "stragglar" else None})
            report_progress(len(cfg.algorithms) * (2 + rep) - len(order) + order.index(algo) + 1, total)
    return out


def _summary(values: list[float]) -> dict:
    import numpy as np

    arr = np.asarray(values, dtype=np.float64)
    return {"median_s": float(np.median(arr)), "min_s": float(arr.min()), "mean_s": float(arr.mean()),
            "samples_s": [round(float(v), 6) for v in arr]}


def run_bench(cfg: BenchConfig, on_progress: Callable[[int, int | None, str | None], None] | None = None) -> dict:
    """Run the benchmark; returns the JSON-ready result (see ``laggard bench allreduce``).
    ``on_progress(done, total, what)``: the all-reduces rank 0 has finished, of all it runs, and the
    phase where it changes (``PHASE_CALIBRATE`` with no total, then ``PHASE_ALLREDUCE``; else None)."""
    import numpy as np

    from laggard.collectives import cost
    from laggard.collectives.launch import run_workers

    n = cfg.num_ranks
    strag = cfg.straggler_rank
    t0 = time.perf_counter()
    per_rank = run_workers(_bench_worker, n, cfg, timeout_s=cfg.timeout_s, on_progress=on_progress)
    result: dict = {"ranks": n, "size_bytes": cfg.size_bytes, "delay_s": cfg.delay_ms / 1000,
                    "straggler": strag, "repeats": cfg.repeats, "algorithms": {}}
    result["correct"] = all(all(r["correct"].values()) for r in per_rank)
    hidden = []
    for algo in cfg.algorithms:
        post = []
        for rep in range(cfg.repeats):
            arrive = per_rank[strag]["samples"][algo][rep]["arrive_s"]
            end = max(r["samples"][algo][rep]["end_s"] for r in per_rank)
            post.append(end - arrive)
            if algo == "stragglar":
                p1 = max(r["samples"][algo][rep]["phase1_end_s"] for i, r in enumerate(per_rank) if i != strag)
                hidden.append(p1 <= arrive)
        result["algorithms"][algo] = _summary(post)
    algos = result["algorithms"]
    if "stragglar" in algos:
        result["phase1_hidden_fraction"] = float(np.mean(hidden))
        for base in ("ring", "torch"):
            if base in algos:
                result[f"ratio_vs_{base}"] = algos["stragglar"]["median_s"] / algos[base]["median_s"]
    if per_rank[0]["params"] is not None:
        d = per_rank[0]["params"]
        params = cost.CostParams(alpha_s=d["alpha_s"], beta_s_per_byte=d["beta_s_per_byte"],
                                 gamma_s_per_byte=d["gamma_s_per_byte"],
                                 num_links=math.inf if d["num_links"] is None else d["num_links"],
                                 source=d["source"])
        result["params"] = params.to_json()
        result["predicted"] = predictions(n, cfg.size_bytes, params, delay_s=cfg.delay_ms / 1000)
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


def predictions(num_ranks: int, size_bytes: int, params: object, *, delay_s: float) -> dict:
    """The model's numbers for one configuration, with and without link contention."""
    import dataclasses

    from laggard.collectives import cost

    assert isinstance(params, cost.CostParams)
    textbook = dataclasses.replace(params, num_links=math.inf)
    out = {}
    for key, p in (("contended", params), ("textbook", textbook)):
        ring = cost.ring_time_s(num_ranks, size_bytes, p)
        out[key] = {
            "stragglar_s": cost.stragglar_time_s(num_ranks, size_bytes, p, delay_s=delay_s),
            "stragglar_phase1_s": cost.stragglar_phase1_time_s(num_ranks, size_bytes, p),
            "ring_s": ring,
            "rhd_s": cost.rhd_time_s(num_ranks, size_bytes, p),
            "ratio_vs_ring": cost.stragglar_time_s(num_ranks, size_bytes, p, delay_s=delay_s) / ring,
            "break_even_delay_s": cost.break_even_delay_s(num_ranks, size_bytes, p, "ring"),
        }
    return out
