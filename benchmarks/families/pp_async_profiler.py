"""Pipeline x data parallel by hand: 4 gloo ranks, dp 2 x pp 2, 1F1B over dist.isend/dist.irecv, 4 microbatches.

    torchrun --nproc-per-node 4 pp_async_profiler.py --capture profiler --out trace --inject stage --stage 1

Layout: rank r is stage ``r % 2`` of pipeline ``r // 2``: ranks 0 -> 1 are pipeline 0 (stage 0, stage 1),
ranks 2 -> 3 pipeline 1. Activations go stage 0 -> 1 and their gradients back, each transfer a
``dist.isend``/``dist.irecv`` on the default group whose work is waited on; a stage's steady-state
transfers are posted together (stage 0: send activation i, receive gradient i-1; stage 1: send gradient
i, receive activation i+1), as Megatron's batched p2p does. After the microbatches each stage's
gradients are flattened and all_reduced (averaged) in its DP group: stage 0's {0, 2}, stage 1's {1, 3};
then SGD. Both stages of a pipeline read the same batches (the loader is seeded by the pipeline):
stage 0 takes the inputs, stage 1 the labels.

Schedule (1F1B, two stages): stage 0 runs F0, then F1 B0, F2 B1, F3 B2, then B3; stage 1 runs F0 B0,
F1 B1, F2 B2, F3 B3. Each stage's Device is built with ``stage=`` its stage index, so ``--inject stage
--stage S`` slows both ranks of stage S.

Device time: each stage is two linears, each one emulated device op a microbatch. A healthy 1F1B step of
2 stages and 4 microbatches is ``(4 + 2 - 1)`` microbatch slots, so a stage's microbatch (forward +
backward) takes DEVICE_SHARE x ``--step-ms / 5`` of device time, a third of it forward; the rest is the
transfers, the all_reduce, the real matmuls (REPS per linear) and Python.
``--capture profiler`` records torch.profiler's trace (``common.Capture``: one ``ProfilerStep#N`` window
a step, one JSON a rank).
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

PP, DP, MICROBATCHES = 2, 2, 4
D_IN, HIDDEN, D_ACT, CLASSES = 64, 256, 128, 16
REPS = 6  # real matmul repetitions per linear
DEVICE_SHARE = 0.8  # of --step-ms, measured


def linear_reps(x: torch.Tensor, lin: nn.Linear, reps: int) -> torch.Tensor:
    """``lin(x)`` computed ``reps`` times and averaged: the same value, ``reps`` x the CPU work."""
    out = lin(x)
    for _ in range(reps - 1):
        out = out + lin(x)
    return out / reps if reps > 1 else out


class Stage(nn.Module):
    """Two linears, each beside ``fwd_ms``/``bwd_ms`` of emulated device time a microbatch."""

    def __init__(self, d_in: int, d_out: int, dev: common.Device, fwd_ms: float, bwd_ms: float, reps: int) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(d_in, HIDDEN), nn.Linear(HIDDEN, d_out)
        self.dev, self.fwd_ms, self.bwd_ms, self.reps = dev, fwd_ms, bwd_ms, reps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = common.device_op(linear_reps(x, self.a, self.reps), self.dev, self.fwd_ms, self.bwd_ms)
        h = torch.relu(h)
        return common.device_op(linear_reps(h, self.b, self.reps), self.dev, self.fwd_ms, self.bwd_ms)


def wait_all(works: list) -> None:  # noqa: ANN001
    for w in works:
        w.wait()


def first_stage(model: Stage, x: torch.Tensor, peer: int) -> None:
    """Stage 0's 1F1B: one warm-up forward, steady (forward i, backward i-1), one cool-down backward."""
    xs = x.chunk(MICROBATCHES)
    warm = PP - 1
    outs: list[torch.Tensor] = []
    for i in range(warm):
        outs.append(model(xs[i]))
        wait_all([dist.isend(outs[i].detach().contiguous(), dst=peer)])
    for i in range(warm, MICROBATCHES):
        outs.append(model(xs[i]))
        j = i - warm
        grad = torch.empty_like(outs[j])
        wait_all([dist.isend(outs[i].detach().contiguous(), dst=peer), dist.irecv(grad, src=peer)])
        outs[j].backward(grad)
    for j in range(MICROBATCHES - warm, MICROBATCHES):
        grad = torch.empty_like(outs[j])
        wait_all([dist.irecv(grad, src=peer)])
        outs[j].backward(grad)


def last_stage(model: Stage, y: torch.Tensor, peer: int) -> torch.Tensor:
    """Stage 1's 1F1B: forward and backward of each microbatch in turn; the gradient's send posted with
    the next activation's receive."""
    ys = y.chunk(MICROBATCHES)
    mb = len(ys[0])
    act = torch.empty(mb, D_ACT)
    wait_all([dist.irecv(act, src=peer)])
    total = torch.zeros(())
    for i in range(MICROBATCHES):
        act.requires_grad_(True)
        loss = F.cross_entropy(model(act), ys[i]) / MICROBATCHES
        loss.backward()
        total += loss.detach()
        works = [dist.isend(act.grad.contiguous(), dst=peer)]
        if i + 1 < MICROBATCHES:
            nxt = torch.empty(mb, D_ACT)
            works.append(dist.irecv(nxt, src=peer))
        wait_all(works)
        if i + 1 < MICROBATCHES:
            act = nxt
    return total


def allreduce_grads(params: list[nn.Parameter], group, size: int) -> None:  # noqa: ANN001
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= size
    off = 0
    for g in grads:
        g.copy_(flat[off:off + g.numel()].view_as(g))
        off += g.numel()


def main() -> None:
    args = common.parse(step_ms=150.0)
    rank, world = common.init_dist()
    assert world == PP * DP, f"dp {DP} x pp {PP}: --nproc-per-node {PP * DP}"
    stage, pipe = rank % PP, rank // PP
    stage_groups = [dist.new_group([p * PP + s for p in range(DP)]) for s in range(PP)]  # {0,2}, {1,3}
    dp_group = stage_groups[stage]

    dev = common.Device(args, rank, stage=stage)
    slot_ms = DEVICE_SHARE * args.step_ms / (MICROBATCHES + PP - 1)  # a microbatch's forward + backward on one stage
    ops = 2  # emulated device ops a stage's microbatch
    fwd_ms, bwd_ms = slot_ms / 3 / ops, 2 * slot_ms / 3 / ops
    torch.manual_seed(100 + stage)  # a stage's weights: the same in both pipelines
    model = Stage(D_IN if stage == 0 else D_ACT, D_ACT if stage == 0 else CLASSES, dev, fwd_ms, bwd_ms,
                  REPS)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    batches = common.loader(args, dev, D_IN, CLASSES, seed=pipe)  # the same batches on a pipeline's stages
    cap = common.Capture(args, rank, world, dp_rank=pipe, pp_rank=stage)
    ticks = []
    for step, (x, y) in enumerate(cap.data(batches)):
        ticks.append(time.perf_counter())
        with cap.step(step):
            dev.step = step
            dev.host_stall()
            opt.zero_grad(set_to_none=True)
            if stage == 0:
                first_stage(model, x, peer=rank + 1)
            else:
                last_stage(model, y, peer=rank - 1)
            allreduce_grads(params, dp_group, DP)
            opt.step()
    ticks.append(time.perf_counter())
    cap.close()
    common.report_steps(rank, ticks)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
