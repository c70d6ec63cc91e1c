"""DDP (gloo), an MLP classifier. Every --every steps every rank validates its share of a validation
set under torch.no_grad() through the DDP model's module, then the validation losses are all-reduced.
--mode alone: the split is uneven, --extra-rank gets --extra-batches batches more than the 2 each other
rank gets (a split by contiguous ranges that left the remainder to one rank). --mode all: an even
split, 2 batches each. --mode slow: even split, --extra-rank's emulated device 1.3x slower.
Accelerator time emulated by a sleep in forward/backward."""
import argparse
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
rank, world = dist.get_rank(), dist.get_world_size()
SLOW = 1.3 if args.mode == "slow" and rank == args.extra_rank else 1.0
BASE = 2


class Dev(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        time.sleep(0.009 * SLOW)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(0.011 * SLOW)
        return g


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = torch.nn.Linear(48, 96), torch.nn.Linear(96, 96), torch.nn.Linear(96, 6)

    def forward(self, x):
        return self.l3(Dev.apply(torch.relu(self.l2(torch.relu(self.l1(x))))))


torch.manual_seed(0)
model = DDP(MLP())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(11 + rank)
events, step_ends = [], []
for it in range(1, args.steps + 1):
    x, y = torch.randn(32, 48, generator=gen), torch.randint(0, 6, (32,), generator=gen)
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    if it % args.every == 0:
        n = BASE + (args.extra_batches if args.mode == "alone" and rank == args.extra_rank else 0)
        t0 = time.time()
        model.eval()
        loss = torch.zeros(())
        with torch.no_grad():
            for _ in range(n):
                vx, vy = torch.randn(32, 48, generator=gen), torch.randint(0, 6, (32,), generator=gen)
                loss += torch.nn.functional.cross_entropy(model.module(vx), vy)
        model.train()
        dist.all_reduce(loss)
        events.append({"step": it, "batches": n, "t0": t0, "t1": time.time()})
    step_ends.append(time.time())
with open(f"steps.rank{rank}.json", "w") as f:
    json.dump({"rank": rank, "counter": "loop iteration (1-based)", "events": events, "step_ends": step_ends}, f)
dist.barrier()
dist.destroy_process_group()
