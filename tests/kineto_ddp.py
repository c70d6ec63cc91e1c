"""A real multi-rank PyTorch-profiler trace: a small DDP job over gloo on 127.0.0.1 with one slow rank.

Each rank trains a small MLP with DistributedDataParallel (one thread per process) under
``torch.profiler`` and writes ``rank{R}.json.gz``; the slow rank does extra matrix products after
its backward pass, so it reaches the next step's gradient all-reduces late.

    python tests/kineto_ddp.py OUT_DIR [--world 4] [--slow-rank 2] [--steps 5] [--extra-matmuls 30] [--host-stall-ms 0]
        [--stall-mid-step] [--microbatches 1] [--rows-sigma 0] [--loader-delay-ms 0]

With ``--loader-delay-ms`` each step's batch comes from a ``torch.utils.data.DataLoader`` whose collate
function sleeps that long on the slow rank (a slow input pipeline; torch.profiler records every
``next()`` as an ``enumerate(DataLoader)#...`` annotation).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import os
import shutil
from pathlib import Path

from laggard.collectives.launch import free_port


def _worker(
    rank: int, world: int, port: int, out: str, slow_rank: int, steps: int, extra_matmuls: int, host_stall_ms: float,
    stall_mid_step: bool = False, microbatches: int = 1, rows_sigma: float = 0.0, loader_delay_ms: float = 0.0,
) -> None:
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    ddp = DDP(model, bucket_cap_mb=0.1)  # two gradient buckets: two all-reduces per step
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    # microbatches of uneven size (rows_sigma: a lognormal spread of their rows, drawn per rank and
    # microbatch, as documents of uneven length make uneven microbatches): forward and backward of
    # one microbatch take longer together
    draw = torch.Generator().manual_seed(1000 + rank)

    def rows() -> int:
        if not rows_sigma:
            return 64
        return int(min(max(64 * float(torch.exp(rows_sigma * torch.randn(1, generator=draw))), 8), 512))

    def save(prof: torch.profiler.profile) -> None:
        tmp = Path(out) / f"rank{rank}.json"
        prof.export_chrome_trace(str(tmp))
        with open(tmp, "rb") as src, gzip.open(f"{tmp}.gz", "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
        tmp.unlink()

    def collate(items: list) -> torch.Tensor:
        if rank == slow_rank:
            time.sleep(loader_delay_ms / 1e3)
        return torch.stack([t for (t,) in items])

    batches = iter(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64 * (steps + 2), 256)),
                                               batch_size=64, collate_fn=collate)) if loader_delay_ms else None
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=steps)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule, record_shapes=True, on_trace_ready=save
    ) as prof:
        for _ in range(steps + 2):
            stall = rank == slow_rank and host_stall_ms
            if stall and not stall_mid_step:
                # host-side work no profiler op covers (a slow data loader, Python, a noisy neighbour)
                time.sleep(host_stall_ms / 1e3)
            if batches is not None:
                x = next(batches)
            for m in range(microbatches):  # gradient accumulation: the last microbatch all-reduces
                with ddp.no_sync() if m < microbatches - 1 else contextlib.nullcontext():
                    loss = ddp(x if microbatches == 1 else torch.randn(rows(), 256)).sum()
                    if stall and stall_mid_step and m == 0:  # ... between two ops of the step's compute
                        time.sleep(host_stall_ms / 1e3)
                    loss.backward()
            if rank == slow_rank and extra_matmuls:  # the straggler: real extra compute on this rank only
                a = torch.randn(300, 300)
                for _ in range(extra_matmuls):
                    a = a @ a
                    a = a / a.norm()
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.destroy_process_group()


def make_traces(
    out: str | Path, *, world: int = 4, slow_rank: int = 2, steps: int = 5, extra_matmuls: int = 30,
    host_stall_ms: float = 0.0, stall_mid_step: bool = False, microbatches: int = 1, rows_sigma: float = 0.0,
    loader_delay_ms: float = 0.0,
) -> Path:
    import torch.multiprocessing as mp

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(world, free_port(), str(out), slow_rank, steps, extra_matmuls, host_stall_ms,
                            stall_mid_step, microbatches, rows_sigma, loader_delay_ms), nprocs=world)
    return out


def make_traces_in_subprocess(out: str | Path, *, timeout_s: float = 170, **kwargs: object) -> Path:
    """``make_traces`` in a fresh interpreter (the test process keeps no torch state or spawned
    children); keyword arguments as for ``make_traces``."""
    import json
    import subprocess
    import sys

    here = Path(__file__).parent
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from kineto_ddp import make_traces; "
            "make_traces(sys.argv[2], **json.loads(sys.argv[3]))")
    proc = subprocess.run([sys.executable, "-c", code, str(here), str(out), json.dumps(kwargs)], capture_output=True,
                          text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"the traced DDP job failed: {proc.stderr[-2000:]}")
    return Path(out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--slow-rank", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--extra-matmuls", type=int, default=30, help="extra compute on the slow rank (0: none)")
    ap.add_argument("--host-stall-ms", type=float, default=0.0, help="untraced host time per step on the slow rank")
    ap.add_argument("--stall-mid-step", action="store_true", help="stall between the forward and the backward "
                    "(inside the step's compute) instead of before the step")
    ap.add_argument("--microbatches", type=int, default=1, help=(
        "forward/backward passes per step (gradient accumulation)"))
    ap.add_argument("--rows-sigma", type=float, default=0.0, help=(
        "lognormal spread of the microbatches' rows (0: 64 each)"))
    ap.add_argument("--loader-delay-ms", type=float, default=0.0, help=(
        "the slow rank's DataLoader takes this much longer per batch (0: no DataLoader)"))
    args = ap.parse_args()
    make_traces(args.out, world=args.world, slow_rank=args.slow_rank, steps=args.steps,
                extra_matmuls=args.extra_matmuls, host_stall_ms=args.host_stall_ms, stall_mid_step=args.stall_mid_step,
                microbatches=args.microbatches, rows_sigma=args.rows_sigma, loader_delay_ms=args.loader_delay_ms)
