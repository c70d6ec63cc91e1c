"""DDP (gloo), a small conv net with an exponential moving average (EMA) of its weights kept on every
rank. Every --every steps the EMA model scores --extra-batches batches under torch.no_grad() for a
logged metric: on --extra-rank alone (--mode alone; the others skip the metric), on every rank
(--mode all). --mode slow: every rank scores, --extra-rank's emulated device is 1.3x slower.
Accelerator time emulated by a sleep in forward/backward."""
import argparse
import copy
import json
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--extra-rank", type=int, default=-1)
ap.add_argument("--every", type=int, default=5)
ap.add_argument("--extra-batches", type=int, default=2)
ap.add_argument("--mode", choices=["alone", "all", "slow"], default="alone")
args = ap.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
SLOW = 1.3 if args.mode == "slow" and rank == args.extra_rank else 1.0


class Dev(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        time.sleep(0.008 * SLOW)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(0.012 * SLOW)
        return g


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.f = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.f(Dev.apply(torch.relu(self.c(x)).flatten(1)))


torch.manual_seed(0)
net = Net()
ema = copy.deepcopy(net).eval()
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
gen = torch.Generator().manual_seed(23 + rank)
events, step_ends = [], []
for it in range(1, args.steps + 1):
    x, y = torch.randn(16, 3, 8, 8, generator=gen), torch.randint(0, 10, (16,), generator=gen)
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    with torch.no_grad():
        for pe, p in zip(ema.parameters(), net.parameters(), strict=True):
            pe.mul_(0.99).add_(p, alpha=0.01)
    mine = args.mode != "alone" or rank == args.extra_rank
    if mine and it % args.every == 0:
        t0 = time.time()
        with torch.no_grad():
            for _ in range(args.extra_batches):
                ema(torch.randn(16, 3, 8, 8, generator=gen))
        events.append({"step": it, "batches": args.extra_batches, "t0": t0, "t1": time.time()})
    step_ends.append(time.time())
with open(f"steps.rank{rank}.json", "w") as f:
    json.dump({"rank": rank, "counter": "loop iteration (1-based)", "events": events, "step_ends": step_ends}, f)
dist.barrier()
dist.destroy_process_group()
