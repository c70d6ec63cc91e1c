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


def mlp(buffers: bool = False) -> nn.Module:
    """``buffers``: with a BatchNorm, whose running statistics DDP broadcasts from rank 0 before each forward."""
    torch.manual_seed(0)
    norm = [nn.BatchNorm1d(128)] if buffers else []
    return nn.Sequential(nn.Linear(32, 128), *norm, nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 8))


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


class Profiled:
    """torch.profiler around a mode's steps where PROFILE_OUT names a directory (run the script plainly,
    not under the boot): the first two steps wait and warm up, the rest are recorded (PROFILE_SCHEDULE=0:
    every step, one window), and each rank writes ``rank{R}.json.gz`` (``export_chrome_trace``,
    gzipped); PROFILE_SHAPES=1 records shapes (then gloo's send/recv name their peers). ``step()`` ends
    a step. Without PROFILE_OUT it does nothing."""

    def __init__(self, rank: int, steps: int) -> None:
        self.out, self.rank, self.prof = os.environ.get("PROFILE_OUT"), rank, None
        if self.out:
            sched = torch.profiler.schedule(wait=1, warmup=1, active=max(steps - 2, 1)) \
                if os.environ.get("PROFILE_SCHEDULE", "1") == "1" else None
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                               on_trace_ready=self._save if sched is not None else None,
                                               record_shapes=os.environ.get("PROFILE_SHAPES") == "1")

    def _save(self, prof: torch.profiler.profile) -> None:
        import gzip
        import shutil

        raw = os.path.join(self.out, f"rank{self.rank}.json")
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(raw + ".gz", "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
        os.unlink(raw)

    def __enter__(self) -> Profiled:
        if self.prof is not None:
            self.prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.prof is not None:
            self.prof.__exit__(*exc)
            if self.prof.schedule is None or os.environ.get("PROFILE_SCHEDULE", "1") != "1":
                self._save(self.prof)

    def step(self) -> None:
        if self.prof is not None:
            self.prof.step()


def dump(model: nn.Module, rank: int) -> None:
    out = os.environ.get("DUMP")
    if out:
        torch.save(model.state_dict(), os.path.join(out, f"params{rank}.pt"))


def ddp(accumulate: int = 1) -> None:
    """A plain DDP loop: DataLoader, forward, loss, backward (``no_sync`` on all but the last of
    ``accumulate`` microbatches), SGD step. BUFFERS=1: the model has buffers (a BatchNorm);
    SLOW_HOST_MS: SLOW_RANK's host stalls that long before each step's forward (it sleeps)."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    model = mlp(buffers=os.environ.get("BUFFERS") == "1")
    host_ms = float(os.environ.get("SLOW_HOST_MS", "0")) if rank == int(os.environ.get("SLOW_RANK", "-1")) else 0
    slow_forward(model, rank)
    net = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.02)  # a few buckets
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    steps = int(os.environ.get("STEPS", "10"))
    it = iter(loader(rank, steps * accumulate))
    for _ in range(steps):
        opt.zero_grad()
        for j in range(accumulate):
            x, y = next(it)
            if host_ms:
                time.sleep(host_ms / 1000)
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


class _ReduceInBackward(torch.autograd.Function):
    """Megatron's "f": identity forward, the gradient all-reduced over the TP group in backward (each TP
    rank's column shard sends back only its part of the input's gradient)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: object) -> torch.Tensor:  # noqa: ANN001
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceInForward(torch.autograd.Function):
    """Megatron's "g": the row shards' partial outputs all-reduced over the TP group, identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: object) -> torch.Tensor:  # noqa: ANN001
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        return grad, None


class _TPBlock(nn.Module):
    """A column-parallel then a row-parallel linear layer, sharded over a TP group of ``tp`` ranks
    (this rank is ``tp_rank``): the full layers' weights (the same on every rank), cut."""

    def __init__(self, width: int, hidden: int, tp: int, tp_rank: int, group: object, slow_ms: float) -> None:
        super().__init__()
        full1, full2 = nn.Linear(width, hidden), nn.Linear(hidden, width)
        part = hidden // tp
        cols = slice(tp_rank * part, (tp_rank + 1) * part)
        self.w1 = nn.Parameter(full1.weight.detach()[cols].clone())
        self.b1 = nn.Parameter(full1.bias.detach()[cols].clone())
        self.w2 = nn.Parameter(full2.weight.detach()[:, cols].clone())
        self.b2 = nn.Parameter(full2.bias.detach().clone() / tp)  # summed over the TP ranks in the all-reduce
        self.group, self.slow_ms = group, slow_ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        h = torch.relu(nn.functional.linear(_ReduceInBackward.apply(x, self.group), self.w1, self.b1))
        y = nn.functional.linear(h, self.w2, self.b2)
        if self.slow_ms:  # a slow device: this rank's forward takes SLOW_MS longer, plus its own time again
            time.sleep(self.slow_ms / 1000 + (time.perf_counter() - t0))
        return x + _ReduceInForward.apply(y, self.group)


