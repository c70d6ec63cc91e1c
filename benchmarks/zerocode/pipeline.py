"""A 2-stage pipeline by hand: rank 0 runs the first half of the MLP, rank 1 the second half and the loss;
activations go forward and their gradients back with dist.send/dist.recv, M microbatches a step (GPipe:
every forward, then every backward), gloo on CPU.

    torchrun --nproc-per-node 2 pipeline.py --inject stage --ms 10   # stage 1's forward 10 ms longer a microbatch
"""

from __future__ import annotations

import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from zc_common import (  # noqa: E402
    HIDDEN,
    IN,
    OUT,
    RandomData,
    StepClock,
    _Device,
    init_dist,
    parse,
    slowed,
    traceml_on,
)

MICROBATCHES = 4


class Stage(nn.Module):
    """Two layers beside ``fwd_ms``/``bwd_ms`` of emulated device time per microbatch."""

    def __init__(self, d_in: int, d_out: int, fwd_ms: float, bwd_ms: float) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(d_in, HIDDEN), nn.Linear(HIDDEN, d_out)
        self.fwd_s, self.bwd_s = fwd_ms / 1e3, bwd_ms / 1e3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(_Device.apply(torch.relu(self.a(x)), self.fwd_s, self.bwd_s))


def main() -> None:
    args = parse(fwd_ms=6.0, bwd_ms=9.0, rank=1, ms=10.0)
    rank, world = init_dist()
    assert world == 2, "a 2-stage pipeline: --nproc-per-node 2"
    tm = None
    if traceml_on():
        import traceml_ai as tm

        tm.init()
    torch.manual_seed(rank)
    extra = args.ms if slowed(args, rank, "stage") else 0.0
    model = Stage(IN if rank == 0 else HIDDEN, HIDDEN if rank == 0 else OUT, args.fwd_ms + extra, args.bwd_ms)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    ds = RandomData(args.batch * args.steps, seed=0)  # the same batches on both stages: rank 1 takes the labels
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, num_workers=0, collate_fn=ds.collate)
    mb = args.batch // MICROBATCHES
    clock = StepClock()
    for x, y in loader:
        clock.tick()
        with tm.trace_step(model) if tm is not None else contextlib.nullcontext():
            opt.zero_grad(set_to_none=True)
            if rank == 0:
                outs = []
                for m in range(MICROBATCHES):
                    out = model(x[m * mb:(m + 1) * mb])
                    dist.send(out.detach(), dst=1)
                    outs.append(out)
                for out in outs:
                    grad = torch.empty_like(out)
                    dist.recv(grad, src=1)
                    out.backward(grad)
            else:
                ins, losses = [], []
                for m in range(MICROBATCHES):
                    act = torch.empty(mb, HIDDEN)
                    dist.recv(act, src=0)
                    act.requires_grad_(True)
                    losses.append(loss_fn(model(act), y[m * mb:(m + 1) * mb]) / MICROBATCHES)
                    ins.append(act)
                for act, loss in zip(ins, losses, strict=True):
                    loss.backward()
                    dist.send(act.grad, dst=0)
            opt.step()
    clock.tick()
    clock.write(rank)
    dist.barrier()  # no rank tears gloo down while a peer still runs its last collective
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
