"""What the generalization corpus's programs share: their flags, an emulated device, the injections.

Each program in benchmarks/families/ is a standalone training script (gloo ranks on the CPU) that never
imports laggard's analysis. It runs under ``laggard run`` (zero-code capture), under plain torchrun with
laggard's Tracer or torch.profiler inside (``--capture``), and takes one injected cause by flags.

**The emulated device.** Four ranks on two shared cores cannot each run real compute without timing
each other's contention: extra CPU work on one rank slows its neighbours too. So each model op's
accelerator time is emulated with ``time.sleep`` (a kernel's duration takes no host CPU), beside a
little real CPU work (small matmuls, so the ops and the autograd graph are real). A slow device is the
same op sleeping longer *in proportion to its own time*: ``--inject device --factor 1.4`` makes every
emulated op of the target rank 1.4x as long, the truth is exact. The sleeps carry a small per-op
jitter (log-normal, ``--jitter``, seeded by rank) so a clean twin has the step-to-step noise a real
device has.

**Injections** (one per job; ``none`` is the clean twin):
  device     the target rank's device time x factor, every step
  transient  the same, only in steps [--from-step, --to-step)
  stage      every rank of pipeline stage --stage: device time x factor (a heavy stage)
  host       the target rank stalls --ms on the host before its step's compute every --every steps
  data       the target rank's DataLoader takes --ms more per batch
  cpu        the target rank's ops take factor x their device time, the extra spent in real CPU work
             (busy matmuls, not sleep: the harder set, as on two shared cores it slows the neighbours too)
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import statistics
import time

import torch
import torch.distributed as dist

INJECTIONS = ("none", "device", "transient", "stage", "host", "data", "cpu")


def parse(argv: list[str] | None = None, **defaults: object) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--inject", default="none", choices=INJECTIONS)
    ap.add_argument("--rank", type=int, default=1, help="the target rank (device, transient, host, data, cpu)")
    ap.add_argument("--stage", type=int, default=1, help="the target stage (stage)")
    ap.add_argument("--factor", type=float, default=1.5, help="device time (or CPU work) multiplier")
    ap.add_argument("--ms", type=float, default=30.0, help="host stall or DataLoader delay, ms")
    ap.add_argument("--every", type=int, default=3, help="host: stall every this many steps")
    ap.add_argument("--from-step", type=int, default=0, help="transient: first slow step")
    ap.add_argument("--to-step", type=int, default=10**9, help="transient: first step no longer slow")
    ap.add_argument("--step-ms", type=float, default=40.0, help="emulated device ms of a healthy rank's step")
    ap.add_argument("--jitter", type=float, default=0.03, help="log-normal sigma of each emulated op's time")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--capture", default="auto", choices=["auto", "tracer", "profiler"],
                    help="auto: nothing inside (laggard run, or plain torchrun); tracer / profiler: record "
                         "with laggard's Tracer / torch.profiler into --out")
    ap.add_argument("--out", default="trace", help="where --capture tracer / profiler writes")
    ap.set_defaults(**defaults)
    return ap.parse_args(argv)


def init_dist() -> tuple[int, int]:
    """One intra-op thread (four ranks share two cores) and the gloo group: (rank, world size)."""
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


class Device:
    """The emulated accelerator of one rank: how long its ops sleep in the current step."""

    def __init__(self, args: argparse.Namespace, rank: int, stage: int | None = None) -> None:
        self.args, self.rank, self.stage = args, rank, stage
        self.step = 0
        self._rng = random.Random(args.seed * 1009 + rank)

    def factor(self) -> float:
        a = self.args
        if a.inject == "device" and self.rank == a.rank:
            return a.factor
        if a.inject == "transient" and self.rank == a.rank and a.from_step <= self.step < a.to_step:
            return a.factor
        if a.inject == "stage" and self.stage is not None and self.stage == a.stage:
            return a.factor
        return 1.0

    def sleep(self, ms: float) -> None:
        """``ms`` of device time (this rank's factor and the op's jitter applied); on the target of
        ``cpu``, (factor - 1) x that time more of real CPU work (``burn``)."""
        if ms <= 0:
            return
        s = self.args.jitter
        jit = math.exp(self._rng.gauss(-s * s / 2, s)) if s > 0 else 1.0
        time.sleep(ms * self.factor() * jit / 1e3)
        a = self.args
        if a.inject == "cpu" and self.rank == a.rank and a.factor > 1.0:
            burn((a.factor - 1.0) * ms * jit / 1e3)

    def host_stall(self) -> None:
        """The host stall before this step's compute, where injected."""
        a = self.args
        if a.inject == "host" and self.rank == a.rank and self.step % a.every == a.every - 1:
            time.sleep(a.ms / 1e3)

    def data_delay_s(self) -> float:
        a = self.args
        return a.ms / 1e3 if a.inject == "data" and self.rank == a.rank else 0.0


