"""Prometheus metrics of the collector (base units, ``_total`` counters, bounded labels)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    def __init__(self, top_k: int) -> None:
        self.top_k = top_k
        self.registry = CollectorRegistry()
        self.job_slowdown = Gauge("laggard_job_slowdown",
                                  "Straggler slowdown S = T / T_ideal of the job's latest window",
                                  ["job"], registry=self.registry)
        self.worker_slowdown = Gauge("laggard_worker_slowdown", "Per-worker slowdown S_w (top-k workers of each job)",
                                     ["job", "dp", "stage"], registry=self.registry)
        self.ops = Counter("laggard_ingest_ops", "Ops ingested (duplicates not counted)", registry=self.registry)
        self.batches = Counter("laggard_ingest_batches", "Op batches ingested", ["result"], registry=self.registry)
        self.latency = Histogram("laggard_ingest_latency_seconds", "Time to decode, check and store one batch",
                                 buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
                                 registry=self.registry)
        self.refresh = Histogram("laggard_window_refresh_seconds", "Time to analyze one window",
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
                                 registry=self.registry)
        self.job_hung = Gauge("laggard_job_hung", "1 while the job's last hang verdict (hang, desync, missing-ranks) "
                              "stands, for a hang the collector suspected", ["job"], registry=self.registry)
        self.hang_culprit = Gauge("laggard_hang_culprit", "1 for each culprit rank of the job's standing hang verdict "
                                  "(the first top-k)", ["job", "rank"], registry=self.registry)
        self.hang_verdicts = Counter("laggard_hang_verdicts", "Hang verdicts decided, by verdict", ["verdict"],
                                     registry=self.registry)
        self.hang_reports_dropped = Counter("laggard_hang_reports_dropped", "Hang reports dropped (oldest first) "
                                            "over a job's hang_reports_per_job / hang_report_bytes_per_job",
                                            registry=self.registry)
        self._labels: dict[str, set[tuple[str, str, str]]] = {}
        self._culprits: dict[str, list[str]] = {}

    def set_job(self, job_id: str, doc: dict[str, Any]) -> None:
        if doc["slowdown"] is not None:
            self.job_slowdown.labels(job=job_id).set(doc["slowdown"])
        new = set()
        for w in doc["by_worker"][: self.top_k]:
            if w["slowdown"] is None:
                continue
            key = (job_id, str(w["dp_rank"]), str(w["stage"]))
            self.worker_slowdown.labels(*key).set(w["slowdown"])
            new.add(key)
        for key in self._labels.get(job_id, set()) - new:  # workers that left the top-k
            self.worker_slowdown.remove(*key)
        self._labels[job_id] = new

    def set_hang(self, job_id: str, pub: dict[str, Any]) -> None:
        """A verdict was decided (``laggard.monitor.hangs``)."""
        self.hang_verdicts.labels(verdict=pub["verdict"]).inc()
        if not pub.get("suspected") or pub["verdict"] not in ("hang", "desync", "missing-ranks"):
            return
        self.clear_hang(job_id)
        self.job_hung.labels(job=job_id).set(1)
        ranks = [str(r) for r in pub["culprit_ranks"][: self.top_k]]
        for r in ranks:
            self.hang_culprit.labels(job=job_id, rank=r).set(1)
        self._culprits[job_id] = ranks

    def clear_hang(self, job_id: str) -> None:
        """The job moves again (or a new verdict replaces the old)."""
        if job_id in self._culprits:
            self.job_hung.labels(job=job_id).set(0)
        for r in self._culprits.pop(job_id, []):
            self.hang_culprit.remove(job_id, r)

    def drop_job(self, job_id: str) -> None:
        """The job is exported by another collector now (its lease moved): its series leave this one."""
        import contextlib

        with contextlib.suppress(KeyError):
            self.job_slowdown.remove(job_id)
        for key in self._labels.pop(job_id, set()):
            self.worker_slowdown.remove(*key)
        self.clear_hang(job_id)
        with contextlib.suppress(KeyError):
            self.job_hung.remove(job_id)

    def render(self) -> bytes:
        return generate_latest(self.registry)
