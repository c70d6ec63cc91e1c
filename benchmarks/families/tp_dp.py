"""Tensor x data parallel by hand: 4 gloo ranks, tp 2 x dp 2, Megatron-style column/row-parallel MLP blocks.

    laggard run --nproc-per-node 4 tp_dp.py --inject device --rank 1 --factor 1.5

Layout: rank r has tp rank ``r % 2`` and dp rank ``r // 2``. TP groups {0,1} and {2,3} (the two shards of
one model replica), DP groups {0,2} and {1,3} (the same shard in both replicas). Both ranks of a TP group
read the same batches (the loader is seeded by the dp rank).

The model: a replicated input linear, two blocks, a replicated head. A block is a column-parallel linear
(each TP rank holds half the hidden features) whose input passes Megatron's ``f`` (identity forward,
all_reduce of the input gradient in the TP group backward), then a row-parallel linear whose partial
output passes ``g`` (all_reduce in the TP group forward, identity backward), and a residual. After
backward the gradients are flattened and all_reduced in the DP group (averaged); then SGD.

Device time: each of the four parallel linears is one emulated device op (``common.device_op``) beside
its real matmuls (REPS of them, averaged); the device time is DEVICE_SHARE
of --step-ms, a third forward and two thirds backward; the rest is the real matmuls, the six gloo
all_reduces a step and Python, so a healthy rank's step is about --step-ms. With FAMILY_STEP_TIMES=1
each rank prints its median step time at the end.
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

TP, DP = 2, 2
D, FFN, CLASSES, BLOCKS = 128, 512, 16, 2
REPS = 6  # real matmul repetitions per linear
DEVICE_SHARE = 0.6  # of --step-ms, measured: the rest is real matmuls, the all_reduces and Python


def linear_reps(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, reps: int) -> torch.Tensor:
    """``F.linear(x, w, b)`` computed ``reps`` times and averaged: the same value, ``reps`` x the CPU work
    forward and backward."""
    out = F.linear(x, w, b)
    for _ in range(reps - 1):
        out = out + F.linear(x, w, b)
    return out / reps if reps > 1 else out


class _CopyToTP(torch.autograd.Function):
    """Megatron's ``f``: identity forward; the input gradient all_reduced in the TP group backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:  # noqa: ANN001
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``: the partial outputs all_reduced in the TP group forward; identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:  # noqa: ANN001
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        return grad, None


class ParallelBlock(nn.Module):
    """Column-parallel linear (D -> FFN/TP) then row-parallel linear (FFN/TP -> D), residual."""

    def __init__(self, dev: common.Device, tp_group, fwd_ms: float, bwd_ms: float, reps: int) -> None:  # noqa: ANN001
        super().__init__()
        local = FFN // TP
        self.w1 = nn.Parameter(torch.randn(local, D) / D**0.5)
        self.b1 = nn.Parameter(torch.zeros(local))
        self.w2 = nn.Parameter(torch.randn(D, local) / FFN**0.5)
        self.b2 = nn.Parameter(torch.zeros(D))  # replicated: added once, after the reduce
        self.dev, self.group, self.fwd_ms, self.bwd_ms, self.reps = dev, tp_group, fwd_ms, bwd_ms, reps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = _CopyToTP.apply(x, self.group)
        h = common.device_op(linear_reps(h, self.w1, self.b1, self.reps), self.dev, self.fwd_ms, self.bwd_ms)
        h = torch.relu(h)
        y = common.device_op(linear_reps(h, self.w2, None, self.reps), self.dev, self.fwd_ms, self.bwd_ms)
        y = _ReduceFromTP.apply(y, self.group)
        return x + y + self.b2


class Model(nn.Module):
    def __init__(self, dev: common.Device, tp_rank: int, tp_group, device_ms: float, reps: int) -> None:  # noqa: ANN001
        super().__init__()
        ops = 2 * BLOCKS  # emulated device ops a step
        fwd_ms, bwd_ms = device_ms / 3 / ops, 2 * device_ms / 3 / ops
        torch.manual_seed(0)  # the replicated layers: the same on every rank
        self.inp, self.head = nn.Linear(D, D), nn.Linear(D, CLASSES)
        torch.manual_seed(1 + tp_rank)  # a TP rank's shards: the same in both DP replicas
        self.blocks = nn.ModuleList(ParallelBlock(dev, tp_group, fwd_ms, bwd_ms, reps) for _ in range(BLOCKS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        for blk in self.blocks:
            h = blk(h)
        return self.head(h)


def allreduce_grads(params: list[nn.Parameter], group, size: int) -> None:  # noqa: ANN001
    """The gradients flattened into one buffer, all_reduced in the DP group and averaged."""
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= size
    off = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[off:off + n].view_as(g))
        off += n


def main() -> None:
    args = common.parse(step_ms=60.0)
    rank, world = common.init_dist()
    assert world == TP * DP, f"tp {TP} x dp {DP}: --nproc-per-node {TP * DP}"
    tp_rank, dp_rank = rank % TP, rank // TP
    # every rank creates every group, in the same order
    tp_groups = [dist.new_group([d * TP + t for t in range(TP)]) for d in range(DP)]
    dp_groups = [dist.new_group([d * TP + t for d in range(DP)]) for t in range(TP)]
    tp_group, dp_group = tp_groups[dp_rank], dp_groups[tp_rank]

    dev = common.Device(args, rank)
    model = Model(dev, tp_rank, tp_group, DEVICE_SHARE * args.step_ms, REPS)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    batches = common.loader(args, dev, D, CLASSES, seed=dp_rank)  # the same batches on a TP group's ranks
    cap = common.Capture(args, rank, world, dp_rank=dp_rank, tp_rank=tp_rank)
    ticks = []
    for step, (x, y) in enumerate(cap.data(batches)):
        ticks.append(time.perf_counter())
        with cap.step(step):
            dev.step = step
            dev.host_stall()
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            allreduce_grads(params, dp_group, DP)
            opt.step()
    ticks.append(time.perf_counter())
    cap.close()
    common.report_steps(rank, ticks)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
