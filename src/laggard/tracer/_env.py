"""What the tracer learns about its environment: torch.distributed, CUDA, the job's layout."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from laggard.optable.ops import JobMeta
from laggard.optable.tracedir import JOB_FILE, STATE_GLOB, rank_of, shard_glob, state_name
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


def check_args(*, record_every: Any, page_ops: int, num_pages: int, align: str | None, timing: str) -> None:
    """The Tracer's arguments, checked before any collective call."""
    from laggard.optable.ops import LaggardError
    from laggard.tracer.clock import METHODS

    if not isinstance(record_every, int) or record_every < 1:
        raise LaggardError(f"Tracer: record_every must be a positive integer, not {record_every!r}")
    if page_ops < 16 or num_pages < 2:
        raise LaggardError("Tracer: page_ops must be >= 16 and num_pages >= 2")
    if align is not None and align not in METHODS:
        raise LaggardError(f"Tracer: align must be one of {', '.join(METHODS)} or None, not {align!r}")
    if timing not in ("auto", "cpu", "cuda"):
        raise LaggardError(f"Tracer: timing must be auto, cpu or cuda, not {timing!r}")


def prepare_dir(out_dir: Path, rank: int, world_size: int, state: dict[str, Any], meta: dict[str, Any]) -> None:
    """The trace directory for this rank: created, this rank's old shards gone, its state written;
    rank 0 also removes a previous, larger job's ranks and writes ``job.json``. Raises OSError."""
    from laggard.tracer._writer import write_json_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob(shard_glob(rank)):
        old.unlink()
    write_json_atomic(out_dir / state_name(rank), state)
    if rank == 0:
        for old in [*out_dir.glob(shard_glob()), *out_dir.glob(STATE_GLOB)]:
            r = rank_of(old.name)
            if r is not None and r >= world_size:  # a previous, larger job's ranks
                old.unlink()
        write_json_atomic(out_dir / JOB_FILE, meta)