_BURN = torch.ones(64, 64)


def burn(seconds: float) -> None:
    """Real CPU work (64 x 64 matmuls) until ``seconds`` of wall time have passed: a slow op that takes
    the host's CPU, unlike a sleep. Its length is the wall time, so where the cores are shared the
    rank's op is as slow as injected and its neighbours lose the CPU it took."""
    end = time.perf_counter() + seconds
    with torch.no_grad():
        while time.perf_counter() < end:
            _BURN @ _BURN  # noqa: B018 - the work is the point


class _Sleep(torch.autograd.Function):
    """Identity whose forward and backward each take emulated device time (``Device.sleep``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dev: Device, fwd_ms: float, bwd_ms: float) -> torch.Tensor:  # noqa: ANN001
        ctx.dev, ctx.bwd_ms = dev, bwd_ms
        dev.sleep(fwd_ms)
        return x.clone()  # a view could not be modified in place downstream

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        ctx.dev.sleep(ctx.bwd_ms)
        return grad, None, None, None


def device_op(x: torch.Tensor, dev: Device, fwd_ms: float, bwd_ms: float) -> torch.Tensor:
    """``x`` through an op that takes ``fwd_ms`` of device time forward and ``bwd_ms`` backward."""
    return _Sleep.apply(x, dev, fwd_ms, bwd_ms)


class Block(torch.nn.Module):
    """A linear layer (``d_in -> d_out``) and ReLU beside ``fwd_ms``/``bwd_ms`` of emulated device time.

    The real CPU work is the layer applied to the same input ``reps`` times and averaged (the same value,
    ``reps`` x the matmuls forward and backward)."""

    def __init__(self, d_in: int, d_out: int, dev: Device, fwd_ms: float, bwd_ms: float, reps: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(d_in, d_out)
        self.dev, self.fwd_ms, self.bwd_ms, self.reps = dev, fwd_ms, bwd_ms, reps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        for _ in range(self.reps - 1):
            h = h + self.lin(x)
        h = torch.relu(h / self.reps if self.reps > 1 else h)
        return device_op(h, self.dev, self.fwd_ms, self.bwd_ms)


class RandomData(torch.utils.data.Dataset):
    """Random inputs and labels; ``delay_s`` of host time per batch (in ``collate``): a slow loader."""

    def __init__(self, n: int, d_in: int, classes: int, seed: int, delay_s: float = 0.0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = torch.randn(n, d_in, generator=g), torch.randint(0, classes, (n,), generator=g)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]

    def collate(self, items: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


def loader(args: argparse.Namespace, dev: Device, d_in: int, classes: int, *, seed: int | None = None,
           batch: int | None = None) -> torch.utils.data.DataLoader:
    """``args.steps`` batches of random data (the target's slow where ``data`` is injected)."""
    b = batch or args.batch
    ds = RandomData(b * args.steps, d_in, classes, seed=dev.rank if seed is None else seed,
                    delay_s=dev.data_delay_s())
    return torch.utils.data.DataLoader(ds, batch_size=b, shuffle=False, num_workers=0, collate_fn=ds.collate,
                                       drop_last=True)


class Capture:
    """The in-program capture ``--capture`` asks for: laggard's Tracer or torch.profiler (or nothing).

    ``step(n)`` is one training step's context; ``data(loader)`` wraps a DataLoader (the Tracer records
    each wait for a batch); ``op(name, ...)``, ``p2p(name, peer=, send=)`` and ``collective(name, group=)``
    are the Tracer's timed spans (no-ops otherwise: zero-code capture and torch.profiler see the calls
    themselves); ``close()`` writes the trace into ``--out``.

    Under torch.profiler the steps are the profiler's own ``ProfilerStep#N`` annotations, as a user's
    ``schedule`` makes them: each ``prof.step()`` ends one window and opens the next, so the windows
    tile the loop and what runs between two steps' bodies (the next batch's data wait, a host stall)
    lies inside a window instead of being dropped as outside every step."""

    def __init__(self, args: argparse.Namespace, rank: int, world: int, **layout: int) -> None:
        self.kind, self.rank, self.out = args.capture, rank, args.out
        self.tracer = self.prof = None
        self._saved = False
        if self.kind != "auto":
            os.makedirs(args.out, exist_ok=True)
        if self.kind == "tracer":
            from laggard.tracer import Tracer

            self.tracer = Tracer(args.out, rank=rank, world_size=world, **layout)
        elif self.kind == "profiler":
            schedule = torch.profiler.schedule(wait=0, warmup=0, active=args.steps, repeat=1)
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=False,
                                               schedule=schedule, on_trace_ready=self._save)
            self.prof.__enter__()

    def _save(self, prof) -> None:  # noqa: ANN001
        prof.export_chrome_trace(os.path.join(self.out, f"rank{self.rank}.json"))
        self._saved = True

    def step(self, step: int):  # noqa: ANN201 - a context manager for the step
        if self.tracer is not None:
            return self.tracer.step(step)
        if self.prof is not None:
            return _profiler_step(self.prof)
        return contextlib.nullcontext()

    def data(self, iterable):  # noqa: ANN001, ANN201
        return self.tracer.data(iterable) if self.tracer is not None else iterable

    def op(self, name: str, **kw: object):  # noqa: ANN201
        return self.tracer.op(name, **kw) if self.tracer is not None else contextlib.nullcontext()

    def p2p(self, name: str, *, peer: int, send: bool, **kw: object):  # noqa: ANN201
        return (self.tracer.p2p(name, peer=peer, send=send, **kw) if self.tracer is not None
                else contextlib.nullcontext())

    def collective(self, name: str, *, group: object = None, **kw: object):  # noqa: ANN201
        if self.tracer is None:
            return contextlib.nullcontext()
        return self.tracer.collective(name, group=group, **kw)

    def comm(self, name: str, *, peer: int | None = None, send: bool = True, group: object = None, **kw: object):  # noqa: ANN201
        """``p2p`` where a ``peer`` is given, else ``collective``."""
        if peer is not None:
            return self.p2p(name, peer=peer, send=send, **kw)
        return self.collective(name, group=group, **kw)

    def close(self) -> None:
        if self.tracer is not None:
            self.tracer.close()
        if self.prof is not None:
            self.prof.__exit__(None, None, None)  # a loop cut short: the trace is written here
            if not self._saved:
                self._save(self.prof)


@contextlib.contextmanager
def _profiler_step(prof):  # noqa: ANN001, ANN202
    yield
    prof.step()


def report_steps(rank: int, ticks: list[float]) -> None:
    """With FAMILY_STEP_TIMES=1: this rank's median step time (the first step left out), on stdout."""
    if os.environ.get("FAMILY_STEP_TIMES") != "1":
        return
    d = [b - a for a, b in zip(ticks, ticks[1:], strict=False)][1:]
    if d:
        print(f"[step-times] rank {rank}: median {statistics.median(d) * 1e3:.1f} ms over {len(d)} steps", flush=True)
