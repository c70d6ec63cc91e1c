"""Prometheus metrics of the collector (base units, ``_total`` counters, bounded labels)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    def __init__(self, top_k: int) -> None:
        self.top_k = top_k
        self.registry = CollectorRegistry()
        self.job_slowdown = Gauge("laggard_job_slowdown", "Straggler slowdown S = T / T_ideal of the job's latest window",
                                  ["job"], registry=self.registry)
        self.worker_slowdown = Gauge("laggard_worker_slowdown", "Per-worker slowdown S_w (top-k workers of each job)",
                                     ["job", "dp", "stage"], registry=self.registry)
        self.ops = Counter("laggard_ingest_ops", "Ops ingested (duplicates not counted)", registry=self.registry)
        self.batches = Counter("laggard_ingest_batches", "Op batches ingested", ["result"], registry=self.registry)
        self.latency = Histogram("laggard_ingest_latency_seconds", "Time to decode, check and store one batch",
                                 buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
                                 registry=self.registry)
        self.refresh = Histogram("laggard_window_refresh_seconds", "Time to analyse one window",
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
                                 registry=self.registry)
        self._labels: dict[str, set[tuple[str, str, str]]] = {}

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

    def render(self) -> bytes:
        return generate_latest(self.registry)
