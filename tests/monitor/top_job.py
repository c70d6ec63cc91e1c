"""A traced data-parallel loop for tests/monitor/test_top.py: WORLD rank processes, one of them slower,
that meet at a barrier in every step's "all-reduce" (so the others wait there, as in DDP).

    python tests/monitor/top_job.py DIR WORLD STEPS SLOW_RANK [--step-s S] [--monitor URL TOKEN JOB]

Each rank is a real laggard.tracer.Tracer (rank=/world_size=, no torch.distributed) writing DIR; pages
of 50 ops (a flush a second at most) end inside steps, so shards hold partial steps as a real job's do.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time


def rank_main(out: str, rank: int, world: int, steps: int, slow: int, step_s: float, barrier, monitor) -> None:
    from laggard.tracer import Tracer

    stream = {} if monitor is None else {"monitor_url": monitor[0], "token": monitor[1], "monitor_job": monitor[2]}
    t = Tracer(out, name="topjob", rank=rank, world_size=world, dp_rank=rank, handle_signals=False,
               flush_interval_s=1.0, page_ops=50, num_pages=8, **stream)
    f = 2.0 if rank == slow else 1.0
    for s in range(steps):
        with t.step(s):
            with t.op("forward-compute"):
                time.sleep(0.4 * step_s * f)
            with t.op("backward-compute"):
                time.sleep(0.6 * step_s * f)
            with t.collective("grads-all-reduce", label="dp"):
                barrier.wait(timeout=60)
    t.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("world", type=int)
    ap.add_argument("steps", type=int)
    ap.add_argument("slow", type=int)
    ap.add_argument("--step-s", type=float, default=0.01)
    ap.add_argument("--monitor", nargs=3, default=None)
    a = ap.parse_args()
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(a.world)
    procs = [ctx.Process(target=rank_main, args=(a.out, r, a.world, a.steps, a.slow, a.step_s, barrier, a.monitor))
             for r in range(a.world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    raise SystemExit(max(p.exitcode or 0 for p in procs))


if __name__ == "__main__":
    main()
