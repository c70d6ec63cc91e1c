"""Small jobs go to the engine in batches of at least ``batch_target_s`` of work.

A job's cost is estimated from its size on disk at the rate measured on the jobs done so far
(seconds per byte); until the first results are back every batch holds one job (the first rows
arrive soon, and they calibrate the rate). The batcher is pulled lazily by the engine, one batch
per free slot, so the estimate improves as the run goes on and nothing is queued far ahead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from laggard.fleet.config import FleetConfig
from laggard.fleet.discover import JobSpec
from laggard.fleet.task import JobResult


class Batcher:
    def __init__(self, specs: Iterable[JobSpec], cfg: FleetConfig) -> None:
        self._specs = iter(specs)
        self._cfg = cfg
        self._wall_s = 0.0
        self._bytes = 0
        self._jobs = 0
        self._held: JobSpec | None = None

    def observe(self, results: list[JobResult]) -> None:
        for r in results:
            self._wall_s += float(r.row.get("wall_s") or 0.0)
            self._bytes += int(r.row.get("size_bytes") or 0)
            self._jobs += 1

    def estimate_s(self, spec: JobSpec) -> float | None:
        """Expected seconds to analyze ``spec``; None before any job has finished."""
        if self._jobs == 0:
            return None
        if self._bytes > 0 and spec.size_bytes > 0:
            return self._wall_s / self._bytes * spec.size_bytes
        return self._wall_s / self._jobs

    def __iter__(self) -> Iterator[list[JobSpec]]:
        return self

    def __next__(self) -> list[JobSpec]:
        batch: list[JobSpec] = []
        total_s = 0.0
        while len(batch) < self._cfg.max_batch_jobs:
            spec = self._held if self._held is not None else next(self._specs, None)
            self._held = None
            if spec is None:
                break
            batch.append(spec)
            est = self.estimate_s(spec)
            if est is None:
                break
            total_s += est
            if total_s >= self._cfg.batch_target_s:
                break
        if not batch:
            raise StopIteration
        return batch
