"""Data x pipeline parallel, traced with laggard's Tracer: dp 2 x pp 2, GPipe over blocking send/recv,
4 microbatches, the gradients all-reduced within each stage's DP group; ~200 ms steps; plain torchrun.

    torchrun --nproc-per-node 4 tracer_dppp.py --capture tracer --out trace --inject stage --stage 1

Layout: rank r is stage ``r % 2`` of pipeline (DP replica) ``r // 2``: ranks 0, 1 are stages 0, 1 of
pipeline 0 and ranks 2, 3 stages 0, 1 of pipeline 1 (rank = dp x PP + stage, Megatron's order with
pp innermost). The DP groups are {0, 2} (stage 0) and {1, 3} (stage 1), made with dist.new_group.

What the Tracer records (``common.Capture``; nothing without ``--capture tracer``): ``tracer.step``
around each step, the DataLoader's waits (``tracer.data``), ``tracer.op`` for each microbatch's forward
and backward and the optimizer, ``tracer.p2p`` around every send and recv with its peer, and
``tracer.collective`` around the DP all-reduce. The host stall of ``--inject host`` is inside the
step and outside every op: untraced host time.

Both stages read data (a pipeline's first stage its inputs, its last stage the labels), from loaders
seeded by the DP replica. A healthy step is (M + P - 1) microbatch slots of forward + backward, then
the all-reduce: each stage's device time per microbatch is DEVICE_SHARE x --step-ms / (M + P - 1), a
third forward and two thirds backward. With FAMILY_STEP_TIMES=1 each rank prints its median step time.
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

DP, PP = 2, 2
D, CLASSES, MICROBATCHES = 128, 16, 4
REPS = 8  # real matmul repetitions per Block
DEVICE_SHARE = 0.8  # of --step-ms, measured


def allreduce_grads(params: list[nn.Parameter], group, cap: common.Capture) -> None:  # noqa: ANN001
    """This stage's gradients in one flat buffer, all-reduced in its DP group and averaged."""
    with cap.collective("grads-all-reduce", group=group, size_bytes=4 * sum(p.numel() for p in params)):
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, group=group)
    flat /= DP
    off = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[off:off + n].view_as(p.grad))
        off += n


def main() -> None:
    args = common.parse(step_ms=200.0)
    rank, world = common.init_dist()
    assert world == DP * PP, f"dp {DP} x pp {PP}: --nproc-per-node {DP * PP}"
    dp, stage = rank // PP, rank % PP
    first, last = stage == 0, stage == PP - 1
    # every rank creates every group, in the same order
    dp_groups = [dist.new_group([d * PP + s for d in range(DP)]) for s in range(PP)]
    dp_group = dp_groups[stage]
    dev = common.Device(args, rank, stage=stage)
    M = MICROBATCHES
    slot_ms = DEVICE_SHARE * args.step_ms / (M + PP - 1)
    torch.manual_seed(stage)  # a stage's layers: the same in both replicas
    blocks = [common.Block(D, D, dev, slot_ms / 3 / 2, 2 * slot_ms / 3 / 2, REPS) for _ in range(2)]
    model = nn.Sequential(*blocks, nn.Linear(D, CLASSES)) if last else nn.Sequential(*blocks)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    cap = common.Capture(args, rank, world, dp_rank=dp, pp_rank=stage)
    batches = iter(cap.data(common.loader(args, dev, D, CLASSES, seed=dp)))  # one pipeline, one seed
    prev_rank, next_rank = rank - 1, rank + 1
    mb = args.batch // M
    ticks = []
    for step in range(args.steps):
        ticks.append(time.perf_counter())
        with cap.step(step):
            x, y = next(batches)
            dev.step = step
            dev.host_stall()
            opt.zero_grad(set_to_none=True)
            ins, outs = [], []
            for m in range(M):
                if first:
                    inp = x[m * mb:(m + 1) * mb]
                else:
                    inp = torch.empty(mb, D)
                    with cap.p2p("forward-recv", peer=prev_rank, send=False, size_bytes=inp.numel() * 4, microbatch=m):
                        dist.recv(inp, src=prev_rank)
                    inp.requires_grad_(True)
                with cap.op("forward-compute", microbatch=m):
                    out = model(inp)
                    if last:  # the loss is part of the last stage's forward
                        out = F.cross_entropy(out, y[m * mb:(m + 1) * mb]) / M
                if not last:
                    with cap.p2p("forward-send", peer=next_rank, send=True, size_bytes=out.numel() * 4, microbatch=m):
                        dist.send(out.detach(), dst=next_rank)
                ins.append(inp)
                outs.append(out)
            for m in range(M):
                grad = None
                if not last:
                    grad = torch.empty(mb, D)
                    with cap.p2p("backward-recv", peer=next_rank, send=False, size_bytes=grad.numel() * 4,
                                 microbatch=m):
                        dist.recv(grad, src=next_rank)
                with cap.op("backward-compute", microbatch=m):
                    outs[m].backward(grad)
                if not first:
                    g = ins[m].grad
                    with cap.p2p("backward-send", peer=prev_rank, send=True, size_bytes=g.numel() * 4, microbatch=m):
                        dist.send(g, dst=prev_rank)
            allreduce_grads(params, dp_group, cap)
            with cap.op("optimizer"):
                opt.step()
    ticks.append(time.perf_counter())
    cap.close()
    common.report_steps(rank, ticks)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
