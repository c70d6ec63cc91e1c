"""The window analysis in a child process, so that ingest never waits on it for the interpreter.

A 1,024-worker window takes seconds of pure-Python replay; run in the collector's own process it
holds the GIL against the HTTP event loop and the ingest threads for as long (profiled under the
bench load: ~15% of the collector's samples, and ingest threads queued behind it). The collector's
analyzer thread hands each due window (its batches' bodies as received, ``window.WindowCut``) to a
pool of long-lived children (``MonitorConfig.analysis_workers``: several jobs analyzed at once) and
collects the ``laggard analyze --json`` documents and load ratios as they come back; a child builds
the window's table and runs exactly ``window.analyze_window`` and ``window.load_ratios``, the code
used in-process.

A window shares two thirds of its bodies with the job's window before it (6 steps every 3, cut from
3-step batches: a rank's 3 bodies, 2 of them read last time), and reading the bodies was ~40% of a
1,024-rank refresh. So a job goes back to the child that analyzed its last window when that child
is free (else to the least busy one), and a child keeps the record batches of its jobs' last windows
(up to ``MonitorConfig.analysis_cache_mib``, least recently analyzed job dropped first).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from laggard.monitor.window import WindowCut
from laggard.optable.ops import JobMeta

if TYPE_CHECKING:
    from laggard.analysis.config import AnalysisConfig

log = logging.getLogger("laggard.monitor")


@dataclass(kw_only=True, slots=True)
class WindowAnalysis:
    doc: dict[str, Any] | None
    error: str | None
    load_ratio: dict[int, float]
    refresh_s: float  # wall time of the analysis itself (in whichever process ran it)
    # each rank's span and own work in each step of the window (``monitor.steptimes.to_json``: what
    # `laggard top` shows of a collector's job)
    rank_steps: dict[str, Any] | None = None


# in an analysis process: job id -> the record batches of its last window's bodies (``read_bodies``'s
# cache), each body's bytes and their sum, least recently analyzed first
_PARTS: OrderedDict[str, tuple[dict[bytes, list[pa.RecordBatch]], dict[bytes, int], int]] = OrderedDict()


def _parts_cache(job_id: str | None, cache_bytes: int) -> dict[bytes, list[pa.RecordBatch]] | None:
    """The job's cache in this process (None without a job or a budget), made the most recent."""
    if job_id is None or cache_bytes <= 0:
        return None
    entry = _PARTS.pop(job_id, ({}, {}, 0))
    _PARTS[job_id] = entry
    return entry[0]


def _trim_parts(job_id: str | None, cache_bytes: int) -> None:
    """After the job's window was read into its cache: its bytes counted (a body's once, when it is
    new: ``RecordBatch.nbytes`` walks every buffer, ~5 ms a 1,024-rank window), and the least
    recently analyzed jobs' caches dropped while all of them hold more than ``cache_bytes`` (the
    job's own too, last, when it alone is over: a job cut in large batches has its bodies read every time)."""
    if job_id not in _PARTS:
        return
    cache, known, _ = _PARTS[job_id]
    sizes = {body: known[body] if body in known else sum(b.nbytes for b in batches) for body, batches in cache.items()}
    _PARTS[job_id] = (cache, sizes, sum(sizes.values()))
    total = sum(size for _, _, size in _PARTS.values())
    while _PARTS and total > cache_bytes:
        _, (_, _, size) = _PARTS.popitem(last=False)
        total -= size


def analyze(window: WindowCut | pa.Table, meta: JobMeta, config: AnalysisConfig | None = None,
            job_id: str | None = None, cache_bytes: int = 0) -> WindowAnalysis:
    """The window's analysis document (or why it failed) and its load ratios, in this process
    (``window``: its cut, built into the op table here, or the table; ``job_id``: whose, so that its
    bodies read last time are reused, the jobs' read bodies kept within ``cache_bytes``)."""
    from laggard.monitor.steptimes import rank_times
    from laggard.monitor.steptimes import to_json as steptimes_json
    from laggard.monitor.window import analyze_window, build_window, load_ratios

    t0 = time.perf_counter()
    table = window
    if isinstance(window, WindowCut):
        table = build_window(window, _parts_cache(job_id, cache_bytes))
        _trim_parts(job_id, cache_bytes)
    if table is None:
        return WindowAnalysis(doc=None, error="no ops in the window's steps", load_ratio={},
                              refresh_s=time.perf_counter() - t0)
    doc, err = analyze_window(table, meta, config)
    loads = load_ratios(table)
    times = rank_times(table)
    steps = None if times is None else steptimes_json(times)
    return WindowAnalysis(doc=doc, error=err, load_ratio=loads, refresh_s=time.perf_counter() - t0, rank_steps=steps)


