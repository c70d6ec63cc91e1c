"""Detection quality of the live monitor on synthetic running jobs (tests and ``make bench``).

A job comes from ``laggard.groundtruth.synth`` (1F1B, dp x pp) with heavy-tailed noise added to its compute
ops (lognormal jitter plus Pareto spikes on a fraction of them); optionally one worker's compute
ops are slowed by ``factor`` from ``start_step`` on. Its ops are fed to a ``Collector`` step by
step, exactly as tracers would send them (one Arrow IPC batch per rank and step, through
``Collector.ingest``), and the window analysis and alert rules run after every step. The ground
truth (which rank, from which step) is the injection, outside the analysis.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from laggard.monitor.alerts import Rule, RuleState, default_rules, evaluate_window
from laggard.monitor.analyzer import analyze
from laggard.monitor.config import MonitorConfig
from laggard.monitor.push import step_batches
from laggard.monitor.service import Collector
from laggard.monitor.store import Store
from laggard.monitor.window import JobWindow
from laggard.optable.ops import Job, to_numpy
from laggard.wire.batch import encode_batch


@dataclass(kw_only=True, slots=True)
class NoisyJob:
    dp: int = 4
    pp: int = 2
    microbatches: int = 4
    steps: int = 60
    seed: int = 0
    jitter: float = 0.05  # lognormal sigma of every op (laggard.groundtruth.synth)
    spike_prob: float = 0.01  # share of compute ops hit by a Pareto-distributed stall ...
    spike_alpha: float = 2.5  # ... of (1 + Pareto(alpha)) x their duration: heavy-tailed
    slow_rank: int | None = None
    factor: float = 1.10
    start_step: int = 0


def make_job(spec: NoisyJob) -> Job:
    from laggard.groundtruth.synth import SynthConfig, synthesize

    job = synthesize(SynthConfig(dp=spec.dp, pp=spec.pp, microbatches=spec.microbatches, steps=spec.steps,
                                 seed=spec.seed, jitter=spec.jitter, name=f"noisy-{spec.seed}"))
    t = job.table
    rng = np.random.default_rng(spec.seed + 10_000)
    dur = to_numpy(t.column("dur_ns")).astype(np.float64)
    kc, kinds = job.codes("kind")
    compute = kc == kinds.index("compute")
    spike = compute & (rng.random(len(dur)) < spec.spike_prob)
    dur[spike] *= 1.0 + rng.pareto(spec.spike_alpha, int(spike.sum()))
    if spec.slow_rank is not None:
        slow = (compute & (to_numpy(t.column("rank")) == spec.slow_rank)
                & (to_numpy(t.column("step")) >= spec.start_step))
        dur[slow] *= spec.factor
    t = t.set_column(t.schema.get_field_index("dur_ns"), t.schema.field("dur_ns"), pa.array(dur.astype(np.int64)))
    return Job(table=t, meta=job.meta)


@dataclass(kw_only=True, slots=True)
class Run:
    alerts: list[tuple[int, str, dict]]  # (step after which it fired, rule id, detail)
    num_windows: int
    refresh_s: list[float]

    def first_worker_alert(self, rank: int) -> int | None:
        for step, _, detail in self.alerts:
            if detail.get("rank") == rank:
                return step
        return None


def feed_windows(job: Job, cfg: MonitorConfig | None = None, rules: list[Rule] | None = None) -> Run:
    """The window analysis and the alert rules alone (no store, no Arrow IPC): the collector's
    ``refresh`` path step by step, for long evaluations."""
    cfg = cfg or MonitorConfig(idle_refresh_s=1e9)  # refresh on the step hop only: deterministic
    rules = default_rules() if rules is None else rules
    win = JobWindow(job_id=job.meta.name, meta=job.meta, cfg=cfg)
    state = RuleState()
    alerts: list[tuple[int, str, dict]] = []
    refresh_s: list[float] = []
    batches = step_batches(job)
    i = 0
    while i < len(batches):
        s = batches[i][0]
        while i < len(batches) and batches[i][0] == s:
            _, r, table = batches[i]
            win.add(table, r, s, s)
            i += 1
        cut = win.cut()
        if cut is None:
            continue
        res = analyze(cut, win.meta)
        refresh_s.append(res.refresh_s)
        win.apply(cut.last, res.doc, res.error, res.refresh_s, res.load_ratio)
        if res.doc is not None:
            alerts += [(s, a.rule, a.detail) for a in evaluate_window(rules, state, win.job_id, res.doc,
                                                                         res.load_ratio)]
    return Run(alerts=alerts, num_windows=len(refresh_s), refresh_s=refresh_s)


def feed(job: Job, db: Path, cfg: MonitorConfig | None = None, webhooks: list[str] | None = None) -> Run:
    """Feed the job step by step into a fresh in-process collector; alerts with the step they came at."""
    col = Collector(Store(db), cfg or MonitorConfig(), webhooks=webhooks)
    jid = job.meta.name
    meta = job.meta.to_json()
    seqs: dict[int, int] = {}
    alerts: list[tuple[int, str, dict]] = []
    refresh_s: list[float] = []
    batches = step_batches(job)
    i = 0
    try:
        while i < len(batches):
            s = batches[i][0]
            while i < len(batches) and batches[i][0] == s:
                _, r, table = batches[i]
                seq = seqs.get(r, 0)
                seqs[r] = seq + 1
                col.ingest(encode_batch(table, job_id=jid, rank=r, seq=seq, meta=meta))
                i += 1
            n = len(col.alerts)
            if col.refresh(jid):
                refresh_s.append(col.windows[jid].result.refresh_s if col.windows[jid].result else float("nan"))
            alerts += [(s, a.rule, a.detail) for a in col.alerts[n:]]
    finally:
        col.stop()
    return Run(alerts=alerts, num_windows=len(refresh_s), refresh_s=refresh_s)
