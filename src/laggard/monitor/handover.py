"""What the holder of a job's lease keeps in the database for the collector that holds the job next
(``laggard.monitor.shared``): its alert rules' state and its hang case, written when they change and
read when the lease is taken (``Collector`` has it); and the job's summary as the holder sees it,
which the other collectors list.

With them a killed collector's successor neither fires again an alert that already fired nor counts
a rule's windows from zero, and it finishes a hang verdict whose reports were coming in: every report
the holder accepts for the open request is kept as it comes, and the successor holds them again
and waits, within what is left of ``hang_collect_s``, for the ranks that have not reported.
"""

from __future__ import annotations

import logging
from typing import Any

from laggard.monitor.hangs import BadReport, parse_report
from laggard.monitor.window import JobWindow

log = logging.getLogger("laggard.monitor")


class Handover:
    """The job state kept for the next holder (a part of ``Collector``)."""

    def _keep(self, job_id: str) -> None:
        """Write what changed of the job's alert state and hang case, where this collector holds the
        job. A failed write is logged: the database being down must not stop the analysis."""
        if not self.cluster.owns(job_id):
            return
        with self._lock:
            win = self.windows.get(job_id)
            if win is None:
                return
            parts = {"alerts": self.rule_state.of_job(job_id),
                     "hang": {**win.hangs.shared(win.dump_request), "suspecting": win.hang_was_suspected}}
            if self.cluster.others:  # the job's line in the other collectors' job lists (``summaries``)
                parts["summary"] = win.summary()
        for part, state in parts.items():
            if self._kept.get((job_id, part)) == state:
                continue
            try:
                self.store.put_job_state(job_id, part, state)
                self._kept[(job_id, part)] = state
            except Exception:
                log.exception("job %s: keeping its %s state for the next collector failed", job_id, part)

    def _keep_report(self, job_id: str, request: int, rank: int, body: bytes) -> None:
        """A report the holder accepted for the open request, kept for a successor's verdict."""
        if not self.cluster.owns(job_id):
            return
        try:
            self.store.put_hang_report(job_id, request, rank, body)
        except Exception:
            log.exception("job %s: keeping rank %d's hang report for the next collector failed", job_id, rank)

    def _take_over(self, job_id: str, win: JobWindow) -> None:
        """This collector now holds the job: go on from what its last holder kept."""
        alerts, hang = self.store.job_state(job_id, "alerts"), self.store.job_state(job_id, "hang")
        reports: list[tuple[Any, int]] = []
        if hang and int(hang.get("request") or 0) > int(hang.get("decided") or 0):
            for body in self.store.hang_reports(job_id, int(hang["request"])):
                try:
                    reports.append((parse_report(body), len(body)))
                except BadReport:  # it was checked when it came: a newer laggard's report, left out
                    log.warning("job %s: a kept hang report could not be read again", job_id)
        with self._lock:
            self.rule_state.load_job(job_id, alerts)
            if hang:
                win.dump_request = max(win.dump_request, int(hang.get("dump_request") or 0))
                # a standing suspicion is not a new one: no second request, no second alert
                win.hang_was_suspected = win.hang_was_suspected or bool(hang.get("suspecting"))
                win.hangs.restore(hang, reports, max_reports=self.cfg.hang_reports_per_job,
                                  max_bytes=self.cfg.hang_report_bytes_per_job)
        self._kept[(job_id, "alerts")] = alerts
        self._kept[(job_id, "hang")] = hang
        if reports or (hang and hang.get("request")):
            log.info("job %s: went on with its hang case (request %s, %d report(s) kept)", job_id,
                     hang.get("request"), len(reports))


__all__ = ["Handover"]
