"""Engines run batches of jobs and hand back their results as they finish.

* ``local`` (default): a process pool on this machine (forkserver: workers start from a clean
  process with the analysis stack imported once, not from a copy of a parent with threads).
* ``ray``: one Ray task per batch, on a local Ray (started here) or a cluster (``--ray-address``);
  each task reads its jobs where it runs. On a cluster the workers import laggard from the copy of
  this package that Ray ships with the job (``runtime_env`` ``py_modules``); its dependencies
  (numpy, pyarrow, PyYAML, orjson, fsspec) must be installed on the nodes. ``ship_code=False``
  (``--no-ray-ship-code``) when the nodes' image has laggard installed. Needs
  ``pip install 'laggard[ray]'``; nothing else does.
* ``inline`` (``--workers 0``): in this process, one batch at a time (debugging, tiny fleets).

On this machine (``local``, ``inline``) the process that analyses a batch also writes its JSON
documents and rows (``writer.analyze_and_write``); a Ray task sends them back to the driver.
``map`` pulls batches lazily (a bounded number in flight), so memory does not grow with the fleet.
A batch whose worker dies (out of memory, a crash in native code) is retried one job at a time;
a job that kills its worker again becomes an error row.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from typing import Any, Protocol

from laggard.errors import LaggardError
from laggard.fleet.config import FleetConfig
from laggard.fleet.discover import JobSpec
from laggard.fleet.rows import error_row
from laggard.fleet.task import JobResult, run_batch
from laggard.fleet.writer import analyze_and_write

ENGINES = ("local", "ray")
# imported once in the fork server, so that no worker pays for them on its first job
PRELOAD = ("laggard.fleet.task", "laggard.fleet.writer", "laggard.startup", "laggard.io", "laggard.io.native",
           "laggard.io.ndtimeline.load", "laggard.whatif.core", "laggard.diagnose", "laggard.engine.arrivals",
           "laggard.report.html", "laggard.report.jsonout")
DIED = "the worker process died analyzing this job (out of memory, or a crash in native code)"


class Engine(Protocol):
    workers: int

    def map(self, batches: Iterator[list[JobSpec]], cfg: FleetConfig, out_dir: str) -> Iterator[list[JobResult]]:
        """Results of each batch as it finishes; ``written`` ones are already in ``out_dir``."""
        ...

    def close(self) -> None: ...


def _died(batch: list[JobSpec], why: str = DIED) -> list[JobResult]:
    return [JobResult(row=error_row(s.job, s.fmt, s.size_bytes, why, 0.0), doc=None) for s in batch]


class InlineEngine:
    workers = 1

    def map(self, batches: Iterator[list[JobSpec]], cfg: FleetConfig, out_dir: str) -> Iterator[list[JobResult]]:
        for b in batches:
            yield analyze_and_write(b, cfg, out_dir)

    def close(self) -> None:
        pass


class _Feeder:
    """Batches to submit: retries (one job each) first, then new ones from the batcher."""

    def __init__(self, batches: Iterator[list[JobSpec]]) -> None:
        self.batches = batches
        self.retries: deque[list[JobSpec]] = deque()
        self.exhausted = False

    def next(self) -> tuple[list[JobSpec], bool] | None:
        if self.retries:
            return self.retries.popleft(), True
        if self.exhausted:
            return None
        b = next(self.batches, None)
        if b is None:
            self.exhausted = True
            return None
        return b, False

    def failed(self, batch: list[JobSpec], retried: bool) -> list[JobResult]:
        """A batch whose worker died: retry its jobs one by one, or give up on a lone retried job."""
        if retried:
            return _died(batch)
        self.retries.extend([s] for s in batch)
        return []


class LocalEngine:
    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self._pool: Any = None

    def _new_pool(self) -> Any:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        from laggard.startup import hide_pandas

        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))
        return ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx, initializer=hide_pandas)

    def map(self, batches: Iterator[list[JobSpec]], cfg: FleetConfig, out_dir: str) -> Iterator[list[JobResult]]:
        from concurrent.futures import FIRST_COMPLETED, wait
        from concurrent.futures.process import BrokenProcessPool

        feeder = _Feeder(batches)
        limit = self.workers * cfg.inflight_per_worker
        inflight: dict[Any, tuple[list[JobSpec], bool]] = {}
        self._pool = self._pool or self._new_pool()
        while True:
            while len(inflight) < limit and (item := feeder.next()) is not None:
                inflight[self._pool.submit(analyze_and_write, item[0], cfg, out_dir)] = item
            if not inflight:
                return
            done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
            broken = False
            for fut in done:
                batch, retried = inflight.pop(fut)
                try:
                    yield fut.result()
                except BrokenProcessPool:
                    broken = True
                    if out := feeder.failed(batch, retried):
                        yield out
            if broken:  # every batch still in flight went down with the pool
                for fut, (batch, retried) in list(inflight.items()):
                    fut.cancel()
                    if out := feeder.failed(batch, retried):
                        yield out
                inflight.clear()
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = self._new_pool()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def ray_runtime_env(address: str | None, ship_code: bool) -> dict[str, Any] | None:
    """The ``runtime_env`` that lets the workers import laggard: none on a Ray started here (its
    workers run on this machine, with this environment), this package as ``py_modules`` on a cluster."""
    if address is None or not ship_code:
        return None
    # the laggard package directory (this file is laggard/fleet/engines.py)
    return {"py_modules": [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]}


class RayEngine:
    def __init__(self, workers: int, address: str | None, *, ship_code: bool = True) -> None:
        try:
            import ray
        except ModuleNotFoundError:
            raise LaggardError("--engine ray needs Ray: pip install 'laggard[ray]'") from None
        self._ray = ray
        self._owned = False
        if not ray.is_initialized():
            import logging

            kw: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
            if address is None:
                kw["include_dashboard"] = False
                if workers > 0:
                    kw["num_cpus"] = workers
            if (env := ray_runtime_env(address, ship_code)) is not None:
                kw["runtime_env"] = env
            try:
                ray.init(address=address, **kw)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise LaggardError(ray_failure(address, str(e))) from None
            self._owned = True
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = workers if workers > 0 else max(1, cpus)
        # a task that dies with its worker is not retried by Ray: the engine retries job by job
        self._task = ray.remote(max_retries=0)(run_batch)

    def map(self, batches: Iterator[list[JobSpec]], cfg: FleetConfig, out_dir: str) -> Iterator[list[JobResult]]:
        ray = self._ray
        feeder = _Feeder(batches)
        limit = self.workers * cfg.inflight_per_worker
        cfg_ref = ray.put(cfg)
        inflight: dict[Any, tuple[list[JobSpec], bool]] = {}
        while True:
            while len(inflight) < limit and (item := feeder.next()) is not None:
                inflight[self._task.remote(item[0], cfg_ref)] = item
            if not inflight:
                return
            ready, _ = ray.wait(list(inflight), num_returns=1)
            for ref in ready:
                batch, retried = inflight.pop(ref)
                try:
                    yield ray.get(ref)
                except (ray.exceptions.WorkerCrashedError, ray.exceptions.RayTaskError,
                        ray.exceptions.ObjectLostError):
                    if out := feeder.failed(batch, retried):
                        yield out

    def close(self) -> None:
        if self._owned:
            self._ray.shutdown()


# More worker processes than this is a typo, not a machine: each holds a job's op table (the
# largest machines have a few hundred cores; multiprocessing cannot even count past 2**31).
MAX_WORKERS = 4096


def make_engine(name: str, *, workers: int | None, ray_address: str | None, ray_ship_code: bool = True) -> Engine:
    if name not in ENGINES:
        raise LaggardError(f"--engine {name!r}: choose from {', '.join(ENGINES)}")
    if workers is not None and not 0 <= workers <= MAX_WORKERS:
        raise LaggardError(f"--workers must be in 0..{MAX_WORKERS} (got {workers})")
    if ray_address is not None and name != "ray":
        raise LaggardError("--ray-address is for --engine ray")
    if name == "ray":
        return RayEngine(workers or 0, ray_address, ship_code=ray_ship_code)
    if workers == 0:
        return InlineEngine()
    return LocalEngine(workers or os.cpu_count() or 1)


def ray_failure(address: str | None, message: str) -> str:
    """The one line for a Ray that would not start or answer: Ray's own first line, whose advice names
    Ray's flags (``--address``), with laggard's flag for the same thing beside it."""
    first = message.splitlines()[0] if message else "no reason given"
    hint = " (laggard's flag for the cluster's address is --ray-address)" if "--address" in first else ""
    return f"cannot start or reach Ray{f' at {address}' if address else ''}: {first}{hint}"
