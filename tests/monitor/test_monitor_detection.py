"""Detection by the window analysis + alert rules on synthetic running jobs (ground truth: the injection).

A smaller version of benchmarks/bench_monitor.py's evaluation (20 seeds, 20 x 1,000 clean steps).
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pytest

from laggard.errors import LaggardError
from laggard.monitor.alerts import Rule, default_rules, evaluate_hang
from laggard.monitor.config import MonitorConfig
from laggard.monitor.evaluate import NoisyJob, feed, feed_windows, make_job
from laggard.monitor.window import JobWindow
from laggard.optable.ops import Job, to_numpy


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_slow_worker_named_within_20_steps(seed):
    rank = seed % 8
    run = feed_windows(make_job(NoisyJob(seed=seed, steps=60, slow_rank=rank, start_step=20)))
    first = run.first_worker_alert(rank)
    assert first is not None and first - 20 <= 20, run.alerts
    assert not [a for a in run.alerts if "rank" in a[2] and a[2]["rank"] != rank], run.alerts


def test_clean_heavy_tailed_jobs_raise_nothing():
    for seed in (1000, 1001):
        run = feed_windows(make_job(NoisyJob(seed=seed, steps=300)))
        assert run.alerts == [] and run.num_windows >= 95


def test_a_low_confidence_finding_pages_only_when_a_rule_asks_for_it():
    """bench_monitor's clean seed 13: windows of S ~1.05 where no detector fires carry the analysis's
    low-confidence finding (the residual's largest carrier) for 6 windows by step 600; the default
    new-finding rule leaves it (it paged there before), a rule with ``low_confidence`` takes it."""
    job = make_job(NoisyJob(seed=1013, steps=1000))  # (its noise is drawn for all its steps at once)
    steps = to_numpy(job.table.column("step"))
    job = Job(table=job.table.filter(pa.array(steps <= 603)), meta=job.meta)
    assert feed_windows(job).alerts == []
    rules = default_rules()
    for r in rules:
        r.low_confidence = r.type == "new_finding"
    run = feed_windows(job, rules=rules)
    assert [(rule, d["finding"]["confidence"]) for _, rule, d in run.alerts] == [("new-finding", "low")]
    assert Rule.from_json({"id": "nf", "type": "new_finding", "low_confidence": True}).low_confidence
    with pytest.raises(LaggardError, match="low_confidence must be true or false"):
        Rule.from_json({"id": "nf", "type": "new_finding", "low_confidence": "yes"})


def test_one_off_stall_is_not_a_slow_worker():
    """One step where a worker stalls (3x its compute): in the window S_w, not in the alerts; its
    chronic score stays far below the stalled windows' S_w."""
    job = make_job(NoisyJob(seed=7, steps=60, spike_prob=0.0))
    t = job.table
    dur = to_numpy(t.column("dur_ns")).astype(np.float64)
    hit = (to_numpy(t.column("rank")) == 5) & (to_numpy(t.column("step")) == 30)
    hit &= np.array(t.column("kind").to_pylist()) == "compute"
    dur[hit] *= 3
    job = Job(table=t.set_column(t.schema.get_field_index("dur_ns"), "dur_ns", pa.array(dur.astype(np.int64))),
              meta=job.meta)
    run = feed_windows(job)
    assert [a for a in run.alerts if a[1] == "worker-slow"] == []


def test_full_collector_path_matches(tmp_path):
    """The same job through Collector.ingest (Arrow IPC, SQLite) raises the same worker alert."""
    job = make_job(NoisyJob(seed=2, steps=45, slow_rank=2, start_step=20))
    a = feed_windows(job)
    b = feed(job, tmp_path / "c.db", MonitorConfig(idle_refresh_s=1e9))
    assert a.first_worker_alert(2) is not None and a.first_worker_alert(2) == b.first_worker_alert(2)


def test_hang_suspected_names_silent_ranks_and_their_last_op():
    job = make_job(NoisyJob(seed=3, steps=12, spike_prob=0.0))
    from laggard.monitor.push import step_batches

    cfg = MonitorConfig(hang_after_s=30.0, hang_min_steps=2)
    win = JobWindow(job_id="j", meta=job.meta, cfg=cfg)
    for s, r, t in step_batches(job):
        if r == 6 and s > 4:
            continue  # rank 6 stops after step 4
        win.add(t, r, s, s, now_s=1000.0 if r == 6 else 1100.0)
    silent = win.hang(now_s=1101.0)
    assert [h["rank"] for h in silent] == [6]
    assert silent[0]["last_step"] == 4 and silent[0]["last_op"]["step"] == 4 and silent[0]["last_op"]["name"]
    assert win.hang(now_s=1020.0) == []  # not silent long enough yet
    from laggard.monitor.alerts import RuleState

    alerts = evaluate_hang(default_rules(), RuleState(), "j", silent)
    assert len(alerts) == 1 and "ranks 6" in alerts[0].message and "step 4" in alerts[0].message


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_complete_steps_and_front_follow_every_rank(seed):
    """The window's counted progress (complete_through, the front step) against each rank's own
    latest step, batches arriving shuffled: ranks joining late, batches of earlier steps after later ones."""
    job = make_job(NoisyJob(seed=seed, steps=9, spike_prob=0.0))
    from laggard.monitor.push import step_batches

    batches = list(step_batches(job))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(batches))
    win = JobWindow(job_id="j", meta=job.meta, cfg=MonitorConfig())
    last: dict[int, int] = {}
    for i in order:
        s, r, t = batches[i]
        win.add(t, r, s, s, now_s=0.0)
        last[r] = max(last.get(r, -1), s)
        want = min(last.values()) - 1 if len(last) >= win.expected_ranks else -1
        assert win.complete_through() == want
        assert win.front_step() == max(last.values())
        assert {k: v.last_step for k, v in win.ranks.items()} == last


def test_alerts_reach_a_webhook(tmp_path):
    import json
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    got: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        job = make_job(NoisyJob(seed=2, steps=40, slow_rank=2, start_step=10))
        feed(job, tmp_path / "w.db", MonitorConfig(idle_refresh_s=1e9),
             webhooks=[f"http://127.0.0.1:{httpd.server_address[1]}/hook"])
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        httpd.shutdown()
    assert got and got[0]["rule"] == "worker-slow" and got[0]["detail"]["rank"] == 2, got


def test_a_window_over_sparse_steps_holds_window_steps_of_them():
    """A trace's steps can be sparse (every 10th step profiled): the window counted step numbers, so 6
    numbers held one step and its analysis said "not enough to judge". It holds the last 6 reported."""
    import pyarrow.compute as pc

    job = make_job(NoisyJob(seed=0, steps=10, spike_prob=0.0))
    sparse = job.table.set_column(job.table.schema.get_field_index("step"), "step",
                                  pc.multiply(job.table.column("step"), 10))
    from laggard.monitor.push import step_batches

    cfg = MonitorConfig(window_steps=6)
    win = JobWindow(job_id="j", meta=job.meta, cfg=cfg)
    for s, r, t in step_batches(Job(table=sparse, meta=job.meta)):
        win.add(t, r, s, s, now_s=0.0)
    last = win.complete_through()
    assert last == 89  # step 90 is the last every rank has reported: 80 is the last complete
    cut = win.window_table(last)
    steps = sorted(set(to_numpy(cut.column("step")).tolist()))
    assert steps == [30, 40, 50, 60, 70, 80], steps
    assert win.first_of(last) == 30
