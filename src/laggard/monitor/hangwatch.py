"""The collector's hang watch: heartbeats and hang reports in, suspected hangs and verdicts out
(``Collector`` has it; the verdict itself is ``laggard.monitor.hangs``)."""

from __future__ import annotations

import logging
import time
from typing import Any

from laggard.errors import LaggardError
from laggard.monitor.alerts import evaluate_hang, evaluate_hang_verdict
from laggard.monitor.controls import UnknownJob
from laggard.monitor.hangs import parse_beat, parse_report
from laggard.optable.ops import JobMeta

log = logging.getLogger("laggard.monitor")


class HangWatch:
    """Hang suspicion and verdicts for the jobs this collector holds (a part of ``Collector``)."""

    def check_hangs(self) -> None:
        """Suspect hangs (asking the job's tracers for their hang reports); decide the verdicts that are due."""
        now = time.time()
        due: list[tuple[str, Any, tuple[list[Any], list[str]]]] = []
        opened, ended = [], []
        with self._lock:
            silent = {j: w.hang(now) for j, w in self.windows.items() if self.cluster.owns(j)}
            for j, s in silent.items():  # a hang first suspected: ask the job's tracers for their reports
                win = self.windows[j]
                if s and not win.hang_was_suspected:
                    win.dump_request += 1
                    win.hangs.open(win.dump_request, now, suspected=True)
                    opened.append(j)
                if win.hang_was_suspected and not s:
                    ended.append(j)
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
            self.store.drop_hang_reports(job_id)
        # what changed is kept for a successor: a request opened, a verdict, a suspicion's rule counts
        for job_id in {*opened, *ended, *(j for j, s in silent.items() if s), *(j for j, _, _ in due)}:
            self._keep(job_id)
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
                    self._claimed(job_id, win)
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
        if held:
            self._keep_report(job_id, request, d.rank, body)
        if dropped:
            self.metrics.hang_reports_dropped.inc(dropped)
            log.warning("job %s: %d hang report(s) dropped over the per-job limits", job_id, dropped)
        return {"id": job_id, "rank": d.rank, "request": request, "accepted": held}
