"""Streaming a rank's ops to a live-monitor collector (``Tracer(..., monitor_url=..., token=...)``).

The shard writer hands each page's op table to ``MonitorStream.submit`` (from its own thread: the
training thread never waits, and nothing here calls a collective). The table is numbered at once
with the rank's next batch sequence number and encoded (Arrow IPC, ``laggard.wire.batch``), so
a batch keeps its (rank, seq) identity through retries: the collector stores it once. A background
thread posts the batches in order; while the collector is unreachable they go to a spool directory
on disk (``<trace>/monitor-spool/``), retried with back-off, oldest first, and the queue in memory
stays bounded. A 4xx answer (a batch the collector refuses) drops that batch with one warning.
When the collector says the job's tracing is off, batches are dropped (counted) until it is on again.
While nothing is sent for ``_IDLE_POLL_S`` (a hung job sends nothing) the thread asks the collector
for the job's state; a new ``dump_request`` (an operator's ``POST /api/v1/jobs/{id}/dump``, or a hang
the collector suspects) creates the Flight Recorder request file in the trace directory, which
``laggard.tracer.flight`` turns into a dump (``laggard hang`` reads them).
"""

from __future__ import annotations

import queue
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from laggard.errors import LaggardError, LaggardWarning
from laggard.optable.tracedir import FLIGHT_REQUEST_FILE, SPOOL_DIR

_MAX_QUEUE = 64  # batches in memory before new ones go straight to the spool (a page is <= 8192 ops)
_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)  # retry delays while the collector is down
_PAUSE_POLL_S = 5.0  # while tracing is off, ask the collector this often
# with nothing to send for this long, ask the collector whether it wants a dump (a hung job sends
# nothing: the collector flags it after its hang_after_s, so a few seconds more is soon enough)
_IDLE_POLL_S = 5.0


