"""The collector: ingest into the store and the in-memory windows, background analysis, alerts, metrics.

HTTP-free (``laggard.monitor.app`` is the HTTP layer over it), so the bench and the detection tests
drive the same code in-process.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from laggard.errors import LaggardError
from laggard.monitor.alerts import (
    Alert,
    Notifier,
    Rule,
    RuleState,
    default_rules,
    evaluate_hang,
    evaluate_hang_verdict,
    evaluate_window,
)
from laggard.monitor.analyser import AnalysisPool, WindowAnalysis, analyse
from laggard.monitor.cluster import Cluster
from laggard.monitor.config import MonitorConfig
from laggard.monitor.hangs import parse_beat, parse_report
from laggard.monitor.metrics import Metrics
from laggard.monitor.store import BatchRow, Store
from laggard.monitor.window import JobWindow, WindowCut
from laggard.optable.ops import JobMeta
from laggard.wire.batch import Batch, PackSlice, decode_batch, decode_batches

log = logging.getLogger("laggard.monitor")


class UnknownJob(LaggardError):
    """A job id the collector has not seen (answered with 404)."""


_ACTION_FIELDS = {"step": int, "kind": str, "ranks": list, "reason": str}  # each logged action has these


def check_actions(actions: Any) -> None:
    """A controller's action log (``laggard.mitigate.controller.Action.to_json``), or one-line ``LaggardError``."""
    if not isinstance(actions, list) or len(actions) > 10_000 or not all(isinstance(a, dict) for a in actions):
        raise LaggardError("actions: expected a JSON list of (at most 10,000) action objects")
    for i, a in enumerate(actions):
        bad = [k for k, t in _ACTION_FIELDS.items() if not isinstance(a.get(k), t) or isinstance(a.get(k), bool)]
        bad += [k for k in ("step_s_before", "step_s_after")
                if a.get(k) is not None and (not isinstance(a[k], int | float) or isinstance(a[k], bool))]
        if bad or not all(isinstance(r, int) and not isinstance(r, bool) for r in a["ranks"]):
            raise LaggardError(f"actions[{i}]: expected step (int), kind, reason (str), ranks (list of int) and "
                               f"step_s_before/step_s_after (number or null); bad: {', '.join(bad) or 'ranks'}")


def _stored_batches(rows: list[BatchRow]) -> list[tuple[BatchRow, Batch]]:
    """Stored rows with their batches read again (a pack once for all its parts)."""
    from laggard.wire.pack import decode_pack

    packs: dict[int, dict[int, Batch]] = {}  # id of a pack's body -> its parts by first row
    out = []
    for row in rows:
        if row.pack is None:
            out.append((row, decode_batch(row.body)))
            continue
        parts = packs.get(id(row.pack))
        if parts is None:
            parts, at = {}, 0
            for b in decode_pack(row.pack):
                parts[at] = b
                at += b.table.num_rows
            packs[id(row.pack)] = parts
        out.append((row, parts[row.row0]))
    return out


def _row(b: Batch, held: bytes | PackSlice) -> BatchRow:
    """The store's row of a checked batch: its body, or its pack's body and its rows there."""
    if isinstance(held, PackSlice):
        return BatchRow(job_id=b.job_id, rank=b.rank, seq=b.seq, min_step=b.min_step, max_step=b.max_step,
                        num_ops=held.num_rows, body=b"", pack=held.body, row0=held.row0)
    return BatchRow(job_id=b.job_id, rank=b.rank, seq=b.seq, min_step=b.min_step, max_step=b.max_step,
                    num_ops=b.table.num_rows, body=held)


