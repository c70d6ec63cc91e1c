"""What the tracer learns about its environment: torch.distributed, CUDA, the job's layout."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import numpy as np

from laggard.optable.hosts import HOSTS_KEY, host_entry
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


def host_identity() -> dict[str, str]:
    """Where this process runs: the host name and, with CUDA in use, its GPU's UUID (as nvidia-smi
    prints it, ``GPU-...``), PCI bus id (``DDDDDDDD:BB:DD.0``) and name, each where torch has it."""
    ids = {"host": socket.gethostname()}
    if _cuda_in_use():
        ids.update(gpu_identity())
    return ids


def gpu_identity() -> dict[str, str]:
    """The current CUDA device's identity from ``torch.cuda.get_device_properties``: ``uuid`` and
    ``pci_bus_id``/``pci_domain_id``/``pci_device_id`` exist only in newer torch builds (and not on
    every platform): whatever is missing is left out."""
    import torch

    try:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
    except (RuntimeError, AssertionError, AttributeError):  # no device after all, or a build without CUDA
        return {}
    out: dict[str, str] = {}
    name = getattr(props, "name", None)
    if name:
        out["gpu_name"] = str(name)
    uuid = getattr(props, "uuid", None)
    if uuid is not None and str(uuid):
        u = str(uuid)
        out["gpu_uuid"] = u if u.startswith("GPU-") else f"GPU-{u}"
    bus = getattr(props, "pci_bus_id", None)
    if isinstance(bus, int):
        domain = getattr(props, "pci_domain_id", 0)
        device = getattr(props, "pci_device_id", 0)
        out["pci_bus_id"] = (f"{domain if isinstance(domain, int) else 0:08X}:{bus:02X}:"
                             f"{device if isinstance(device, int) else 0:02X}.0")
    return out


def _job_meta(name: str, layouts: list[tuple[Any, ...]], world_size: int, sync: ClockSync, cuda: bool,
              extra: dict[str, Any]) -> JobMeta:
    """``layouts``: per rank ``(rank, dp, pp, tp, cp[, identity])``, identity from :func:`host_identity`."""
    arr = np.array([row[:5] for row in layouts], dtype=np.int64).reshape(-1, 5)
    hosts = [e for row in layouts if len(row) > 5 and isinstance(row[5], dict)
             for e in [host_entry(int(row[0]), **row[5])] if e is not None]

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
            **({HOSTS_KEY: hosts} if hosts else {}),
        },
    )


def check_args(*, record_every: Any, page_ops: int, num_pages: int, align: str | None, timing: str) -> None:
    """The Tracer's arguments, checked before any collective call."""
    from laggard.errors import LaggardError
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
