"""DDP with AdamW, OneCycleLR and bf16 autocast; a DataLoader with ``--workers`` workers (persistent);
``--slow-rank``'s Dataset sleeps ``--item-ms`` per item (a slow input pipeline on that rank only).

    laggard run --nproc-per-node 2 --out trace p9_amp_data.py --steps 40 --slow-rank 1 --item-ms 2
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from common import MLP, init, parse  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def _extra(p) -> None:  # noqa: ANN001
    p.add_argument("--item-ms", type=float, default=2.0)
    p.add_argument("--workers", type=int, default=2)


args = parse(_extra)
rank, world = init()


class Items(torch.utils.data.Dataset):
    def __init__(self, slow: bool) -> None:
        self.slow = slow

    def __len__(self) -> int:
        return 64 * args.steps

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.slow:
            time.sleep(args.item_ms / 1e3)
        g = torch.Generator().manual_seed(i)
        return torch.randn(128, generator=g), torch.tensor(i % 10)


def main() -> None:
    dl = torch.utils.data.DataLoader(Items(rank == args.slow_rank), batch_size=32, num_workers=args.workers,
                                     persistent_workers=args.workers > 0)
    model = DDP(MLP(h=512))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=len(dl))
    lf = torch.nn.CrossEntropyLoss()
    for x, y in dl:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = lf(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
