"""Data parallel with long steps: a small conv net under DistributedDataParallel, 4 gloo ranks, ~1 s steps.

    torchrun --nproc-per-node 4 ddp_long_profiler.py --capture profiler --out trace --inject device --rank 1

The net: three 3x3 Conv2d layers (3 -> 16 -> 32 -> 32 channels, padding 1) with ReLU on 8x8 images, then
a linear head over the flattened 32x8x8 features; cross-entropy over 10 classes, SGD. The images are the
loader's random 192-vectors reshaped to 3x8x8. DDP all-reduces the gradients during backward.

Device time: each conv and the head is one emulated device op (``common.device_op``) beside its real
work (the layer applied REPS times and averaged). Nearly all of a step
is device time: DEVICE_SHARE of --step-ms, a third forward and two thirds backward; the rest is the
real convolutions, DDP's all-reduce on gloo and Python. ``--capture profiler`` records torch.profiler's
trace (``common.Capture``: one ``ProfilerStep#N`` window a step, one JSON a rank). With
FAMILY_STEP_TIMES=1 each rank prints its median step time at the end.
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

CH, SIDE, CLASSES = (3, 16, 32, 32), 8, 10
REPS = 3  # real repetitions per layer
DEVICE_SHARE = 0.95  # of --step-ms, measured: the rest is the real convolutions, the all-reduce and Python


class DeviceLayer(nn.Module):
    """``layer`` (then ReLU unless ``last``) applied ``reps`` times and averaged, beside ``fwd_ms`` /
    ``bwd_ms`` of emulated device time."""

    def __init__(self, layer: nn.Module, dev: common.Device, fwd_ms: float, bwd_ms: float, reps: int,
                 last: bool = False) -> None:
        super().__init__()
        self.layer, self.dev, self.fwd_ms, self.bwd_ms, self.reps, self.last = layer, dev, fwd_ms, bwd_ms, reps, last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        reps = self.reps
        h = self.layer(x)
        for _ in range(reps - 1):
            h = h + self.layer(x)
        h = h / reps if reps > 1 else h
        return common.device_op(h if self.last else torch.relu(h), self.dev, self.fwd_ms, self.bwd_ms)


class ConvNet(nn.Module):
    def __init__(self, dev: common.Device, device_ms: float) -> None:
        super().__init__()
        ops = len(CH)  # three convs and the head
        fwd_ms, bwd_ms = device_ms / 3 / ops, 2 * device_ms / 3 / ops
        convs = [nn.Conv2d(a, b, 3, padding=1) for a, b in zip(CH, CH[1:], strict=False)]
        self.convs = nn.Sequential(*(DeviceLayer(c, dev, fwd_ms, bwd_ms, REPS) for c in convs))
        self.head = DeviceLayer(nn.Linear(CH[-1] * SIDE * SIDE, CLASSES), dev, fwd_ms, bwd_ms, REPS, last=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.convs(x).flatten(1))


def main() -> None:
    args = common.parse(step_ms=1000.0, steps=14)
    rank, world = common.init_dist()
    dev = common.Device(args, rank)
    torch.manual_seed(0)  # the same initial weights on every rank, as DDP broadcasts anyway
    model = DDP(ConvNet(dev, DEVICE_SHARE * args.step_ms))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = common.loader(args, dev, CH[0] * SIDE * SIDE, CLASSES)
    cap = common.Capture(args, rank, world)
    ticks = []
    for step, (x, y) in enumerate(cap.data(batches)):
        ticks.append(time.perf_counter())
        with cap.step(step):
            dev.step = step
            dev.host_stall()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x.view(-1, CH[0], SIDE, SIDE)), y).backward()
            opt.step()
    ticks.append(time.perf_counter())
    cap.close()
    common.report_steps(rank, ticks)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
