"""When each job's window is analyzed, and what becomes of the result (``Collector`` has it).

A window is handed to the analysis when its steps complete (or the job goes idle), one at a time per
job, oldest first, in the pool's child processes (or in-process without one); a job's next window
waits while the analysis share allows (``analysis_share``). The background thread looks at the
jobs touched by new batches or by a finished analysis at once, and at every job each tick. A result
is kept in the job's window; its metrics and alerts only where this collector still holds the job.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures.process import BrokenProcessPool

from laggard.monitor.alerts import evaluate_window
from laggard.monitor.analyzer import WindowAnalysis, analyze
from laggard.monitor.window import WindowCut

log = logging.getLogger("laggard.monitor")


class Scheduler:
    """The window analyses of the jobs this collector holds (a part of ``Collector``)."""

    def refresh(self, job_id: str) -> bool:
        """Analyze the job's latest window if steps completed (waiting for it); raise alerts. True if it ran."""
        cut = self._cut(job_id)
        if cut is None:
            return False
        acfg = self.cfg.analysis
        win = self.windows[job_id]
        res = (self._analyzer.run(cut, win.meta, acfg, job_id) if self._analyzer is not None
               else analyze(cut, win.meta, acfg))
        self._finish(job_id, cut.last, res)
        return True

    def _cut(self, job_id: str) -> WindowCut | None:
        with self._lock:
            return self.windows[job_id].cut()

    def _finish(self, job_id: str, last: int, res: WindowAnalysis) -> None:
        """Keep a window's analysis; raise its alerts and export it where this collector still holds
        the job (its lease may have gone to another collector while the window was analyzed)."""
        win = self.windows[job_id]
        doc = res.doc
        with self._lock:
            win.apply(last, doc, res.error, res.refresh_s, res.load_ratio, res.rank_steps)
        self.metrics.refresh.observe(res.refresh_s)
        if doc is not None and self.cluster.owns(job_id):
            self.metrics.set_job(job_id, doc)
            self._raise(evaluate_window(self.rules, self.rule_state, job_id, doc, res.load_ratio))
            self._keep(job_id)
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
        fut = self._analyzer.submit(cut, self.windows[job_id].meta, self.cfg.analysis, job_id)
        self._running[job_id] = (fut, cut, attempt)
        fut.add_done_callback(lambda _: self._touch({job_id}))

    def _touch(self, job_ids: set[str]) -> None:
        """Wake the analyzer thread for these jobs (new batches, or their window's analysis is back)."""
        with self._touched_lock:
            self._touched |= job_ids
        self._wake.set()

    def _take_touched(self) -> list[str]:
        """The touched jobs, no longer touched (``_analyze`` touches again those still in their
        analysis share's wait)."""
        with self._touched_lock:
            self._wake.clear()
            out, self._touched = self._touched, set()
        return [j for j in out if j in self.windows]

    def _wake_at(self, next_tick: float) -> float:
        """When the analyzer must look again: the next tick, or a touched job's analysis share ending."""
        with self._touched_lock:
            return min([next_tick, *(self._next_refresh.get(j, 0.0) for j in self._touched)])

    def _analyze(self, job_ids: list[str]) -> None:
        """Collect finished analyses, then start the due windows of ``job_ids``."""
        if self._analyzer is not None:
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
                if self._analyzer is not None:
                    self._dispatch(job_id)
                else:
                    self.refresh(job_id)
            except Exception:  # one job's bug must not stop the thread, nor the jobs after it; it is logged
                log.exception("analysis of job %s failed", job_id)

    def _analyzer_loop(self) -> None:
        """The background analyzer: a full ``tick`` every ``tick_s`` (every job: idle refreshes, the
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
                self._analyze(self._take_touched())


__all__ = ["Scheduler"]
