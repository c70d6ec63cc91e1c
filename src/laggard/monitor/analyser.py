"""The window analysis in a child process, so that ingest never waits on it for the interpreter.

A 1,024-worker window takes seconds of pure-Python replay; run in the collector's own process it
holds the GIL against the HTTP event loop and the ingest threads for as long (profiled under the
bench load: ~15% of the collector's samples, and ingest threads queued behind it). The collector's
analyser thread hands each due window (its batches' bodies as received, ``window.WindowCut``) to a
pool of long-lived children (``MonitorConfig.analysis_workers``: several jobs analysed at once) and
collects the ``laggard analyze --json`` documents and load ratios as they come back; a child builds
the window's table and runs exactly ``window.analyse_window`` and ``window.load_ratios``, the code
used in-process.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
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


def analyse(window: WindowCut | pa.Table, meta: JobMeta, config: AnalysisConfig | None = None) -> WindowAnalysis:
    """The window's analysis document (or why it failed) and its load ratios, in this process
    (``window``: its cut, built into the op table here, or the table)."""
    from laggard.monitor.window import analyse_window, build_window, load_ratios

    t0 = time.perf_counter()
    table = build_window(window) if isinstance(window, WindowCut) else window
    if table is None:
        return WindowAnalysis(doc=None, error="no ops in the window's steps", load_ratio={},
                              refresh_s=time.perf_counter() - t0)
    doc, err = analyse_window(table, meta, config)
    loads = load_ratios(table)
    return WindowAnalysis(doc=doc, error=err, load_ratio=loads, refresh_s=time.perf_counter() - t0)


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
    """Long-lived child processes (spawned: the collector has threads, so no fork) that analyse
    windows, ``workers`` at once: jobs are analysed side by side, a job's windows one at a time
    (the collector submits a job's next window once its last one is back)."""

    def __init__(self, workers: int = 1, nice: int = 0) -> None:
        self.workers, self.nice = workers, nice
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> ProcessPoolExecutor:
        """The pool; a new one after a child died (killed, out of memory: the old pool's futures
        raise ``BrokenProcessPool``), once however many futures report the same death."""
        with self._lock:
            if self._pool is not None and getattr(self._pool, "_broken", False):
                log.warning("an analysis process died; starting new ones")
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_child_init, initargs=(self.nice, os.getpid()))
            return self._pool

    def pids(self) -> list[int]:
        """The children's pids once they run (the bench reads their peak memory)."""
        return sorted(getattr(self._pool, "_processes", None) or {})

    def submit(self, cut: WindowCut, meta: JobMeta, config: AnalysisConfig | None = None) -> Future:
        """The analysis of the window ``cut`` (its batches' bodies: the child builds the table) in a
        child; its future's result is a ``WindowAnalysis``."""
        try:
            return self._executor().submit(analyse, cut, meta, config)
        except BrokenProcessPool:  # a child died since the check
            return self._executor().submit(analyse, cut, meta, config)

    def run(self, cut: WindowCut, meta: JobMeta, config: AnalysisConfig | None = None) -> WindowAnalysis:
        """``submit``'s result, waited for; a child that died is replaced and the window analysed again once."""
        for attempt in (0, 1):
            fut = self.submit(cut, meta, config)
            try:
                return fut.result()
            except BrokenProcessPool:  # submitted again to new children
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
