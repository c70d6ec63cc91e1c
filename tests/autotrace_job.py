"""Training scripts for the zero-code capture tests (tests/tracer/test_autotrace.py), run as real
gloo ranks: ``python -m laggard.tracer.auto.boot tests/autotrace_job.py MODE`` (no laggard import in
the script: the boot traces it) or plain ``python tests/autotrace_job.py MODE`` (untraced, or traced
through the explicit API where MODE says so). The environment gives the rank (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, as torchrun does) and the injection: SLOW_RANK's forward sleeps SLOW_MS
(a slow device: it takes no CPU); STEPS optimizer steps; DUMP a directory for the final parameters.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 8))


def loader(rank: int, steps: int, batch: int = 16) -> DataLoader:
    """Random batches; SLOW_RANK's take SLOW_DATA_MS longer to load (a slow input pipeline: it sleeps)."""
    g = torch.Generator().manual_seed(100 + rank)
    n = steps * batch * 2
    slow_ms = float(os.environ.get("SLOW_DATA_MS", "0")) if rank == int(os.environ.get("SLOW_RANK", "-1")) else 0

    def collate(items: list) -> tuple[torch.Tensor, torch.Tensor]:
        if slow_ms:
            time.sleep(slow_ms / 1000)
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    return DataLoader(TensorDataset(torch.randn(n, 32, generator=g), torch.randint(0, 8, (n,), generator=g)),
                      batch_size=batch, collate_fn=collate)


def slow_forward(model: nn.Module, rank: int) -> None:
    if rank == int(os.environ.get("SLOW_RANK", "-1")) and os.environ.get("SLOW_MS", "0") != "0":
        ms = float(os.environ.get("SLOW_MS", "30"))
        inner = model.forward

        def forward(x: torch.Tensor) -> torch.Tensor:
            time.sleep(ms / 1000)
            return inner(x)

        model.forward = forward  # type: ignore[method-assign]


def dump(model: nn.Module, rank: int) -> None:
    out = os.environ.get("DUMP")
    if out:
        torch.save(model.state_dict(), os.path.join(out, f"params{rank}.pt"))


def ddp(accumulate: int = 1) -> None:
    """A plain DDP loop: DataLoader, forward, loss, backward (``no_sync`` on all but the last of
    ``accumulate`` microbatches), SGD step."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    model = mlp()
    slow_forward(model, rank)
    net = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.02)  # a few buckets
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    steps = int(os.environ.get("STEPS", "10"))
    it = iter(loader(rank, steps * accumulate))
    for _ in range(steps):
        opt.zero_grad()
        for j in range(accumulate):
            x, y = next(it)
            if j < accumulate - 1:
                with net.no_sync():
                    nn.functional.cross_entropy(net(x), y).backward()
            else:
                nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    dump(model, rank)
    dist.destroy_process_group()


def manual() -> None:
    """Explicit ``laggard.autotrace`` with the program's own calls, some also wrapped by the tracer:
    each must be one op."""
    import laggard

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    session = laggard.autotrace(model, opt, out_dir=os.environ["TRACE_OUT"], name="manual")
    t = session.tracer
    x = torch.ones(64)
    for i, (xb, yb) in enumerate(loader(rank, 4)):
        if i == 4:
            break
        nn.functional.cross_entropy(model(xb), yb).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        dist.broadcast(x, 0)
        dist.barrier()
        objs: list[object] = [None] * world
        dist.all_gather_object(objs, {"rank": rank})
        peer = 1 - rank
        if rank == 0:
            dist.send(x, peer)
            dist.recv(x, peer)
        else:
            dist.recv(x, peer)
            dist.send(x, peer)
        w = dist.isend(x, peer) if rank == 0 else dist.irecv(x, peer)
        w.wait()
        t.all_reduce(x, name="mine")
        with t.collective("wrapped"):
            dist.all_reduce(x)
        opt.step()
        opt.zero_grad()
    session.close()
    dist.destroy_process_group()


def fsdp() -> None:
    """FSDP2 (``fully_shard``) on gloo: its all-gathers and reduce-scatters."""
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    model = mlp()
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    steps = int(os.environ.get("STEPS", "4"))
    for _, (xb, yb) in zip(range(steps), loader(dist.get_rank(), steps), strict=False):
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


def tp() -> None:
    """Tensor parallelism through DTensor (a column-wise then a row-wise linear layer over 2 ranks):
    its all-reduces are functional collectives, awaited when their result is used."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = parallelize_module(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)), mesh,
                               {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _, (xb, yb) in zip(range(4), loader(0, 4), strict=False):  # every rank the same batch
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


def pipe() -> None:
    """Two 2-stage pipelines over blocking send/recv (ranks 0 -> 1 and 2 -> 3, no collectives), each
    stage's half of the MLP; stage 1's forward sleeps SLOW_MS (a slow stage)."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    stage, peer = rank % 2, rank ^ 1
    torch.manual_seed(stage)
    half = nn.Sequential(nn.Linear(32, 64), nn.ReLU()) if stage == 0 else nn.Linear(64, 8)
    if stage == 1:
        slow_forward(half, rank)
    opt = torch.optim.SGD(half.parameters(), lr=0.05)
    for _, (xb, yb) in zip(range(int(os.environ.get("STEPS", "8"))), loader(rank // 2, 8), strict=False):
        if stage == 0:
            act = half(xb)
            dist.send(act.detach(), peer)
            grad = torch.empty_like(act)
            dist.recv(grad, peer)
            act.backward(grad)
        else:
            act = torch.empty(xb.shape[0], 64)
            dist.recv(act, peer)
            act.requires_grad_()
            nn.functional.cross_entropy(half(act), yb).backward()
            dist.send(act.grad, peer)
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


def single() -> None:
    """One process, no torch.distributed: the tracer starts at the first phase."""
    torch.set_num_threads(1)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _, (xb, yb) in zip(range(5), loader(0, 5), strict=False):
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():  # an evaluation after training: no step of its own
        model(xb)


def fail() -> None:
    dist.init_process_group("gloo")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for i, (xb, yb) in enumerate(loader(dist.get_rank(), 6)):
        if i == 3:
            sys.exit(3)
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()


MODES = {"ddp": ddp, "accumulate": lambda: ddp(accumulate=2), "manual": manual, "fsdp": fsdp, "tp": tp, "pipe": pipe, "single": single,
         "fail": fail}

if __name__ == "__main__":
    MODES[sys.argv[1]]()
