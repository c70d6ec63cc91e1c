"""A plain DDP loop: the MLP, a DataLoader over random data, torch.optim.SGD, 4 gloo ranks on CPU.

    torchrun --nproc-per-node 4 ddp_loop.py --inject forward --ms 30   # rank 2's forward 30 ms longer
    ... --inject host --ms 60 --every 3     # rank 2 stalls 60 ms on the host every third step
    ... --inject compute --reps 4 --slow-reps 6   # rank 2 does 1.5x the real work
    ... --inject data --ms 40               # rank 2's DataLoader 40 ms slower per batch
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from zc_common import StepClock, init_dist, loader_for, model_for, parse, slowed, traceml_on  # noqa: E402


def main() -> None:
    args = parse()
    rank, _world = init_dist()
    tm = None
    if traceml_on():
        import traceml_ai as tm

        tm.init()
    inner = model_for(args, rank)
    model = DDP(inner)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    clock = StepClock()
    for step, (x, y) in enumerate(loader_for(args, rank)):
        clock.tick()
        with tm.trace_step(inner) if tm is not None else contextlib.nullcontext():
            if slowed(args, rank, "host") and step % args.every == args.every - 1:
                time.sleep(args.ms / 1e3)  # host work before the step's compute: no traced op covers it
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
    clock.tick()
    clock.write(rank)
    dist.barrier()  # no rank tears gloo down while a peer still runs its last collective
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
