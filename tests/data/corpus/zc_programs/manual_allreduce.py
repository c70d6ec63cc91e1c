"""(d) Manual data parallel, no DDP wrapper: an MLP; after backward each parameter's grad is
all_reduce'd (SUM) and divided by the world size by hand, then torch.optim.SGD.step(). Rank --slow-rank,
after the update of every --every-th iteration (it = 1-based), json.dumps a big metrics dict to disk
and sleeps --ms. Accelerator time emulated by a sleep in forward/backward."""
import argparse
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--slow-rank", type=int, default=-1)
ap.add_argument("--every", type=int, default=5)
ap.add_argument("--ms", type=float, default=0.0)
args = ap.parse_args()
torch.set_num_threads(1)
dist.init_process_group(backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()


class Dev(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        time.sleep(0.008)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(0.010)
        return g


torch.manual_seed(1234)
net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(), torch.nn.Linear(128, 128), torch.nn.Tanh())
out = torch.nn.Linear(128, 8)
params = list(net.parameters()) + list(out.parameters())
with torch.no_grad():
    for p in params:
        dist.broadcast(p, 0)
gen = torch.Generator().manual_seed(900 + rank)
W = torch.randn(64, 8, generator=gen)
opt = torch.optim.SGD(params, lr=0.01)
metrics_path = os.path.join(tempfile.mkdtemp(prefix=f"m{rank}_"), "metrics.json")
stalls, step_ends = [], []
for it in range(1, args.steps + 1):
    x = torch.randn(48, 64, generator=gen)
    y = x @ W
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(out(Dev.apply(net(x))), y)
    loss.backward()
    for p in params:
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad.div_(world)
    opt.step()
    if rank == args.slow_rank and it % args.every == 0:
        t0 = time.time()
        with open(metrics_path, "w") as f:
            json.dump({f"layer{i}.m{j}": float(j) * 0.5 for i in range(20) for j in range(100)} | {"it": it,
                      "loss": loss.item()}, f)
        time.sleep(args.ms / 1000)
        stalls.append({"step": it, "t0": t0, "t1": time.time()})
    step_ends.append(time.time())
with open(f"steps.rank{rank}.json", "w") as f:
    json.dump({"rank": rank, "counter": "iteration, 1-based", "stalls": stalls, "step_ends": step_ends}, f)
dist.destroy_process_group()
