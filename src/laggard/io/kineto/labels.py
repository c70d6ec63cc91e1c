"""What the categories and names of one rank's Kineto events say, as lookup tables over their
labels (one entry per category or name, so an event's is one gather): GPU, CPU or runtime work, GPU
step annotations, the ``ProfilerStep#N`` number, and the names of collectives, their calls and the
wrappers around real ops."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from laggard.io.kineto.comm import NCCL_KERNEL
from laggard.io.kineto.events import RankEvents
from laggard.io.kineto.hostops import is_loader

_GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
_CPU_CATS = frozenset({"cpu_op", "operator", "user_annotation", "cuda_runtime", "runtime", "cuda_driver", "overhead"})
_RUNTIME_CATS = frozenset({"cuda_runtime", "runtime", "cuda_driver"})
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass(kw_only=True, slots=True)
class Labels:
    """Per-label lookup tables (one entry per category / name, plus a trailing 'none')."""

    cat_gpu: np.ndarray
    cat_cpu: np.ndarray
    cat_rt: np.ndarray
    cat_gpu_ann: np.ndarray
    step_of_name: np.ndarray  # N of ProfilerStep#N, -1
    is_name: dict[str, np.ndarray]  # nccl_kernel, gloo, nccl_cpu, rpc, c10d_p2p, loader, wrapper


def labels(ev: RankEvents) -> Labels:
    """The lookup tables of the rank's categories and names."""
    cats_l = [c.lower() for c in ev.cats] + [""]
    names = ev.names

    def by_name(pred: Any) -> np.ndarray:
        return np.array([bool(pred(s)) for s in names] + [False], dtype=bool)

    return Labels(
        cat_gpu=np.array([c in _GPU_CATS for c in cats_l], dtype=bool),
        cat_cpu=np.array([c in _CPU_CATS for c in cats_l], dtype=bool),
        cat_rt=np.array([c in _RUNTIME_CATS for c in cats_l], dtype=bool),
        cat_gpu_ann=np.array([c == "gpu_user_annotation" for c in cats_l], dtype=bool),
        step_of_name=np.array([int(m.group(1)) if (m := _STEP.match(s)) else -1 for s in names] + [-1], dtype=np.int64),
        is_name={
            "nccl_kernel": by_name(NCCL_KERNEL.match),
            "gloo": by_name(lambda s: s.startswith("gloo:")),
            "nccl_cpu": by_name(lambda s: s.startswith("nccl:")),
            "rpc": by_name(lambda s: s == "record_param_comms"),
            "c10d_p2p": by_name(lambda s: s.startswith(("c10d::send", "c10d::recv"))),
            # a DataLoader's next batch (``laggard.io.kineto.hostops``)
            "loader": by_name(is_loader),
            # events that are neither work nor a collective on a thread (they wrap the real ops)
            "wrapper": by_name(lambda s: bool(_STEP.match(s))
                               or s.startswith(("PyTorch Profiler", "c10d::", "nccl:", "gloo:"))
                               or s == "record_param_comms"),
        },
    )
