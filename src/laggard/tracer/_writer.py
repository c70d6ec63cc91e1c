"""The background shard writer: full pages in, Parquet shards and a per-rank state file out.

Shards are written to a temporary name and renamed, so a crash never leaves a torn shard. After
every shard the rank's ``rank{R}.state.json`` heartbeat records how many ops were recorded, written
and dropped and the last step written; ``laggard.optable.tracedir.check_trace`` reads it to report a
rank that died (and the tail it lost). An I/O error (full disk, directory gone) disables the writer
with one warning; the training goes on.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from laggard.errors import LaggardWarning
from laggard.optable.ops import OP_SCHEMA
from laggard.optable.tracedir import shard_name, state_name
from laggard.tracer._page import Chain, FullPage, last_step, page_table

# Parquet dictionary encoding for the dictionary columns only (name, kind, stream, group): pyarrow's
# default tries it on every column, hashing each int64 column of each page (op ids, times: all distinct)
# before falling back; without that a page is written in 0.75x the time, and the file is 0.65x the size
_DICT_COLUMNS = [f.name for f in OP_SCHEMA if pa.types.is_dictionary(f.type)]


def state_path(out_dir: Path, rank: int) -> Path:
    return out_dir / state_name(rank)


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}-{threading.get_ident()}")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


class ShardWriter:
    """One daemon thread per tracer; ``submit`` never blocks the caller."""

    def __init__(self, out_dir: Path, *, rank: int, layout: tuple[int, int, int, int], offset_ns: int,
                 on_page_free: Callable[[Any], None], state: dict[str, Any]) -> None:
        self.out_dir = out_dir
        self.rank = rank
        self.layout = layout
        self.offset_ns = offset_ns
        self._on_page_free = on_page_free
        self._queue: queue.SimpleQueue[FullPage | None] = queue.SimpleQueue()
        self._chain = Chain()
        self.num_shards = 0
        self.num_written = 0
        self.last_step_written: int | None = None
        self.failed: str | None = None
        self.on_table: Callable[[Any], None] | None = None  # also hand each page's op table here (live monitor)
        self.state = state  # shared with the tracer (counts it updates); written after each shard
        self._lock = threading.Lock()  # one writer of files at a time (thread vs. emergency flush)
        self._thread = threading.Thread(target=self._run, name=f"laggard-writer-rank{rank}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ called by the tracer
    def submit(self, page: FullPage) -> None:
        self._queue.put(page)

    def close(self, timeout_s: float = 60.0) -> bool:
        """Write everything submitted, stop the thread; False if it did not finish in time."""
        self._queue.put(None)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def write_state(self, status: str, **more: Any) -> None:
        if self.failed is not None:
            return
        self.state.update(status=status, num_ops_written=self.num_written, num_shards=self.num_shards,
                          last_step_written=self.last_step_written, updated_unix_s=round(time.time(), 3), **more)
        try:
            write_json_atomic(state_path(self.out_dir, self.rank), self.state)
        except OSError as e:
            self._fail(e)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while True:
            page = self._queue.get()
            if page is None:
                return
            try:
                self.write_page(page)
            finally:
                self._on_page_free(page.buffer)
                if page.sync is not None:
                    page.sync.set()

    def write_page(self, page: FullPage) -> None:
        if self.failed is not None or len(page.records) == 0:
            return
        import pyarrow.parquet as pq

        with self._lock:
            try:
                table = page_table(page, rank=self.rank, layout=self.layout, offset_ns=self.offset_ns,
                                   chain=self._chain)
                if self.on_table is not None:
                    self.on_table(table)
                final = self.out_dir / shard_name(self.rank, self.num_shards)
                tmp = final.with_name(final.name + ".tmp")
                pq.write_table(table, tmp, compression="zstd", use_dictionary=_DICT_COLUMNS)
                os.replace(tmp, final)
            except OSError as e:
                self._fail(e)
                return
            self.num_shards += 1
            self.num_written += len(page.records)
            self.last_step_written = last_step(page)
            self.write_state("running")

    def _fail(self, e: OSError) -> None:
        if self.failed is None:
            self.failed = f"{e.strerror or e}"
            warnings.warn(
                f"laggard tracer (rank {self.rank}, {socket.gethostname()}): cannot write the trace to "
                f"{self.out_dir} ({self.failed}); tracing is disabled, training goes on",
                LaggardWarning,
                stacklevel=2,
            )