class Collector:
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
        store.via = self.cluster.id
        self.metrics = Metrics(self.cfg.metrics_top_k)
        self.notifier = Notifier(webhooks or [])
        self.windows: dict[str, JobWindow] = {}
        self._lock = threading.RLock()  # guards windows (ingest threads vs. the analyser)
        stored = store.rules()
        self.rules: list[Rule] = [Rule.from_json(r) for r in stored] if stored is not None else default_rules()
        self.rule_state = RuleState()
        self.alerts: list[Alert] = []
        self._next_refresh: dict[str, float] = {}  # job -> earliest next analysis (analysis_share)
        self._hung_since: dict[str, float] = {}  # job -> when its standing hang verdict was decided
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._analyser: AnalysisPool | None = None  # the child processes analysing windows (start())
        self._running: dict[str, tuple[Future, WindowCut, int]] = {}  # job -> its window in a child, attempt
        # the analyser thread is woken at once (not at its next tick) by batches that complete steps
        # and by finished analyses: the jobs they touched, to look at for a due window (``_analyser_loop``)
        self._wake = threading.Event()
        self._woken_through: dict[str, int] = {}  # job -> its complete steps when batches last woke it
        self._touched: set[str] = set()
        self._touched_lock = threading.Lock()
        # runtime actions (laggard.mitigate.Controller): job -> {"act": kill switch, "actions": the job's log};
        # both stored (a restart must not forget a kill switch an operator set)
        self.act: dict[str, dict[str, Any]] = {}
        self._load()

    # ------------------------------------------------------------------ start-up
    def _load(self) -> None:
        """Rebuild each job's windows from the stored batches (a restart loses nothing); take the
        leases this collector may."""
        jobs = self.store.jobs()
        self.cluster.round([j for j, _, _ in jobs])
        for job_id, meta, tracing in jobs:
            self._rebuild(job_id, meta, tracing)
        for job_id, (on, actions) in self.store.act_states().items():
            self.act[job_id] = {"act": on, "actions": actions}

    def _rebuild(self, job_id: str, meta: dict[str, Any], tracing: bool) -> None:
        """The job's window made again from the stored batches (its heartbeats and dump requests kept)."""
        mark = self.store.arrival_mark(job_id)  # before reading: what comes meanwhile is read again
        old = self.windows.pop(job_id, None)
        win = self._window(job_id, meta)
        win.tracing = tracing
        if old is not None:
            win.hangs, win.dump_request = old.hangs, old.dump_request
        loaded = []
        progress = self.store.rank_progress(job_id)
        if progress:
            since = min(p[3] for p in progress) - self.cfg.window_steps - 1
            for row, b in _stored_batches(self.store.batches_since(job_id, since)):
                held = PackSlice(row.pack, row.row0, row.num_ops) if row.pack is not None else row.body
                win.add(b.table, b.rank, b.min_step, b.max_step, body=held)
                loaded.append((row.rank, row.seq))
            for rank, _, num_ops, _ in progress:
                st = win.ranks.get(rank)
                if st is not None:
                    st.num_ops = num_ops
            win.num_ops = sum(p[2] for p in progress)
        self.cluster.start_pull(job_id, mark, loaded)

    def _cluster_round(self) -> None:
        """Renew and take leases (``laggard.monitor.cluster``); a job taken is rebuilt from the
        database, a job lost is no longer analysed or exported here. Then, for each job held, the
        batches other collectors stored."""
        changed = self.cluster.round(list(self.windows))
        if changed is not None:
            taken, lost = changed
            for job_id in taken:
                known = self.store.job(job_id)
                if known is not None:
                    with self._lock:
                        self._rebuild(job_id, *known)
                    self._touch({job_id})
                    log.info("job %s: analysed by this collector from now on", job_id)
            for job_id in set(self.cluster.owners) - set(self.windows):  # another collector's: listed here
                known = self.store.job(job_id)
                if known is not None:
                    with self._lock:
                        self._window(job_id, known[0]).tracing = known[1]
            for job_id in lost:
                self.cluster.drop(job_id)
                self.metrics.drop_job(job_id)
                log.warning("job %s: another collector took its lease (this one missed its renewals)", job_id)
        for job_id in list(self.cluster.held):
            rows = self.cluster.pull(job_id)
            win = self.windows.get(job_id)
            if not rows or win is None:
                continue
            with self._lock:
                for row, b in _stored_batches(rows):
                    held = PackSlice(row.pack, row.row0, row.num_ops) if row.pack is not None else row.body
                    win.add(b.table, b.rank, b.min_step, b.max_step, body=held)
                moved = self._completed_more(win)
            if moved:
                self._touch({job_id})

    def _window(self, job_id: str, meta: dict[str, Any]) -> JobWindow:
        win = self.windows.get(job_id)
        if win is None:
            win = self.windows[job_id] = JobWindow(job_id=job_id, meta=JobMeta.from_json(meta), cfg=self.cfg)
        return win

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
        rows = [_row(b, h) for b, w, h in zip(batches, wins, held, strict=True) if w.tracing]
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
        """Whether the job's complete steps moved on since the analyser was last woken for them (a
        window is cut only then, or when the job goes idle, which the analyser's tick sees: waking it
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
                self.cluster.start_pull(b.job_id, 0, [])
        self.cluster.posted(b.job_id)
        return win

    # ------------------------------------------------------------------ analysis
    def refresh(self, job_id: str) -> bool:
        """Analyse the job's latest window if steps completed (waiting for it); raise alerts. True if it ran."""
        cut = self._cut(job_id)
        if cut is None:
            return False
        acfg = self.cfg.analysis
        win = self.windows[job_id]
        res = (self._analyser.run(cut, win.meta, acfg, job_id) if self._analyser is not None
               else analyse(cut, win.meta, acfg))
        self._finish(job_id, cut.last, res)
        return True

    def _cut(self, job_id: str) -> WindowCut | None:
        with self._lock:
            return self.windows[job_id].cut()

    def _finish(self, job_id: str, last: int, res: WindowAnalysis) -> None:
        """Keep a window's analysis and raise its alerts."""
        win = self.windows[job_id]
        doc = res.doc
        with self._lock:
            win.apply(last, doc, res.error, res.refresh_s, res.load_ratio, res.rank_steps)
        self.metrics.refresh.observe(res.refresh_s)
        if doc is not None:
            self.metrics.set_job(job_id, doc)
            self._raise(evaluate_window(self.rules, self.rule_state, job_id, doc, res.load_ratio))
        share = self.cfg.analysis_share
        self._next_refresh[job_id] = time.monotonic() + res.refresh_s * (1.0 - share) / share

    def _collect(self) -> None:
        """Keep the analyses the children finished; a window whose child died is submitted again once."""
        for job_id, (fut, cut, attempt) in list(self._running.items()):
            if not fut.done():
                continue
            del self._running[job_id]
            try:
                self._finish(job_id, cut.last, fut.result())
            except BrokenProcessPool:  # the next submit starts new children
                if attempt == 0:
                    self._submit(job_id, cut, 1)
                else:
                    log.error("analysis of job %s failed: its analysis process died twice", job_id)
            except Exception:  # one job's bug must not stop the others; it is logged
                log.exception("analysis of job %s failed", job_id)

    def _dispatch(self, job_id: str) -> None:
        """Hand the job's window to the pool if one is due (a job's windows one at a time, oldest first)."""
        if job_id in self._running:
            return
        cut = self._cut(job_id)
        if cut is not None:
            self._submit(job_id, cut, 0)

    def _submit(self, job_id: str, cut: WindowCut, attempt: int) -> None:
        fut = self._analyser.submit(cut, self.windows[job_id].meta, self.cfg.analysis, job_id)
        self._running[job_id] = (fut, cut, attempt)
        fut.add_done_callback(lambda _: self._touch({job_id}))

    def _touch(self, job_ids: set[str]) -> None:
        """Wake the analyser thread for these jobs (new batches, or their window's analysis is back)."""
        with self._touched_lock:
            self._touched |= job_ids
        self._wake.set()

    def _take_touched(self) -> list[str]:
        """The touched jobs, no longer touched (``_analyse`` touches again those still in their
        analysis share's wait)."""
        with self._touched_lock:
            self._wake.clear()
            out, self._touched = self._touched, set()
        return [j for j in out if j in self.windows]

    def _wake_at(self, next_tick: float) -> float:
        """When the analyser must look again: the next tick, or a touched job's analysis share ending."""
        with self._touched_lock:
            return min([next_tick, *(self._next_refresh.get(j, 0.0) for j in self._touched)])

    def check_hangs(self) -> None:
        """Suspect hangs (asking the job's tracers for their hang reports); decide the verdicts that are due."""
        now = time.time()
        due: list[tuple[str, Any, tuple[list[Any], list[str]]]] = []
        with self._lock:
            silent = {j: w.hang(now) for j, w in self.windows.items() if self.cluster.owns(j)}
            for j, s in silent.items():  # a hang first suspected: ask the job's tracers for their reports
                win = self.windows[j]
                if s and not win.hang_was_suspected:
                    win.dump_request += 1
                    win.hangs.open(win.dump_request, now, suspected=True)
                win.hang_was_suspected = bool(s)
                if win.hangs.ready(now, self.cfg.hang_collect_s):
                    due.append((j, win.hangs, win.hangs.take()))
        for job_id, s in silent.items():
            self._raise(evaluate_hang(self.rules, self.rule_state, job_id, s))
        abort = any(r.enabled and r.type == "hang" and r.abort for r in self.rules)
        for job_id, case, (dumps, warnings) in due:  # outside the lock: 1,000 ranks' buffers take a while
            pub = case.decide(job_id, dumps, self.cfg.hang_collect_s, abort, warnings)
            log.info("hang verdict for job %s: %s, culprit rank(s) %s", job_id, pub["verdict"], pub["culprit_ranks"])
            self.metrics.set_hang(job_id, pub)
            self._hung_since[job_id] = now
            self._raise(evaluate_hang_verdict(self.rules, self.rule_state, job_id, pub))
        for job_id, s in silent.items():  # a job that moved again is no longer hung
            if not s and self._moved_since_verdict(job_id):
                self.metrics.clear_hang(job_id)
                self._hung_since.pop(job_id, None)

    def _moved_since_verdict(self, job_id: str) -> bool:
        """Whether the job moved (a rank's progress or batches) or closed every tracer since its hang
        verdict: a job whose heartbeats all stopped is gone, not recovered, and stays hung."""
        since = self._hung_since.get(job_id)
        if since is None:
            return True
        with self._lock:
            win = self.windows[job_id]
            beats = win.hangs.beats
            if beats:
                return all(b.closed for b in beats.values()) or any(b.moved_s > since for b in beats.values())
            return any(r.last_seen_s > since for r in win.ranks.values())

    def heartbeat(self, job_id: str, body: Any) -> dict[str, Any]:
        """A tracer's heartbeat (``laggard.tracer.stream``): the job's state back (dump request, verdict)."""
        from laggard.wire.batch import valid_job_id

        rank, state, meta = parse_beat(body)
        with self._lock:
            win = self.windows.get(job_id)
            if win is None:
                if meta is None:
                    raise UnknownJob(f"no job {job_id!r} (a first heartbeat carries the job's meta)")
                try:
                    JobMeta.from_json(meta)
                except (LaggardError, TypeError, ValueError, KeyError) as e:
                    raise LaggardError(f"heartbeat: bad job meta ({e})") from None
                self.store.add_job(valid_job_id(job_id), meta)
                win = self._window(job_id, meta)
                if self.cluster.claim(job_id):
                    self.cluster.start_pull(job_id, 0, [])
            self.cluster.posted(job_id)
            win.hangs.beat(rank, state, time.time())
            return {"dump_request": win.dump_request, "tracing": win.tracing, "hang": win.hangs.published}

    def add_report(self, job_id: str, request: int, body: bytes) -> dict[str, Any]:
        """A rank's hang report for ``request`` (its Flight Recorder dump and state)."""
        self.job(job_id)  # 404 before parsing
        d = parse_report(body)
        with self._lock:
            win = self.job(job_id)
            expected = win.hangs.expected()
            if expected and d.rank >= expected:
                from laggard.monitor.hangs import BadReport

                raise BadReport(f"hang report: rank {d.rank} is outside job {job_id!r} ({expected} ranks)")
            before = win.hangs.dropped_total
            held = win.hangs.add_report(request, d, len(body), max_reports=self.cfg.hang_reports_per_job,
                                        max_bytes=self.cfg.hang_report_bytes_per_job)
            dropped = win.hangs.dropped_total - before
        if dropped:
            self.metrics.hang_reports_dropped.inc(dropped)
            log.warning("job %s: %d hang report(s) dropped over the per-job limits", job_id, dropped)
        return {"id": job_id, "rank": d.rank, "request": request, "accepted": held}

    def _raise(self, alerts: list[Alert]) -> None:
        for a in alerts:
            self.alerts.append(a)
            self.store.add_alert(a.job, a.rule, a.message, {**a.detail, "kind": a.kind})
            self.notifier.send(a)

    def tick(self) -> None:
        """One round of the background analyser: collect finished analyses and start due ones (in
        the pool; without one, each due job is analysed here in turn), then the hang checks. Only
        the jobs whose lease this collector holds (``laggard.monitor.cluster``)."""
        try:
            self._cluster_round()
        except Exception:  # the database is down: the leases lapse, the others' rounds take them
            log.exception("lease round failed")
        self._analyse(list(self.windows))
        try:
            self.check_hangs()
        except Exception:  # the same for a hang verdict
            log.exception("hang check failed")

    def _analyse(self, job_ids: list[str]) -> None:
        """Collect finished analyses, then start the due windows of ``job_ids``."""
        if self._analyser is not None:
            try:
                self._collect()
            except Exception:  # a resubmission that failed; the thread goes on
                log.exception("collecting window analyses failed")
        for job_id in job_ids:
            if not self.cluster.owns(job_id):
                continue
            if time.monotonic() < self._next_refresh.get(job_id, 0.0):
                with self._touched_lock:  # looked at again once its analysis share allows (``_wake_at``)
                    self._touched.add(job_id)
                continue
            try:
                if self._analyser is not None:
                    self._dispatch(job_id)
                else:
                    self.refresh(job_id)
            except Exception:  # one job's bug must not stop the thread, nor the jobs after it; it is logged
                log.exception("analysis of job %s failed", job_id)

    def _analyser_loop(self) -> None:
        """The background analyser: a full ``tick`` every ``tick_s`` (every job: idle refreshes, the
        analysis share's waits, hang checks), and between ticks, as soon as batches come or an analysis
        is back, the jobs they touched (a window is handed over when its steps complete, not up to a
        tick later, and its result kept when it is back: ~0.2 s of a window's lag at the 0.2 s tick),
        or once the analysis share lets a touched job's next window start."""
        next_tick = time.monotonic() + self.cfg.tick_s
        while not self._stop.is_set():
            self._wake.wait(max(0.0, self._wake_at(next_tick) - time.monotonic()))
            if self._stop.is_set():
                return
            if time.monotonic() >= next_tick:
                self._take_touched()
                self.tick()
                next_tick = time.monotonic() + self.cfg.tick_s
            else:
                self._analyse(self._take_touched())

    def start(self) -> None:
        """Start the background analyser (with its child processes unless ``cfg.analysis_process`` is off)."""
        if self.cfg.analysis_process:
            self._analyser = AnalysisPool(workers=self.cfg.analysis_workers, nice=self.cfg.analysis_nice,
                                          cache_bytes=self.cfg.analysis_cache_mib * 2**20)

        self._thread = threading.Thread(target=self._analyser_loop, name="laggard-analyser", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)
        if self._analyser is not None:
            self._analyser.close()
        self.notifier.close()
        try:
            self.cluster.leave()
        except Exception:  # the database is down: the leases lapse by themselves
            log.exception("giving up the leases failed")
        self.store.close()

    # ------------------------------------------------------------------ control and views
    def job(self, job_id: str) -> JobWindow:
        win = self.windows.get(job_id)
        if win is None:
            raise UnknownJob(f"no job {job_id!r}")
        return win

    def request_dump(self, job_id: str) -> int:
        """Ask the job's tracers to dump their Flight Recorder buffers (they see it within a poll)."""
        with self._lock:
            win = self.job(job_id)
            win.dump_request += 1
            # the verdict over the reports is published too (an alert only for a suspected hang)
            win.hangs.open(win.dump_request, time.time(), suspected=win.hang_was_suspected)
            return win.dump_request

    def set_tracing(self, job_id: str, on: bool) -> None:
        with self._lock:
            self.job(job_id).tracing = on
            self.store.set_tracing(job_id, on)

    def set_act(self, job_id: str, on: bool) -> None:
        """The job's controllers poll this: False stops their actions. Stored before it is answered."""
        with self._lock:
            self.job(job_id)
            self.store.set_act(job_id, on)
            self.act.setdefault(job_id, {"act": True, "actions": []})["act"] = on

    def actions(self, job_id: str) -> dict[str, Any]:
        """The job's kill switch and action log (``GET .../actions``)."""
        with self._lock:
            self.job(job_id)
            st = self.act.get(job_id, {"act": True, "actions": []})
            return {"id": job_id, "act": st["act"], "actions": list(st["actions"])}

    def set_actions(self, job_id: str, actions: Any) -> int:
        """The controller's action log (it sends all of it each time), stored; a new ``drain`` goes to
        the webhooks as an alert, for the scheduler."""
        check_actions(actions)
        with self._lock:
            self.job(job_id)
            self.store.set_actions(job_id, actions)
            st = self.act.setdefault(job_id, {"act": True, "actions": []})
            old, st["actions"] = len(st["actions"]), actions
        self._raise([Alert(job=job_id, rule="act-drain", message=f"job {job_id}: drain DP rank(s) {a.get('ranks')} "
                           f"at step {a.get('step')}: {a.get('reason')}", detail={"action": "drain", **a})
                     for a in actions[old:] if a.get("kind") == "drain"])
        return len(actions)

    def set_rules(self, specs: Any) -> list[Rule]:
        if not isinstance(specs, list):
            raise LaggardError("rules: expected a JSON list of rule objects")
        rules = [Rule.from_json(d) for d in specs]
        ids = [r.id for r in rules]
        if len(set(ids)) != len(ids):
            raise LaggardError(f"rules: duplicate rule id(s) {sorted({i for i in ids if ids.count(i) > 1})}")
        self.store.set_rules([r.to_json() for r in rules])
        self.rules = rules
        return rules

    def summaries(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{**w.summary(), "analysed_by": self.cluster.owner_of(j)} for j, w in self.windows.items()]

    def detail(self, job_id: str) -> dict[str, Any]:
        with self._lock:
            out = self.job(job_id).detail(self.cfg.top_k)
            out["analysed_by"] = self.cluster.owner_of(job_id)
            out.update(self.act.get(job_id, {"act": True, "actions": []}))
        out["alerts"] = [a for a in self.store.alerts(job_id, limit=50)]
        return out
