"""The collector's start-up and leases: each job's window rebuilt from the stored batches, the
leases renewed and taken (``laggard.monitor.cluster``), the batches other collectors stored read in
(``Collector`` has it)."""

from __future__ import annotations

import logging
from typing import Any

from laggard.monitor.store import BatchRow
from laggard.monitor.window import JobWindow
from laggard.optable.ops import JobMeta
from laggard.wire.batch import Batch, PackSlice, decode_batch

log = logging.getLogger("laggard.monitor")


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


def _add_stored(win: JobWindow, rows: list[BatchRow]) -> list[tuple[int, int]]:
    """Stored batches into the job's window, each with what the analysis reads of it (its body, or its
    rows of a pack); their (rank, seq)."""
    for row, b in _stored_batches(rows):
        held = PackSlice(row.pack, row.row0, row.num_ops) if row.pack is not None else row.body
        win.add(b.table, b.rank, b.min_step, b.max_step, body=held)
    return [(row.rank, row.seq) for row in rows]


class Rebuild:
    """Windows from the database (a part of ``Collector``)."""

    def _load(self) -> None:
        """Rebuild each job's windows from the stored batches (a restart loses nothing); take the
        leases this collector may."""
        jobs = self.store.jobs()
        self.cluster.round([j for j, _, _ in jobs])
        for job_id, meta, tracing in jobs:
            self._rebuild(job_id, meta, tracing)
            if self.cluster.owns(job_id):
                self._take_over(job_id, self.windows[job_id])
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
            loaded = _add_stored(win, self.store.batches_since(job_id, since))
            for rank, _, num_ops, _ in progress:
                st = win.ranks.get(rank)
                if st is not None:
                    st.num_ops = num_ops
            win.num_ops = sum(p[2] for p in progress)
        self.cluster.start_pull(job_id, mark, loaded)

    def _cluster_round(self) -> None:
        """Renew and take leases (``laggard.monitor.cluster``); a job taken is rebuilt from the
        database, a job lost is no longer analyzed or exported here. Then, for each job held, the
        batches other collectors stored."""
        changed = self.cluster.round(list(self.windows))
        if changed is not None:
            taken, lost = changed
            for job_id in taken:
                known = self.store.job(job_id)
                if known is not None:
                    with self._lock:
                        self._rebuild(job_id, *known)
                    self._take_over(job_id, self.windows[job_id])
                    self._touch({job_id})
                    log.info("job %s: analyzed by this collector from now on", job_id)
            # other collectors' jobs: listed here, with their tracing switch as their holder set it (the
            # answer to the batches their ranks post here); a lone collector holds every job it lists
            for job_id, meta, tracing in self.store.jobs() if self.cluster.others else []:
                if job_id in self.cluster.owners and not self.cluster.owns(job_id):
                    with self._lock:
                        self._window(job_id, meta).tracing = tracing
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
                _add_stored(win, rows)
                moved = self._completed_more(win)
            if moved:
                self._touch({job_id})

    def _claimed(self, job_id: str, win: JobWindow) -> None:
        """A job first seen here whose lease this collector took: the batches other collectors stored
        are read in from the first, and it goes on from what the job's last holder kept."""
        self.cluster.start_pull(job_id, 0, [])
        self._take_over(job_id, win)

    def _window(self, job_id: str, meta: dict[str, Any]) -> JobWindow:
        win = self.windows.get(job_id)
        if win is None:
            win = self.windows[job_id] = JobWindow(job_id=job_id, meta=JobMeta.from_json(meta), cfg=self.cfg)
        return win