# how often the analysis child checks that the collector is still there
PARENT_POLL_S = 1.0


def _child_init(nice: int, parent_pid: int) -> None:
    from laggard.startup import reuse_memory

    reuse_memory()  # an analysis process allocates like `laggard analyze` (laggard.startup)
    if nice:
        os.nice(nice)
    logging.getLogger("laggard").setLevel(logging.WARNING)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True,
                     name="laggard-parent-watch").start()


def _exit_with_parent(parent_pid: int) -> None:
    """A collector killed outright (SIGKILL, OOM) cannot shut its pool down, and the pool's worker
    waits on its queue for ever: exit once the parent is gone (the child is re-parented; the
    parent's pid comes from the parent: it may be gone before this child has started)."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(0)


class AnalysisPool:
    """Long-lived child processes (spawned: the collector has threads, so no fork) that analyze
    windows, ``workers`` at once: jobs are analyzed side by side, a job's windows one at a time
    (the collector submits a job's next window once its last one is back), each in the child that
    had the job's last window where that child is free (its bodies read then are kept there, up to
    ``cache_bytes`` a child)."""

    def __init__(self, workers: int = 1, nice: int = 0, cache_bytes: int = 0) -> None:
        self.workers, self.nice, self.cache_bytes = workers, nice, cache_bytes
        self._slots: list[ProcessPoolExecutor | None] = [None] * workers  # one child each
        self._pending = [0] * workers  # windows submitted to each and not yet back
        self._home: dict[str, int] = {}  # job -> the child that had its last window
        self._lock = threading.Lock()

    def _executor(self, i: int) -> ProcessPoolExecutor:
        """Child ``i``'s executor; a new one after it died (killed, out of memory: the old one's
        futures raise ``BrokenProcessPool``), once however many futures report the same death."""
        with self._lock:
            pool = self._slots[i]
            if pool is not None and getattr(pool, "_broken", False):
                log.warning("an analysis process died; starting a new one")
                pool.shutdown(wait=False, cancel_futures=True)
                pool = None
            if pool is None:
                pool = self._slots[i] = ProcessPoolExecutor(
                    max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_child_init,
                    initargs=(self.nice, os.getpid()))
            return pool

    def _slot(self, job_id: str | None) -> int:
        """The child for the job's window: its last one's while that child is free, else the one with
        the fewest windows waiting (the job's own on a tie)."""
        with self._lock:
            home = self._home.get(job_id) if job_id is not None else None
            i = min(range(self.workers), key=lambda k: (self._pending[k], k != home))
            if job_id is not None:
                self._home[job_id] = i
            self._pending[i] += 1
            return i

    def _done(self, i: int) -> None:
        with self._lock:
            self._pending[i] -= 1

    def pids(self) -> list[int]:
        """The children's pids once they run (the bench reads their peak memory)."""
        return sorted(p for pool in self._slots if pool is not None for p in (getattr(pool, "_processes", None) or {}))

    def submit(self, cut: WindowCut, meta: JobMeta, config: AnalysisConfig | None = None,
               job_id: str | None = None) -> Future:
        """The analysis of the window ``cut`` (its batches' bodies: the child builds the table) of
        ``job_id`` in a child; its future's result is a ``WindowAnalysis``."""
        i = self._slot(job_id)
        args = (analyze, cut, meta, config, job_id, self.cache_bytes)
        try:
            try:
                fut = self._executor(i).submit(*args)
            except BrokenProcessPool:  # the child died since the check
                fut = self._executor(i).submit(*args)
        except BaseException:
            self._done(i)
            raise
        fut.add_done_callback(lambda _, i=i: self._done(i))
        return fut

    def run(self, cut: WindowCut, meta: JobMeta, config: AnalysisConfig | None = None,
            job_id: str | None = None) -> WindowAnalysis:
        """``submit``'s result, waited for; a child that died is replaced and the window analyzed again once."""
        for attempt in (0, 1):
            fut = self.submit(cut, meta, config, job_id)
            try:
                return fut.result()
            except BrokenProcessPool:  # submitted again to a new child
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            slots, self._slots = self._slots, [None] * self.workers
        for pool in slots:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
