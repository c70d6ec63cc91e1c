"""What the zero-code benchmark's jobs share: their flags, an emulated device, the model, the step clock.

Every job runs unchanged under plain torchrun, `traceml run` and `laggard run`. It calls TraceML's API
only where ``ZC_TRACEML=1`` (`traceml run` needs ``traceml.init()`` and ``trace_step(model)`` in a plain
loop), and never imports laggard. Each rank times its own steps with the same clock in every mode and
writes their median to ``$ZC_STEP_FILE.<rank>`` (JSON), so the three modes' step times compare alike.

Device time is emulated with ``time.sleep`` (a GPU kernel's duration, which takes no host CPU): four
ranks on a shared two-core machine cannot each run 80 ms of real compute a step without timing each
other's contention. The real matmuls beside it (``--reps``) are what job 6 scales.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

IN, HIDDEN, OUT = 128, 256, 16
WARMUP_STEPS = 5  # left out of the step times: first-use allocations, the tracers' own start-up


def traceml_on() -> bool:
    return os.environ.get("ZC_TRACEML") == "1"


def parse(argv: list[str] | None = None, **defaults: object) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--inject", default="none",
                    choices=["none", "forward", "host", "compute", "data", "stage"],
                    help="forward: --ms more in the slow rank's forward every step; host: --ms of host stall "
                         "before its step's compute every --every steps; compute: --slow-reps x the real work; "
                         "data: --ms more per batch in its DataLoader; stage: --ms more per microbatch forward")
    ap.add_argument("--rank", type=int, default=2, help="the slowed rank")
    ap.add_argument("--ms", type=float, default=30.0)
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=0, help="DataLoader worker processes (0: the rank loads)")
    ap.add_argument("--reps", type=int, default=2, help="hidden layer applications (real matmuls) per forward")
    ap.add_argument("--slow-reps", type=int, default=3, help="the slowed rank's --reps under --inject compute")
    ap.add_argument("--fwd-ms", type=float, default=25.0, help="emulated device time of a forward")
    ap.add_argument("--bwd-ms", type=float, default=30.0, help="emulated device time of a backward")
    ap.set_defaults(**defaults)
    return ap.parse_args(argv)


def init_dist() -> tuple[int, int]:
    """One intra-op thread (four ranks share two cores) and the gloo group; (rank, world size)."""
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def slowed(args: argparse.Namespace, rank: int, kind: str) -> bool:
    return args.inject == kind and rank == args.rank


class _Device(torch.autograd.Function):
    """Identity whose forward and backward each sleep: an accelerator's kernel time, no host CPU."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, fwd_s: float, bwd_s: float) -> torch.Tensor:  # noqa: ANN001
        ctx.bwd_s = bwd_s
        if fwd_s > 0:
            time.sleep(fwd_s)
        return x.clone()  # a view could not be modified in place (the HF Trainer scales its loss)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        if ctx.bwd_s > 0:
            time.sleep(ctx.bwd_s)
        return grad, None, None


class MLP(nn.Module):
    """Three layers (the middle one applied ``reps`` times) beside ``fwd_ms``/``bwd_ms`` of device time;
    ``extra_ms`` more device time in every forward (the injected slow device)."""

    def __init__(self, *, reps: int = 2, fwd_ms: float = 25.0, bwd_ms: float = 30.0, extra_ms: float = 0.0):
        super().__init__()
        self.inp, self.mid, self.out = nn.Linear(IN, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, OUT)
        self.reps, self.fwd_s, self.bwd_s = reps, (fwd_ms + extra_ms) / 1e3, bwd_ms / 1e3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        for _ in range(self.reps):
            h = torch.relu(self.mid(h))
        return self.out(_Device.apply(h, self.fwd_s, self.bwd_s))


def model_for(args: argparse.Namespace, rank: int) -> MLP:
    torch.manual_seed(0)  # the same initial weights on every rank, as DDP broadcasts anyway
    reps = args.slow_reps if slowed(args, rank, "compute") else args.reps
    return MLP(reps=reps, fwd_ms=args.fwd_ms, bwd_ms=args.bwd_ms,
               extra_ms=args.ms if slowed(args, rank, "forward") else 0.0)


class RandomData(torch.utils.data.Dataset):
    """Random inputs and labels; ``delay_s`` of host time per batch (in ``collate``) on a slow loader."""

    def __init__(self, n: int, seed: int, delay_s: float = 0.0):
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = torch.randn(n, IN, generator=g), torch.randint(0, OUT, (n,), generator=g)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]

    def collate(self, items: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


def loader_for(args: argparse.Namespace, rank: int, steps: int | None = None) -> torch.utils.data.DataLoader:
    ds = RandomData(args.batch * (steps or args.steps), seed=rank,
                    delay_s=args.ms / 1e3 if slowed(args, rank, "data") else 0.0)
    return torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                                       collate_fn=ds.collate, drop_last=True,
                                       persistent_workers=args.workers > 0)


class StepClock:
    """Each step's wall time, from one ``tick()`` to the next (the same clock under every launcher)."""

    def __init__(self) -> None:
        self.ticks: list[float] = []

    def tick(self) -> None:
        self.ticks.append(time.perf_counter())

    def write(self, rank: int) -> None:
        """The step times past the warm-up, to ``$ZC_STEP_FILE.<rank>`` (nothing when unset): their mean (the
        wall time of those steps over their count: what a tracer costs the job's throughput) and their
        median. A job whose batches arrive in bunches (a DataLoader's workers that cannot keep up hand
        over W at a time) alternates waiting and computing steps, and the median of such a mix lands on
        either mode or between them as a per-step cost moves time from one to the other; the mean does not."""
        path = os.environ.get("ZC_STEP_FILE")
        times = [b - a for a, b in zip(self.ticks, self.ticks[1:], strict=False)][WARMUP_STEPS:]
        if not path or not times:
            return
        with open(f"{path}.{rank}", "w") as f:
            json.dump({"rank": rank, "mean_s": statistics.fmean(times), "median_s": statistics.median(times),
                       "steps": len(times)}, f)
