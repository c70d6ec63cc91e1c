"""The window analysis in a child process, so that ingest never waits on it for the interpreter.

A 1,024-worker window takes seconds of pure-Python replay; run in the collector's own process it
holds the GIL against the HTTP event loop and the ingest threads for as long (profiled under the
bench load: ~15% of the collector's samples, and ingest threads queued behind it). The collector's
analyser thread hands the window's op table (Arrow IPC bytes) to one long-lived child and waits
(without the GIL) for the ``laggard analyze --json`` document and the load ratios; the child runs
exactly ``window.analyse_window`` and ``window.load_ratios``, the code used in-process.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

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


def analyse(table: pa.Table, meta: JobMeta, config: AnalysisConfig | None = None) -> WindowAnalysis:
    """The window's analysis document (or why it failed) and its load ratios, in this process."""
    from laggard.monitor.window import analyse_window, load_ratios

    t0 = time.perf_counter()
    doc, err = analyse_window(table, meta, config)
    loads = load_ratios(table)
    return WindowAnalysis(doc=doc, error=err, load_ratio=loads, refresh_s=time.perf_counter() - t0)


def _to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _child_analyse(body: bytes, meta: JobMeta, config: AnalysisConfig | None) -> WindowAnalysis:
    table = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
    return analyse(table, meta, config)


# how often the analysis child checks that the collector is still there
PARENT_POLL_S = 1.0


def _child_init(nice: int, parent_pid: int) -> None:
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


class AnalysisProcess:
    """One child process (spawned: the collector has threads, so no fork) that analyses windows."""

    def __init__(self, nice: int = 0) -> None:
        self.nice = nice
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_child_init, initargs=(self.nice, os.getpid()))
        return self._pool

    def pid(self) -> int | None:
        """The child's pid once it runs (the bench reads its peak memory)."""
        procs = getattr(self._pool, "_processes", None) or {}
        return next(iter(procs), None)

    def run(self, table: pa.Table, meta: JobMeta, config: AnalysisConfig | None = None) -> WindowAnalysis:
        """The child's analysis of ``table``; a child that died (killed, out of memory) is replaced
        and the window analysed again once."""
        body = _to_ipc(table)
        for attempt in (0, 1):
            try:
                return self._executor().submit(_child_analyse, body, meta, config).result()
            except BrokenProcessPool:
                log.warning("the analysis process died; starting a new one")
                self._pool = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
