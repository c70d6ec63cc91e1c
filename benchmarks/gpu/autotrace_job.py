"""The zero-code capture's GPU job (benchmarks/gpu_check.py part ``autotrace``): a plain DDP loop with no
laggard import, 2 ranks on the one GPU over gloo (NCCL refuses two ranks on one device), rank 1 doing
1.5x the forward's matrix work. Writes its own median step time (ms) to ``$STEP_TIMES/rank{R}.txt``, so traced
and untraced runs are timed alike. ``GPU_CHECK_DEVICE=cpu`` runs it on the CPU."""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

CPU = os.environ.get("GPU_CHECK_DEVICE") == "cpu"
dev = torch.device("cpu") if CPU else torch.device("cuda", 0)
if not CPU:
    torch.cuda.set_device(0)  # CUDA in use before init_process_group: the capture times with CUDA events
dist.init_process_group("gloo")
rank = dist.get_rank()
n = 256 if CPU else 2048
torch.manual_seed(0)


class Heavier(nn.Module):
    """Rank 1's extra matrix work, inside the model's forward (a slow compute rank)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = [torch.randn(n, n, device=dev) / n**0.5 for _ in range(2)] if rank == 1 else []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x
        for w in self.w:
            z = z @ w
        return x + 1e-6 * z if self.w else x


model = nn.Sequential(*[nn.Linear(n, n) for _ in range(4)], Heavier()).to(dev)
net = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(net.parameters(), lr=1e-4)
times = []
for _ in range(int(os.environ.get("STEPS", "30"))):
    t0 = time.perf_counter()
    x = torch.randn(64, n, device=dev)
    net(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
    if not CPU:
        torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
out = os.environ.get("STEP_TIMES")
if out:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"rank{rank}.txt"), "w") as f:
        f.write(str(1e3 * statistics.median(times[5:])))
dist.destroy_process_group()
