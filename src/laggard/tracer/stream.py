"""Streaming a rank's ops to a live-monitor collector (``Tracer(..., monitor_url=..., token=...)``).

The shard writer hands each page's op table to ``MonitorStream.submit`` (from its own thread: the
training thread never waits, and nothing here calls a collective). The table is numbered at once
with the rank's next batch sequence number and encoded (Arrow IPC, ``laggard.wire.batch``), so
a batch keeps its (rank, seq) identity through retries: the collector stores it once. A background
thread posts the batches in order; while the collector is unreachable they go to a spool directory
on disk (``<trace>/monitor-spool/``), retried with back-off, oldest first, and the queue in memory
stays bounded. A 4xx answer (a batch the collector refuses) drops that batch with one warning.
When the collector says the job's tracing is off, batches are dropped (counted) until it is on again.

Pages leave at step ends, so a rank whose main thread is blocked sends none. The same thread
therefore posts a **heartbeat** every ``StreamConfig.heartbeat_s`` (``POST /api/v1/jobs/{id}/heartbeat``:
the rank's step, ops recorded so far, the blocking communication its main thread is in and where
it is: ``laggard.tracer.flight.state``), from the tracer's start: the collector sees the job from
its first step and sees a rank stop while that rank is blocked. The answer carries the job's
``dump_request``: a new one (an operator's ``POST /api/v1/jobs/{id}/dump``, or a hang the collector
suspects) makes the thread send this rank's **hang report** (``POST /api/v1/jobs/{id}/flight``: its
Flight Recorder dump with the tracer's state, or the state alone when the recorder is off, as JSON
of at most ``max_report_bytes``: the oldest entries are dropped to fit), and the collector's verdict
comes back in later answers (``hang``), where ``on_verdict`` (the tracer's abort, opt-in) sees it.
A stream without a report function (used on its own) creates the Flight Recorder request file in
the trace directory instead, which ``laggard.tracer.flight`` turns into a dump.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laggard.errors import LaggardError, LaggardWarning
from laggard.optable.tracedir import FLIGHT_REQUEST_FILE, SPOOL_DIR

_MAX_QUEUE = 64  # batches in memory before new ones go straight to the spool (a page is <= 8192 ops)
_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)  # retry delays while the collector is down
_PAUSE_POLL_S = 5.0  # while tracing is off, ask the collector this often


@dataclass(kw_only=True, slots=True)
class StreamConfig:
    # heartbeat period: the collector calls a hang after its hang_after_s (30 s) without progress,
    # so 2 s adds little to the time to a verdict, and 1,000 ranks make 500 small requests a second
    heartbeat_s: float = 2.0
    # largest hang report sent: a 2,000-entry Flight Recorder buffer is ~1 MB of JSON; the
    # collector refuses reports over its max_report_bytes (16 MB too). Over it, the oldest entries go
    max_report_bytes: int = 16 * 2**20


class MonitorStream:
    def __init__(self, url: str, token: str | None, *, job_id: str, rank: int, meta: dict[str, Any],
                 spool_dir: Path, config: StreamConfig | None = None,
                 state_fn: Callable[[], dict[str, Any]] | None = None,
                 report_fn: Callable[[str], dict[str, Any]] | None = None,
                 on_verdict: Callable[[dict[str, Any]], None] | None = None) -> None:
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
        self.config = config or StreamConfig()
        self._state_fn, self._report_fn, self._on_verdict = state_fn, report_fn, on_verdict
        self._next_beat_s = 0.0  # the first heartbeat goes at once: the job appears at the collector
        self._meta_sent = False
        self.num_heartbeats = 0
        self.num_reports = 0
        self.reported: int | None = None  # the dump_request this rank last sent its report for
        self.verdict: dict[str, Any] | None = None  # the collector's last published hang verdict
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
        if self.num_heartbeats and not self._thread.is_alive():  # (the client is the thread's until it ends)
            self._beat_closed()  # a rank that closed its tracer is not a rank that stopped
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
            if time.monotonic() >= self._next_beat_s:
                self._heartbeat()
            try:
                item = self._q.get(timeout=max(0.01, min(1.0, self._next_beat_s - time.monotonic())))
            except queue.Empty:
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

    def _heartbeat(self) -> None:
        """Tell the collector where this rank is; act on its answer (tracing, dump request, verdict)."""
        from laggard.wire.client import CollectorDown

        self._next_beat_s = time.monotonic() + (_PAUSE_POLL_S if self.paused else self.config.heartbeat_s)
        beat: dict[str, Any] = {"rank": self.rank, "state": self._state_fn() if self._state_fn else {}}
        if not self._meta_sent:
            beat["meta"] = self.meta
        try:
            doc = self._client.request("POST", f"/api/v1/jobs/{self.job_id}/heartbeat",
                                       json.dumps(beat, default=str).encode())
        except (CollectorDown, LaggardError):
            self._meta_sent = False  # a collector that lost the job (restarted elsewhere) learns it again
            return
        self.num_heartbeats += 1
        self._meta_sent = True
        if not isinstance(doc, dict):
            return
        if doc.get("tracing"):
            self.paused = False
        self._dump_asked(doc.get("dump_request"))
        hang = doc.get("hang")
        if isinstance(hang, dict) and hang != self.verdict:
            if self._on_verdict is not None and hang.get("request") == self.reported:
                self._on_verdict(hang)  # may end the process (the tracer's abort)
            self.verdict = hang

    def hold_for_abort(self) -> None:
        """The main thread's collective failed. When this rank sent its hang report for the latest
        request (the job was hung) and may abort, the failure is most likely a peer that already
        aborted on the verdict this rank has not seen yet: give the stream thread two heartbeats to
        see it and end the process with the abort's exit code, before the error goes on."""
        if self._on_verdict is None or self.reported is None or self.reported != self.dump_request_seen:
            return
        deadline = time.monotonic() + 2 * self.config.heartbeat_s + 1.0
        while time.monotonic() < deadline and not self._stop.is_set():
            v = self.verdict
            if v is not None and v.get("request") == self.reported:
                return  # the verdict is in and did not end the process
            time.sleep(0.05)

    def _beat_closed(self) -> None:
        from laggard.wire.client import CollectorDown

        beat = {"rank": self.rank, "state": {"closed": True, "progress": -1}}
        try:
            self._client.request("POST", f"/api/v1/jobs/{self.job_id}/heartbeat", json.dumps(beat).encode())
        except (CollectorDown, LaggardError):
            pass

    def _dump_asked(self, req: Any) -> None:
        """A dump_request above the one first seen: send this rank's hang report (or ask for a dump file)."""
        if not isinstance(req, int):
            return
        new = self.dump_request_seen is not None and req > self.dump_request_seen
        self.dump_request_seen = req
        if not new:
            return
        self.num_dump_requests += 1
        if self._report_fn is None:
            try:
                (self.spool_dir.parent / FLIGHT_REQUEST_FILE).touch()
            except OSError:
                pass
            return
        self._send_report(req)

    def _send_report(self, req: int) -> None:
        from laggard.wire.client import CollectorDown

        assert self._report_fn is not None
        body = fit_report(self._report_fn(f"monitor request {req}"), self.config.max_report_bytes)
        if body is None:
            warnings.warn(f"laggard tracer (rank {self.rank}): the hang report does not fit in "
                          f"{self.config.max_report_bytes} bytes even without entries; not sent", LaggardWarning,
                          stacklevel=2)
            return
        try:
            self._client.request("POST", f"/api/v1/jobs/{self.job_id}/flight?request={req}", body)
        except (CollectorDown, LaggardError) as e:
            warnings.warn(f"laggard tracer (rank {self.rank}): the collector did not take the hang report ({e})",
                          LaggardWarning, stacklevel=2)
            return
        self.reported = req
        self.num_reports += 1


