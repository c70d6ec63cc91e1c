"""Data parallel: a 3-layer MLP under DistributedDataParallel, a DataLoader, SGD; 4 gloo ranks, ~40 ms steps.

    laggard run --nproc-per-node 4 ddp_mlp.py --inject device --rank 2 --factor 1.4

Each layer is a ``common.Block``: a real linear layer (applied REPS times: ~10% of the step in real
matmuls) beside emulated device time, a third of it forward and two
thirds backward. The device time is DEVICE_SHARE of --step-ms, the rest is what the real matmuls,
DDP's gradient all-reduce on gloo and Python take, so a healthy rank's step is about --step-ms.
With FAMILY_STEP_TIMES=1 each rank prints its median step time at the end.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

D, CLASSES, LAYERS = 128, 16, 3
REPS = 8  # real matmul repetitions per layer
DEVICE_SHARE = 0.6  # of --step-ms, measured: the rest is real matmuls, the all-reduce and Python


def build(dev: common.Device, step_ms: float) -> nn.Sequential:
    dev_ms = DEVICE_SHARE * step_ms / LAYERS
    torch.manual_seed(0)  # the same initial weights on every rank, as DDP broadcasts anyway
    blocks = [common.Block(D, D, dev, dev_ms / 3, 2 * dev_ms / 3, REPS) for _ in range(LAYERS)]
    return nn.Sequential(*blocks, nn.Linear(D, CLASSES))


def main() -> None:
    args = common.parse(step_ms=40.0)
    rank, world = common.init_dist()
    dev = common.Device(args, rank)
    model = DDP(build(dev, args.step_ms))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cap = common.Capture(args, rank, world)
    ticks = []
    for step, (x, y) in enumerate(cap.data(common.loader(args, dev, D, CLASSES))):
        ticks.append(time.perf_counter())
        with cap.step(step):
            dev.step = step
            dev.host_stall()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
    ticks.append(time.perf_counter())
    cap.close()
    common.report_steps(rank, ticks)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
