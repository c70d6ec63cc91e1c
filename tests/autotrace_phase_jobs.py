"""Training scripts for the zero-code capture's phase and step tests (tests/tracer/test_autotrace.py):
optimizers stepping inside another's step or one after another, forwards run with grad disabled, a
loop that updates the weights itself.
Run as tests/autotrace_job.py's are (``python -m laggard.tracer.auto.boot tests/autotrace_phase_jobs.py
MODE``, the environment giving the rank as torchrun does), with its model and batches; STEPS
optimizer steps.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from autotrace_job import loader, mlp  # this script's folder is on sys.path, as for any script


def zero() -> None:
    """DDP with torch's ZeroRedundancyOptimizer over SGD: its ``step()`` runs the inner SGD's ``step()``
    (both fire torch's optimizer step hooks), then broadcasts every parameter from the rank that owns
    its shard, awaiting them all before it returns. TRACE_OUT: traced through ``laggard.autotrace``
    with the inner SGD given as the step's optimizer (run plainly, not under the boot)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    net = nn.parallel.DistributedDataParallel(mlp())
    opt = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.SGD, lr=0.05)
    session = None
    if os.environ.get("TRACE_OUT"):
        import laggard

        session = laggard.autotrace(net, opt.optim, out_dir=os.environ["TRACE_OUT"], name="zero")
    steps = int(os.environ.get("STEPS", "6"))
    for _, (x, y) in zip(range(steps), loader(rank, steps), strict=False):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    if session is not None:
        session.close()
    dist.destroy_process_group()


def gan() -> None:
    """One process, no torch.distributed: a GAN-like loop, two models and two independent optimizers,
    the discriminator's stepping first in every iteration."""
    torch.set_num_threads(1)
    gen, disc = mlp(), nn.Linear(8, 1)
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.05)
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.05)
    steps = int(os.environ.get("STEPS", "5"))
    for _, (x, _y) in zip(range(steps), loader(0, steps), strict=False):
        opt_d.zero_grad()
        disc(gen(x).detach()).mean().backward()
        opt_d.step()
        opt_g.zero_grad()
        (-disc(gen(x)).mean()).backward()
        opt_g.step()


class _Checkpointed(nn.Module):
    """The MLP with its middle block activation-checkpointed (non-reentrant) while training: that
    block's forward runs again inside the backward."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head, self.out = nn.Linear(32, 128), nn.Linear(128, 8)
        self.block = nn.Sequential(nn.ReLU(), nn.Linear(128, 128), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        h = self.head(x)
        h = checkpoint(self.block, h, use_reentrant=False) if self.training else self.block(h)
        return self.out(h)


def validate() -> None:
    """DDP training of ``_Checkpointed`` with a validation pass (VAL_BATCHES forwards in eval mode,
    grad off: ``torch.no_grad()`` and ``torch.inference_mode()`` by turns) before the training batch
    of every odd step."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    net = nn.parallel.DistributedDataParallel(_Checkpointed())
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    steps, val_batches = int(os.environ.get("STEPS", "6")), int(os.environ.get("VAL_BATCHES", "2"))
    val = torch.randn(val_batches, 16, 32, generator=torch.Generator().manual_seed(7))
    for i, (x, y) in zip(range(steps), loader(rank, steps), strict=False):
        if i % 2:
            net.eval()
            with torch.no_grad() if i % 4 == 1 else torch.inference_mode():
                for xv in val:
                    net(xv)
            net.train()
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    dist.destroy_process_group()


def manual() -> None:
    """No optimizer and no DDP: each gradient all-reduced and averaged by hand, then a hand-written SGD
    update. END_STEP=1: the script calls ``laggard.end_step()`` after each update (it imports laggard
    only then)."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    net = mlp()
    end_step = None
    if os.environ.get("END_STEP") == "1":
        import laggard

        end_step = laggard.end_step
    steps = int(os.environ.get("STEPS", "5"))
    for _, (x, y) in zip(range(steps), loader(rank, steps), strict=False):
        for p in net.parameters():
            p.grad = None
        nn.functional.cross_entropy(net(x), y).backward()
        with torch.no_grad():
            for p in net.parameters():
                dist.all_reduce(p.grad)
                p.add_(p.grad, alpha=-0.05 / world)
        if end_step is not None:
            end_step()
    dist.destroy_process_group()


def late_eval() -> None:
    """DDP training of the MLP; from step LATE on (after the session has narrowed its forward hooks to
    the modules called outermost so far), every other step evaluates VAL_BATCHES batches under
    ``torch.no_grad()`` through the wrapped module (``net.module``, skipping DDP) and as many through
    an EMA copy of the weights that was never called before."""
    import copy

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    base = mlp()
    ema = copy.deepcopy(base).eval()
    net = nn.parallel.DistributedDataParallel(base)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    steps, late = int(os.environ.get("STEPS", "9")), int(os.environ.get("LATE", "5"))
    val = torch.randn(int(os.environ.get("VAL_BATCHES", "2")), 16, 32, generator=torch.Generator().manual_seed(7))
    for i, (x, y) in zip(range(steps), loader(rank, steps), strict=False):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        if i >= late and i % 2:
            with torch.no_grad():
                for xv in val:
                    net.module(xv)
                    ema(xv)
    dist.destroy_process_group()


MODES = {"zero": zero, "gan": gan, "validate": validate, "manual": manual, "late_eval": late_eval}

if __name__ == "__main__":
    MODES[sys.argv[1]]()
