"""The collector: ingest into the store and the in-memory windows, background analysis, alerts, metrics.

HTTP-free (``laggard.monitor.app`` is the HTTP layer over it), so the bench and the detection tests
drive the same code in-process.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import Any

from laggard.monitor.alerts import (
    Alert,
    Notifier,
    Rule,
    RuleState,
    default_rules,
)
from laggard.monitor.analyzer import AnalysisPool
from laggard.monitor.cluster import Cluster
from laggard.monitor.config import MonitorConfig
from laggard.monitor.controls import JobControls
from laggard.monitor.handover import Handover
from laggard.monitor.hangwatch import HangWatch
from laggard.monitor.metrics import Metrics
from laggard.monitor.rebuild import Rebuild
from laggard.monitor.scheduler import Scheduler
from laggard.monitor.store import BatchRow, Store
from laggard.monitor.window import JobWindow, WindowCut
from laggard.wire.batch import Batch, PackSlice, decode_batch, decode_batches

log = logging.getLogger("laggard.monitor")


def _row(b: Batch, held: bytes | PackSlice, via: str) -> BatchRow:
    """The store's row of a checked batch (stored by collector ``via``): its body, or its pack's body
    and its rows there."""
    if isinstance(held, PackSlice):
        return BatchRow(job_id=b.job_id, rank=b.rank, seq=b.seq, min_step=b.min_step, max_step=b.max_step,
                        num_ops=held.num_rows, body=b"", pack=held.body, row0=held.row0, via=via)
    return BatchRow(job_id=b.job_id, rank=b.rank, seq=b.seq, min_step=b.min_step, max_step=b.max_step,
                    num_ops=b.table.num_rows, body=held, via=via)


class Collector(Scheduler, Rebuild, Handover, HangWatch, JobControls):
    """The collector: ingest here; when windows are analyzed in ``Scheduler``; its start-up and leases
    in ``Rebuild``; what it keeps for a job's next holder in ``Handover``; hangs in ``HangWatch``;
    control and views in ``JobControls``."""

    def __init__(self, store: Store, cfg: MonitorConfig | None = None, webhooks: list[str] | None = None,
                 identity: tuple[str, str] | None = None) -> None:
        """``identity``: (this collector's id among those of its database, its address); a restarted
        collector with the same id takes its jobs back at once. Default: a new id (in-process use)."""
        self.store = store
        self.cfg = cfg or MonitorConfig()
        if identity is None:
            import os
            import secrets

            identity = (f"{os.uname().nodename}:{os.getpid()}:{secrets.token_hex(3)}", "")
        # which collector of the database analyses each job (laggard.monitor.cluster)
        self.cluster = Cluster(store, self.cfg.lease, identity[0], identity[1],
                               {"window_steps": self.cfg.window_steps, "hang_after_s": self.cfg.hang_after_s,
                                "hang_collect_s": self.cfg.hang_collect_s})
        self.cluster.join()
        self.metrics = Metrics(self.cfg.metrics_top_k)
        self.notifier = Notifier(webhooks or [])
        self.windows: dict[str, JobWindow] = {}
        self._lock = threading.RLock()  # guards windows (ingest threads vs. the analyzer)
        stored = store.rules()
        self.rules: list[Rule] = [Rule.from_json(r) for r in stored] if stored is not None else default_rules()
        self.rule_state = RuleState()
        self._kept: dict[tuple[str, str], Any] = {}  # (job, part) -> what is kept of it in the database (Handover)
        self.alerts: list[Alert] = []
        self._next_refresh: dict[str, float] = {}  # job -> earliest next analysis (analysis_share)
        self._hung_since: dict[str, float] = {}  # job -> when its standing hang verdict was decided
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._analyzer: AnalysisPool | None = None  # the child processes analyzing windows (start())
        self._running: dict[str, tuple[Future, WindowCut, int]] = {}  # job -> its window in a child, attempt
        # the analyzer thread is woken at once (not at its next tick) by batches that complete steps
        # and by finished analyses: the jobs they touched, to look at for a due window (``_analyzer_loop``)
        self._wake = threading.Event()
        self._woken_through: dict[str, int] = {}  # job -> its complete steps when batches last woke it
        self._touched: set[str] = set()
        self._touched_lock = threading.Lock()
        # runtime actions (laggard.mitigate.Controller): job -> {"act": kill switch, "actions": the job's log};
        # both stored (a restart must not forget a kill switch an operator set)
        self.act: dict[str, dict[str, Any]] = {}
        self._load()

    # ------------------------------------------------------------------ ingest
    def ingest(self, body: bytes, only_job: str | None = None) -> dict[str, Any]:
        """Store one batch and add it to its job's window; raises BadBatch on a bad body (and
        ``tokens.Forbidden`` on a batch of another job than ``only_job``, the token's, when given)."""
        return self.ingest_many([body], only_job=only_job)[0]

    def ingest_bundle(self, body: bytes, only_job: str | None = None) -> dict[str, Any]:
        """A relay's bundle (``laggard.wire.bundle``): each batch as ``ingest`` takes it, all checked
        before any is stored (a bad part refuses the bundle, saying which), one commit for all."""
        from laggard.wire.bundle import decode_bundle

        return {"parts": self.ingest_many(decode_bundle(body), bundle=True, only_job=only_job)}

    def ingest_pack(self, body: bytes, only_job: str | None = None) -> dict[str, Any]:
        """A relay's pack (``laggard.wire.pack``): each part as ``ingest`` takes a batch, all checked
        before any is stored; the pack's body stored once and held once, each part pointing at its rows."""
        from laggard.wire.pack import decode_pack

        t0 = time.perf_counter()
        batches = decode_pack(body)
        held, row0 = [], 0
        for b in batches:
            held.append(PackSlice(body, row0, b.table.num_rows))
            row0 += b.table.num_rows
        return {"parts": self._ingest(batches, held, t0, "pack", only_job)}

    def ingest_many(self, bodies: list[bytes], bundle: bool = False,
                    only_job: str | None = None) -> list[dict[str, Any]]:
        """Store batches (one transaction) and add each new one to its job's window: per batch, what
        ``ingest`` answers."""
        t0 = time.perf_counter()
        batches = decode_batches(bodies) if bundle else [decode_batch(b) for b in bodies]
        return self._ingest(batches, bodies, t0, "bundle" if bundle else None, only_job)

    def _ingest(self, batches: list[Batch], held: list[bytes] | list[PackSlice], t0: float,
                parts_of: str | None, only_job: str | None = None) -> list[dict[str, Any]]:
        """Checked batches stored (one transaction) and each new one added to its job's window, with
        what the window hands to the analysis (``held``: its body, or its rows of a pack);
        ``parts_of``: "bundle" or "pack" when they came in one (errors name the part)."""
        if only_job is not None and any(b.job_id != only_job for b in batches):
            from laggard.monitor.tokens import Forbidden

            other = next(b.job_id for b in batches if b.job_id != only_job)
            raise Forbidden(f"this ingest token may post for job {only_job!r} only, not {other!r}")
        wins: list[JobWindow] = []
        with self._lock:
            for i, b in enumerate(batches):
                wins.append(self._job_of(b, None if parts_of is None else f"{parts_of} part {i}: "))
        rows = [_row(b, h, self.cluster.id) for b, w, h in zip(batches, wins, held, strict=True) if w.tracing]
        stored = iter(self.store.add_batches(rows) if rows else [])
        out = []
        counts = dict.fromkeys(("stored", "duplicate", "tracing_off"), 0)  # counted once a request (a pack: 32 parts)
        added = []
        for b, win, body in zip(batches, wins, held, strict=True):
            if not win.tracing:
                counts["tracing_off"] += 1
                out.append({"accepted": 0, "duplicate": False, "tracing": False, "dump_request": win.dump_request})
                continue
            new = next(stored)
            if new:
                added.append((win, b, body))
            counts["stored" if new else "duplicate"] += 1
            out.append({"accepted": b.table.num_rows if new else 0, "duplicate": not new, "tracing": True,
                        "dump_request": win.dump_request})
        with self._lock:  # (once a request, not once a part: the parts of a pack wait on it together)
            for win, b, body in added:
                win.add(b.table, b.rank, b.min_step, b.max_step, body=body)
            jobs = {win.job_id: win for win, _, _ in added}  # each job once (a pack's parts share one)
            moved = {j for j, win in jobs.items() if self._completed_more(win)}
        if moved:
            self._touch(moved)
        for result, n in counts.items():
            if n:
                self.metrics.batches.labels(result=result).inc(n)
        self.metrics.ops.inc(sum(x["accepted"] for x in out))
        self.metrics.latency.observe(time.perf_counter() - t0)
        return out

    def _completed_more(self, win: JobWindow) -> bool:
        """Whether the job's complete steps moved on since the analyzer was last woken for them (a
        window is cut only then, or when the job goes idle, which the analyzer's tick sees: waking it
        for every batch cost a 1,024-rank job 32 thread switches a flush, ~13% of the collector's
        held-GIL samples). Call under the lock."""
        last = win.complete_through()
        if self._woken_through.get(win.job_id) == last:
            return False
        self._woken_through[win.job_id] = last
        return True

    def _job_of(self, b: Batch, where: str | None) -> JobWindow:
        """The batch's job window, the job created from its meta when new (call under the lock)."""
        win = self.windows.get(b.job_id)
        if win is None:
            if b.meta is None:
                from laggard.wire.batch import BadBatch

                raise BadBatch(f"{where or ''}job {b.job_id!r} is new: its first batch must carry laggard.meta")
            self.store.add_job(b.job_id, b.meta)
            win = self._window(b.job_id, b.meta)
            if self.cluster.claim(b.job_id):
                self._claimed(b.job_id, win)
        self.cluster.posted(b.job_id)
        return win

    # ------------------------------------------------------------------ alerts and the background thread
    def _raise(self, alerts: list[Alert]) -> None:
        for a in alerts:
            self.alerts.append(a)
            self.store.add_alert(a.job, a.rule, a.message, {**a.detail, "kind": a.kind})
            self.notifier.send(a)

    def tick(self) -> None:
        """One round of the background analyzer: collect finished analyses and start due ones (in
        the pool; without one, each due job is analyzed here in turn), then the hang checks. Only
        the jobs whose lease this collector holds (``laggard.monitor.cluster``)."""
        try:
            self._cluster_round()
        except Exception:  # the database is down: the leases lapse, the others' rounds take them
            log.exception("lease round failed")
        self._analyze(list(self.windows))
        try:
            self.check_hangs()
        except Exception:  # the same for a hang verdict
            log.exception("hang check failed")

    def start(self) -> None:
        """Start the background analyzer (with its child processes unless ``cfg.analysis_process`` is off)."""
        if self.cfg.analysis_process:
            self._analyzer = AnalysisPool(workers=self.cfg.analysis_workers, nice=self.cfg.analysis_nice,
                                          cache_bytes=self.cfg.analysis_cache_mib * 2**20)

        self._thread = threading.Thread(target=self._analyzer_loop, name="laggard-analyzer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)
        if self._analyzer is not None:
            self._analyzer.close()
        self.notifier.close()
        try:
            self.cluster.leave()
        except Exception:  # the database is down: the leases lapse by themselves
            log.exception("giving up the leases failed")
        self.store.close()
