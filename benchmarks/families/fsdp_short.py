"""FSDP2 with short steps: a 2-layer MLP under ``torch.distributed.fsdp.fully_shard`` on gloo (CPU), SGD,
4 ranks, ~10-12 ms steps (the short-step regime, where a few ms of host time or collectives are a
large part of every step).

    laggard run --nproc-per-node 4 fsdp_short.py --inject device --rank 3 --factor 1.3

One ``fully_shard`` on the root (a single parameter group: one all-gather in the forward and one
reduce-scatter in the backward; each gloo collective costs a few ms on two shared cores, so more
groups would leave no room for compute in a 10 ms step). The layers are ``common.Block``s: real
matmuls (REPS each) beside emulated device time, DEVICE_SHARE of
--step-ms, a third forward and two thirds backward. With FAMILY_STEP_TIMES=1 each rank prints its
median step time at the end.
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
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

D, CLASSES, LAYERS = 64, 16, 2
REPS = 4  # real matmul repetitions per layer
DEVICE_SHARE = 0.5  # of --step-ms, measured: FSDP2's Python and its two gloo collectives take the rest


def main() -> None:
    args = common.parse(step_ms=12.0)
    rank, world = common.init_dist()
    mesh = init_device_mesh("cpu", (world,))
    dev = common.Device(args, rank)
    dev_ms = DEVICE_SHARE * args.step_ms / LAYERS
    torch.manual_seed(0)
    model = nn.Sequential(*[common.Block(D, D, dev, dev_ms / 3, 2 * dev_ms / 3, REPS) for _ in range(LAYERS)],
                          nn.Linear(D, CLASSES))
    fully_shard(model, mesh=mesh)
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
