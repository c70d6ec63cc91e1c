"""A pure 4-stage pipeline over blocking dist.send / dist.recv: GPipe, 4 microbatches, ~100 ms steps.

    laggard run --nproc-per-node 4 pp_blocking.py --inject stage --stage 2 --factor 1.3

Rank r is stage r (its ``common.Device`` has stage=r, so ``--inject stage --stage S`` slows rank S).
A step: every microbatch's forward (receive the activation from stage r-1, two Blocks, send to stage
r+1; the last stage adds the loss), then every microbatch's backward in the same order (receive the
gradient from r+1, backward, send the input's gradient to r-1), then SGD on each stage's own layers.
Forward order on every stage and blocking transfers: stage r sends in the order stage r+1 receives,
so no two neighbours wait on each other.

Data: the first stage reads the inputs and the last stage the labels, from loaders with one seed (the
same batches); the middle stages read no data (``--inject data`` targets stage 0 or the last).

A healthy step is (M + P - 1) microbatch slots of forward + backward (GPipe's fill and drain): each
stage's device time per microbatch is DEVICE_SHARE x --step-ms / (M + P - 1), a third forward and two
thirds backward; the rest is the transfers, the real matmuls (REPS per Block) and Python.
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

D, CLASSES, MICROBATCHES = 128, 16, 4
REPS = 6  # real matmul repetitions per Block
DEVICE_SHARE = 0.5  # of --step-ms, measured: the 24 transfers a step and their waits take the rest


def main() -> None:
    args = common.parse(step_ms=100.0)
    rank, world = common.init_dist()
    P, M = world, MICROBATCHES
    first, last = rank == 0, rank == P - 1
    dev = common.Device(args, rank, stage=rank)
    slot_ms = DEVICE_SHARE * args.step_ms / (M + P - 1)  # one microbatch's forward + backward on one stage
    torch.manual_seed(rank)
    blocks = [common.Block(D, D, dev, slot_ms / 3 / 2, 2 * slot_ms / 3 / 2, REPS) for _ in range(2)]
    model = nn.Sequential(*blocks, nn.Linear(D, CLASSES)) if last else nn.Sequential(*blocks)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cap = common.Capture(args, rank, world, dp_rank=0, pp_rank=rank)
    # only the ends read data (one seed: the last stage's labels are the first stage's inputs' labels)
    batches = iter(cap.data(common.loader(args, dev, D, CLASSES, seed=0))) if first or last else None
    mb = args.batch // M
    ticks = []
    for step in range(args.steps):
        ticks.append(time.perf_counter())
        with cap.step(step):
            x, y = next(batches) if batches is not None else (None, None)
            dev.step = step
            dev.host_stall()
            opt.zero_grad(set_to_none=True)
            ins, outs = [], []
            for m in range(M):
                if first:
                    inp = x[m * mb:(m + 1) * mb]
                else:
                    inp = torch.empty(mb, D)
                    with cap.p2p("forward-recv", peer=rank - 1, send=False, microbatch=m):
                        dist.recv(inp, src=rank - 1)
                    inp.requires_grad_(True)
                with cap.op("forward-compute", microbatch=m):
                    out = model(inp)
                    if last:
                        out = F.cross_entropy(out, y[m * mb:(m + 1) * mb]) / M
                if not last:
                    with cap.p2p("forward-send", peer=rank + 1, send=True, microbatch=m):
                        dist.send(out.detach(), dst=rank + 1)
                ins.append(inp)
                outs.append(out)
            for m in range(M):
                grad = None
                if not last:
                    grad = torch.empty(mb, D)
                    with cap.p2p("backward-recv", peer=rank + 1, send=False, microbatch=m):
                        dist.recv(grad, src=rank + 1)
                with cap.op("backward-compute", microbatch=m):
                    outs[m].backward(grad)
                if not first:
                    with cap.p2p("backward-send", peer=rank - 1, send=True, microbatch=m):
                        dist.send(ins[m].grad, dst=rank - 1)
            with cap.op("optimizer"):
                opt.step()
    ticks.append(time.perf_counter())
    cap.close()
    common.report_steps(rank, ticks)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
