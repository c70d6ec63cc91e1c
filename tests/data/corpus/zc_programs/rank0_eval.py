"""DDP; every --every steps rank --eval-rank alone evaluates --eval-batches batches under no_grad
(the common `if rank == 0: evaluate()`), while the others go on to the next step and wait for it at
the gradient all-reduce. Device time emulated by sleeping in the forward and backward."""
import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--every", type=int, default=10)
ap.add_argument("--eval-rank", type=int, default=0)
ap.add_argument("--eval-batches", type=int, default=8)
ap.add_argument("--fwd-ms", type=float, default=10)
ap.add_argument("--via-ddp", action="store_true")
args = ap.parse_args()


class Dev(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        time.sleep(args.fwd_ms / 1e3)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(args.fwd_ms / 1e3)
        return g


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 128)
        self.b = torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.b(Dev.apply(torch.relu(self.a(x))))


dist.init_process_group("gloo")
torch.manual_seed(0)
torch.set_num_threads(1)
rank = dist.get_rank()
model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    if rank == args.eval_rank and step % args.every == args.every - 1:
        model.eval()
        with torch.no_grad():
            for _ in range(args.eval_batches):
                (model if args.via_ddp else model.module)(torch.randn(32, 64))
        model.train()
dist.destroy_process_group()
