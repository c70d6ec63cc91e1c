"""Shared by the newcomer-trial programs: arguments, gloo set-up, a small MLP."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist


def parse(extra=None) -> argparse.Namespace:  # noqa: ANN001
    p = argparse.ArgumentParser()
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--ms", type=float, default=40)
    p.add_argument("--steps", type=int, default=40)
    if extra:
        extra(p)
    return p.parse_args()


def init() -> tuple[int, int]:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    return dist.get_rank(), dist.get_world_size()


class MLP(torch.nn.Module):
    def __init__(self, d: int = 128, h: int = 256, c: int = 10) -> None:
        super().__init__()
        self.a = torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.ReLU())
        self.b = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU())
        self.c = torch.nn.Linear(h, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.b(self.a(x)))