def tp_dp() -> None:
    """tp 2 x dp 2 written by hand on 4 ranks: TP groups {0, 1} and {2, 3} (two TP blocks, each a
    column-parallel then a row-parallel linear layer: an all-reduce of the row output inside every
    block's forward and of the input's gradient inside its backward), DP groups {0, 2} and {1, 3}
    (each gradient all-reduced once per step after the backward). SLOW_RANK's blocks are slow
    (``_TPBlock``); both ranks of a TP group see the same batches."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = 2
    torch.set_num_threads(1)
    tp_groups = [dist.new_group(list(range(i, i + tp))) for i in range(0, world, tp)]  # every rank makes every group
    dp_groups = [dist.new_group(list(range(t, world, tp))) for t in range(tp)]
    tp_group, dp_group = tp_groups[rank // tp], dp_groups[rank % tp]
    slow_ms = float(os.environ.get("SLOW_MS", "0")) if rank == int(os.environ.get("SLOW_RANK", "-1")) else 0.0
    torch.manual_seed(0)
    width, hidden = 64, 256
    embed, head = nn.Linear(32, width), nn.Linear(width, 8)  # replicated over the TP group
    blocks = nn.ModuleList(_TPBlock(width, hidden, tp, rank % tp, tp_group, slow_ms) for _ in range(2))
    model = nn.ModuleDict({"embed": embed, "blocks": blocks, "head": head})

    def forward(x: torch.Tensor) -> torch.Tensor:
        x = embed(x)
        for b in blocks:
            x = b(x)
        return head(x)

    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    dp = world // tp
    steps = int(os.environ.get("STEPS", "8"))
    with Profiled(rank, steps) as prof:
        for _, (xb, yb) in zip(range(steps), loader(rank // tp, steps), strict=False):
            nn.functional.cross_entropy(forward(xb), yb).backward()
            for p in model.parameters():
                p.grad /= dp
                dist.all_reduce(p.grad, group=dp_group)
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.destroy_process_group()


def pipe4() -> None:
    """A pure 4-stage pipeline (dp 1 x pp 4, one stage a rank) over blocking send/recv, no collective:
    each step runs MICROBATCHES (4) microbatches GPipe-style (every forward, then every backward in
    reverse order). SLOW_RANK's forward sleeps SLOW_MS (a slow stage)."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    width = 128
    stage = (nn.Sequential(nn.Linear(width if rank else 32, width), nn.ReLU()) if rank < world - 1
             else nn.Linear(width, 8))
    slow_forward(stage, rank)
    opt = torch.optim.SGD(stage.parameters(), lr=0.05)
    steps, mbs = int(os.environ.get("STEPS", "6")), int(os.environ.get("MICROBATCHES", "4"))
    batches = iter(loader(0, steps * mbs, batch=8))
    one_by_one = os.environ.get("SCHEDULE", "gpipe") == "one-by-one"
    with Profiled(rank, steps) as prof:
        for _ in range(steps):
            ins, outs = [], []
            for m in range(mbs):
                xb, yb = next(batches)
                if rank == 0:
                    x = xb
                else:
                    x = torch.empty(xb.shape[0], width)
                    dist.recv(x, rank - 1)
                    x.requires_grad_()
                y = stage(x)
                if rank < world - 1:
                    dist.send(y.detach(), rank + 1)
                else:
                    y = nn.functional.cross_entropy(y, yb)
                ins.append(x)
                outs.append(y)
                if one_by_one or m == mbs - 1:
                    _pipe_backward(rank, world, ins[::-1], outs[::-1])
                    ins, outs = [], []
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.destroy_process_group()


def _pipe_backward(rank: int, world: int, ins: list, outs: list) -> None:
    for x, y in zip(ins, outs, strict=True):
        if rank == world - 1:
            y.backward()
        else:
            grad = torch.empty_like(y)
            dist.recv(grad, rank + 1)
            y.backward(grad)
        if rank > 0:
            dist.send(x.grad, rank - 1)


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


MODES = {"ddp": ddp, "accumulate": lambda: ddp(accumulate=2), "manual": manual, "fsdp": fsdp, "tp": tp, "tp_dp": tp_dp,
         "pipe": pipe, "pipe4": pipe4, "single": single, "fail": fail}

if __name__ == "__main__":
    MODES[sys.argv[1]]()
