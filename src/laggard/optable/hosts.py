"""Which machine each rank ran on: the job metadata's ``hosts`` list, one definition for every
source (the Tracer's job.json, the profiler importer, the fleet's rows).

``JobMeta.extra["hosts"]`` is a list, sorted by rank, of ``{"rank": R, "host": NAME, "gpu_uuid":
..., "pci_bus_id": ..., "gpu_name": ...}``; every key but ``rank`` is optional (a CPU job has no
GPU; an older profiler trace has no host name). A rank missing from the list is unknown.
"""

from __future__ import annotations

from typing import Any

HOSTS_KEY = "hosts"
FIELDS = ("host", "gpu_uuid", "pci_bus_id", "gpu_name")


def host_entry(rank: int, **ids: Any) -> dict[str, Any] | None:
    """One rank's entry: the identity fields given as non-empty strings; None when there are none."""
    out: dict[str, Any] = {"rank": int(rank)}
    for k in FIELDS:
        v = ids.get(k)
        if v is not None and str(v).strip():
            out[k] = str(v).strip()
    return out if len(out) > 1 else None


def hosts_of(extra: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``hosts`` list of a job's metadata extras, checked and sorted by rank (bad entries are
    left out: metadata written by hand or by another version must not stop an analysis)."""
    raw = extra.get(HOSTS_KEY)
    if not isinstance(raw, list):
        return []
    out = []
    for e in raw:
        if isinstance(e, dict) and isinstance(e.get("rank"), int) and not isinstance(e.get("rank"), bool):
            entry = host_entry(e["rank"], **{k: e.get(k) for k in FIELDS})
            if entry is not None:
                out.append(entry)
    return sorted(out, key=lambda e: e["rank"])


def host_of_rank(extra: dict[str, Any]) -> dict[int, str]:
    """rank -> host name (the GPU's UUID where the trace names no host: one GPU is one place)."""
    out = {}
    for e in hosts_of(extra):
        name = e.get("host") or e.get("gpu_uuid")
        if name:
            out[e["rank"]] = name
    return out


GPU_FIELDS = ("gpu_uuid", "pci_bus_id", "gpu_name")


def cpu_job(extra: dict[str, Any]) -> bool:
    """Whether the job ran without GPUs, as far as its metadata says: timed on the host's clock
    (``timing`` perf_counter_ns) and every rank's entry known and naming no GPU (the Tracer writes a
    rank's GPU wherever CUDA is available to it). Unknown is False: an imported trace with no
    ``hosts`` list is taken to be the GPU job it most likely is."""
    hosts = hosts_of(extra)
    ranks = extra.get("ranks")
    every = isinstance(ranks, list) and len(hosts) >= len(ranks) > 0
    return (extra.get("timing") == "perf_counter_ns" and every
            and not any(k in e for e in hosts for k in GPU_FIELDS))


__all__ = ["FIELDS", "GPU_FIELDS", "HOSTS_KEY", "cpu_job", "host_entry", "host_of_rank", "hosts_of"]
