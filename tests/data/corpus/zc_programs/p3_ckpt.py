"""DDP where rank 0 saves a checkpoint after every 10th step and then sleeps 300 ms (a slow
filesystem); the other rank waits for it at the next gradient all-reduce.

    laggard run --nproc-per-node 2 --out trace p3_ckpt.py --steps 45
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from common import MLP, init, parse  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def main() -> None:
    args = parse(lambda p: p.add_argument("--no-ckpt", action="store_true"))
    rank, _world = init()
    model = DDP(MLP(h=512))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    lf = torch.nn.CrossEntropyLoss()
    path = os.path.join(tempfile.gettempdir(), "zc_ckpt.pt")
    for step in range(args.steps):
        x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
        opt.zero_grad(set_to_none=True)
        lf(model(x), y).backward()
        opt.step()
        if rank == 0 and step % 10 == 9 and not args.no_ckpt:
            torch.save(model.module.state_dict(), path)
            time.sleep(0.3)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