class MonitorStream:
    def __init__(self, url: str, token: str | None, *, job_id: str, rank: int, meta: dict[str, Any],
                 spool_dir: Path) -> None:
        from laggard.wire.batch import valid_job_id
        from laggard.wire.client import Client

        self.job_id = valid_job_id(job_id)
        self.rank = rank
        self.meta = meta
        self.spool_dir = spool_dir
        self._client = Client(url, token)
        self._q: queue.Queue[tuple[int, bytes] | None] = queue.Queue(maxsize=_MAX_QUEUE)
        self._seq = 0
        self._lock = threading.Lock()
        self.num_sent = 0  # batches the collector acknowledged (stored or already there)
        self.num_spooled = 0
        self.num_dropped = 0  # refused (4xx) or tracing off
        self.paused = False
        self._warned = False
        self._stop = threading.Event()
        self.dump_request_seen: int | None = None  # the collector's dump_request when first asked
        self.num_dump_requests = 0
        self._last_poll_s = time.monotonic()
        self._spool_files = sorted(self.spool_dir.glob(f"rank{rank}-*.arrows")) if self.spool_dir.is_dir() else []
        self._thread = threading.Thread(target=self._run, name=f"laggard-monitor-rank{rank}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the writer thread's side
    def submit(self, table: Any) -> None:
        """Number, encode and queue one page of ops; never blocks (a full queue spools to disk)."""
        from laggard.wire.batch import encode_batch

        if self.paused:
            self.num_dropped += 1
            return
        with self._lock:
            seq = self._seq
            self._seq += 1
        body = encode_batch(table, job_id=self.job_id, rank=self.rank, seq=seq, meta=self.meta)
        try:
            self._q.put_nowait((seq, body))
        except queue.Full:
            self._spool(seq, body)

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is queued (and spooled) for up to ``timeout_s``; the rest stays in the spool."""
        self._q.put(None)
        self._thread.join(timeout_s)
        self._stop.set()
        self._thread.join(1.0)
        while True:  # whatever the thread did not get to
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                self._spool(*item)
        self._client.close()
        if self._spool_files:
            warnings.warn(f"laggard tracer (rank {self.rank}): {len(self._spool_files)} op batch(es) for the monitor "
                          f"are left in {self.spool_dir} (the collector was unreachable)", LaggardWarning, stacklevel=2)

    # ------------------------------------------------------------------ the stream thread
    def _run(self) -> None:
        fails = 0
        closing = False
        while not self._stop.is_set():
            if self._spool_files:  # older batches first
                with self._lock:
                    path = self._spool_files[0]
                if self._send_file(path):
                    with self._lock:
                        self._spool_files.remove(path)
                    fails = 0
                    continue
                fails += 1
                if self._drain_to_spool():
                    closing = True
                if closing and fails > len(_BACKOFF_S):
                    return
                self._stop.wait(_BACKOFF_S[min(fails - 1, len(_BACKOFF_S) - 1)])
                continue
            if closing:
                return
            try:
                item = self._q.get(timeout=_PAUSE_POLL_S if self.paused else 1.0)
            except queue.Empty:
                if self.paused or time.monotonic() - self._last_poll_s >= _IDLE_POLL_S:
                    self._poll_job()
                continue
            if item is None:
                closing = True
                continue
            seq, body = item
            if not self._send(body):
                self._spool(seq, body)

    def _drain_to_spool(self) -> bool:
        """While down, move queued batches to disk (keeps memory bounded); True if close was asked."""
        closing = False
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                return closing
            if item is None:
                closing = True
            else:
                self._spool(*item)

    def _send(self, body: bytes) -> bool:
        """True when the collector answered (stored, duplicate, refused or paused); False when down."""
        from laggard.wire.client import CollectorDown

        try:
            ans = self._client.post_batch(body)
        except CollectorDown:
            return False
        except LaggardError as e:
            self.num_dropped += 1
            if not self._warned:
                self._warned = True
                warnings.warn(f"laggard tracer (rank {self.rank}): the monitor refused a batch: {e}", LaggardWarning,
                              stacklevel=2)
            return True
        if ans:
            self._dump_asked(ans.get("dump_request"))
        if ans and ans.get("tracing") is False:
            self.paused = True
            self.num_dropped += 1
        else:
            self.num_sent += 1
        return True

    def _send_file(self, path: Path) -> bool:
        try:
            body = path.read_bytes()
        except OSError:
            return True  # gone: nothing to send
        if not self._send(body):
            return False
        path.unlink(missing_ok=True)
        return True

    def _spool(self, seq: int, body: bytes) -> None:
        try:
            self.spool_dir.mkdir(parents=True, exist_ok=True)
            final = self.spool_dir / f"rank{self.rank}-{seq:010d}.arrows"
            tmp = final.with_suffix(".tmp")
            tmp.write_bytes(body)
            tmp.replace(final)
        except OSError:
            self.num_dropped += 1
            return
        self.num_spooled += 1
        with self._lock:
            self._spool_files.append(final)
            self._spool_files.sort()

    def _poll_job(self) -> None:
        """The job's state at the collector: tracing back on; a new dump request."""
        from laggard.wire.client import CollectorDown

        self._last_poll_s = time.monotonic()
        try:
            doc = self._client.request("GET", f"/api/v1/jobs/{self.job_id}")
        except (CollectorDown, LaggardError):
            return
        if not isinstance(doc, dict):
            return
        if doc.get("tracing"):
            self.paused = False
        self._dump_asked(doc.get("dump_request"))

    def _dump_asked(self, req: Any) -> None:
        """A dump_request above the one first seen: ask the Flight Recorder dumper for a dump."""
        if not isinstance(req, int):
            return
        new = self.dump_request_seen is not None and req > self.dump_request_seen
        self.dump_request_seen = req
        if not new:
            return
        self.num_dump_requests += 1
        try:
            (self.spool_dir.parent / FLIGHT_REQUEST_FILE).touch()
        except OSError:
            pass


def attach(writer: Any, url: str, token: str | None, *, job_id: str, rank: int, meta: dict[str, Any],
           trace_dir: Path) -> MonitorStream:
    """Stream every page the shard writer builds (the tracer's hook)."""
    stream = MonitorStream(url, token, job_id=job_id, rank=rank, meta=meta, spool_dir=trace_dir / SPOOL_DIR)
    writer.on_table = stream.submit
    return stream


def wait_sent(stream: MonitorStream, timeout_s: float) -> bool:
    """For tests and the demo: wait until nothing is queued or spooled."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stream._q.empty() and not stream._spool_files:
            return True
        time.sleep(0.05)
    return False
