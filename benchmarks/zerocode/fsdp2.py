"""FSDP2: the MLP with ``torch.distributed.fsdp.fully_shard`` on its middle layer and the root, gloo on CPU.

    torchrun --nproc-per-node 4 fsdp2.py --inject forward --ms 30   # rank 2's forward 30 ms longer

Where gloo cannot run FSDP2's collectives the job fails and the benchmark records the error.
"""

from __future__ import annotations

import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from zc_common import StepClock, init_dist, loader_for, model_for, parse, traceml_on  # noqa: E402


def main() -> None:
    args = parse(fwd_ms=15.0, bwd_ms=20.0)  # FSDP2's gathers and reduce-scatters on gloo add ~40 ms a step
    rank, world = init_dist()
    tm = None
    if traceml_on():
        import traceml_ai as tm

        tm.init()
    mesh = init_device_mesh("cpu", (world,))
    model = model_for(args, rank)
    fully_shard(model.mid, mesh=mesh)  # two groups: each collective on gloo costs a few ms on two shared cores
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    clock = StepClock()
    for x, y in loader_for(args, rank):
        clock.tick()
        with tm.trace_step(model) if tm is not None else contextlib.nullcontext():
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