def fit_report(data: dict[str, Any], limit: int) -> bytes | None:
    """The report as JSON within ``limit`` bytes, dropping the oldest Flight Recorder entries (the
    newest say where the job stopped); None when even no entries do not fit."""
    entries = list(data.get("entries") or [])
    while True:
        body = json.dumps({**data, "entries": entries}, default=str).encode()
        if len(body) <= limit:
            return body
        if not entries:
            return None
        entries = entries[len(entries) // 2 + 1:] if len(entries) > 1 else []


def attach(tracer: Any, url: str, token: str | None, *, job_id: str, meta: dict[str, Any],
           config: StreamConfig | None = None, abort_on_hang: bool | None = None) -> MonitorStream:
    """Stream every page the tracer's shard writer builds, with heartbeats and hang reports (the tracer's hook)."""
    from laggard.tracer import abort, flight

    reported_at: dict[str, int] = {}

    def state() -> dict[str, Any]:
        st = flight.state(tracer, "heartbeat", rank=tracer.rank, world_size=tracer.world_size)
        st["where"].pop("stack", None)  # where the main thread is, without the frames (a report has them)
        return st

    def report(reason: str) -> dict[str, Any]:
        reported_at["progress"] = flight.progress(tracer)
        return flight.report(tracer, reason)

    def on_verdict(verdict: dict[str, Any]) -> None:
        # only a rank that has not recorded one op since its report (a job that moved on is left alone)
        if (abort.should_abort(verdict, opted_in=abort_on_hang)
                and flight.progress(tracer) == reported_at.get("progress")):
            abort.abort_hung(tracer, verdict)

    stream = MonitorStream(url, token, job_id=job_id, rank=tracer.rank, meta=meta,
                           spool_dir=Path(tracer.out_dir) / SPOOL_DIR, config=config, state_fn=state,
                           report_fn=report, on_verdict=on_verdict)
    tracer._writer.on_table = stream.submit  # noqa: SLF001 - the tracer's own hook
    return stream


def wait_sent(stream: MonitorStream, timeout_s: float) -> bool:
    """For tests and the demo: wait until nothing is queued or spooled."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stream._q.empty() and not stream._spool_files:
            return True
        time.sleep(0.05)
    return False
