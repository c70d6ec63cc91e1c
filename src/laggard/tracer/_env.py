"""What the tracer learns about its environment: torch.distributed, CUDA, the job's layout."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from laggard.ops import JobMeta
from laggard.tracer.clock import ClockSync


def _dist_if_initialized() -> Any:
    import sys

    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _cuda_in_use() -> bool:
    import sys

    if "torch" not in sys.modules:
        return False
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_initialized())


def _job_meta(name: str, layouts: list[tuple[int, ...]], world_size: int, sync: ClockSync, cuda: bool,
              extra: dict[str, Any]) -> JobMeta:
    arr = np.array(layouts, dtype=np.int64).reshape(-1, 5)

    def size(col: int) -> int:
        v = arr[:, col]
        return int(v.max()) + 1 if (v >= 0).any() else 1

    return JobMeta(
        name=name,
        world_size=world_size,
        dp_size=size(1),
        pp_size=size(2),
        tp_size=size(3),
        cp_size=size(4),
        source="laggard-tracer",
        extra={
            **extra,
            "ranks": [dict(zip(("rank", "dp", "pp", "tp", "cp"), (int(x) for x in row), strict=True)) for row in arr],
            "timing": "cuda-events" if cuda else "perf_counter_ns",
            "clock": sync.to_json(),
            "created_unix_s": round(time.time(), 3),
        },
    )
