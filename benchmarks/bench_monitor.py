"""Live monitor: sustained ingest of 1,024 simulated ranks into one collector, latency, memory,
refresh time of the 1,024-worker window analysis, tracer per-op cost with streaming on vs off, and
detection quality (1.10x worker named within N steps; zero alerts on clean heavy-tailed jobs).

Ingest: ``laggard monitor serve`` (SQLite) in its own process; load generators in two other
processes post Arrow IPC batches (one per rank and 30 steps, 16 forward + 16 backward compute ops
and one all-reduce over all 1,024 ranks per step) over kept-alive connections, as fast as the
collector takes them, for LAGGARD_BENCH_MONITOR_S seconds (default 60). Baseline: the same batches
through ``Collector.ingest`` in-process (no HTTP), the ceiling of the HTTP service.
The collector analyses windows in a child process (its peak RSS is reported beside the collector's).
Detection runs in-process on the window analysis + alert rules (``laggard.monitor.evaluate``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NUM_RANKS = 1024
MB = 16  # microbatches: forward + backward compute ops per rank and step
STEPS_PER_BATCH = 30
TOKEN = "test-token-0123456789abcdef"  # tests/monitor_helpers.TOKEN: its Server helper sends it
DURATION_S = float(os.environ.get("LAGGARD_BENCH_MONITOR_S", "60"))
NUM_SEEDS = int(os.environ.get("LAGGARD_BENCH_MONITOR_SEEDS", "20"))
CLEAN_STEPS = int(os.environ.get("LAGGARD_BENCH_MONITOR_CLEAN_STEPS", "1000"))


def rank_table(rank: int, first_step: int, num_steps: int, seed: int = 0):
    """One rank's ops for ``num_steps`` steps of a data-parallel job (the load generators' batches)."""
    import numpy as np

    from laggard.optable.ops import make_table

    rng = np.random.default_rng(seed * 100_003 + rank)
    per = 2 * MB + 1
    n = per * num_steps
    step = np.repeat(np.arange(first_step, first_step + num_steps), per)
    j = np.tile(np.arange(per), num_steps)
    fwd = j < MB
    coll = j == 2 * MB
    dur = np.where(fwd, 2.0e6, 4.0e6) * rng.lognormal(0.0, 0.05, n)
    dur[coll] = 5.0e6
    start = (step * 200e6 + np.concatenate([[0], np.cumsum(dur)[:-1]]) % 200e6).astype(np.int64)
    names = np.where(fwd, "forward-compute", np.where(coll, "grads-all-reduce", "backward-compute"))
    return make_table({
        "op_id": rank * 10**9 + step * per + j, "rank": np.full(n, rank, np.int32), "dp_rank": np.full(n, rank, np.int32),
        "step": step, "microbatch": np.where(coll, -1, j % MB).astype(np.int32), "name": names,
        "kind": np.where(coll, "collective", "compute"), "start_ns": start, "dur_ns": dur.astype(np.int64),
        "group": np.where(coll, "world", None), "seq": np.where(coll, 0, -1),
    })


def meta_json() -> dict:
    from laggard.optable.ops import JobMeta

    return JobMeta(name="bench", world_size=NUM_RANKS, dp_size=NUM_RANKS, source="bench").to_json()


def generator(url: str, ranks: list[int], duration_s: float, threads: int, out: str) -> None:
    """A load-generator process: ranks' batches in step order, ``threads`` connections."""
    import threading

    import pyarrow as pa

    from laggard.wire.batch import encode_batch
    from laggard.wire.client import Client

    meta = meta_json()
    bases = {r: rank_table(r, 0, STEPS_PER_BATCH) for r in ranks}
    per = 2 * MB + 1
    lat: list[float] = []
    ops = [0]
    lock = threading.Lock()
    pos = [0]  # the next (batch, rank): every rank's batch b before any rank's batch b + 1

    def worker() -> None:
        c = Client(url, TOKEN, timeout_s=60)
        while time.monotonic() < deadline:
            with lock:
                b, r = divmod(pos[0], len(ranks))
                r = ranks[r]
                pos[0] += 1
            t = bases[r]
            t = t.set_column(t.schema.get_field_index("step"), t.schema.field("step"),
                             pa.array(t.column("step").to_numpy() + b * STEPS_PER_BATCH))
            body = encode_batch(t, job_id="bench", rank=r, seq=b, meta=meta)
            t0 = time.perf_counter()
            c.post_batch(body)
            dt = time.perf_counter() - t0
            with lock:
                lat.append(dt)
                ops[0] += t.num_rows
        c.close()

    t_start = time.time()
    deadline = time.monotonic() + duration_s
    ths = [threading.Thread(target=worker) for _ in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    Path(out).write_text(json.dumps({"lat": lat, "ops": ops[0], "per": per, "t_start": t_start, "t_end": time.time()}))


def _ingest(tmp: Path) -> dict:
    from tests.monitor_helpers import Server  # noqa: PLC0415 (the same helper the tests use)

    srv = Server(str(tmp / "bench.db"), tmp, token=TOKEN).start()
    try:
        half = NUM_RANKS // 2
        gens = []
        for i, rs in enumerate((range(0, half), range(half, NUM_RANKS))):
            gens.append(subprocess.Popen([sys.executable, __file__, "generator", srv.url, f"{rs.start}:{rs.stop}",
                                          str(DURATION_S), "4", str(tmp / f"gen{i}.json")]))
        for g in gens:
            g.wait()
        res = [json.loads((tmp / f"gen{i}.json").read_text()) for i in range(2)]
        wall = max(r["t_end"] for r in res) - min(r["t_start"] for r in res)  # from the first post to the last
        detail = srv.request("GET", "/api/v1/jobs/bench")[1]
        sys.path.insert(0, str(HERE))
        from proctree import children_of, status_kib

        rss_kib = status_kib(srv.proc.pid, "VmHWM")
        child_rss_kib = sum(status_kib(c, "VmHWM") for c in children_of(srv.proc.pid))  # the analysis process
        status, metrics = srv.request("GET", "/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics: {status} {metrics}")
    finally:
        srv.stop()
    lat = sorted(x for r in res for x in r["lat"])
    num_ops = sum(r["ops"] for r in res)
    m = {ln.split()[0]: float(ln.split()[-1]) for ln in metrics.splitlines() if ln and not ln.startswith("#")}
    n_ref, sum_ref = m.get("laggard_window_refresh_seconds_count", 0.0), m.get("laggard_window_refresh_seconds_sum", 0.0)
    return {"ops_per_s": num_ops / wall, "num_ops": num_ops, "wall_s": wall, "num_batches": len(lat),
            "p50_s": lat[len(lat) // 2], "p99_s": lat[int(len(lat) * 0.99)], "rss_mib": rss_kib / 1024,
            "child_rss_mib": child_rss_kib / 1024,
            "refresh_mean_s": sum_ref / n_ref if n_ref else None, "num_refreshes": n_ref,
            "last_step": detail.get("last_step"),
            "window": detail.get("window"), "slowdown": detail.get("slowdown")}


def _in_process(tmp: Path) -> dict:
    """Baseline: the same batches through Collector.ingest, no HTTP; and one 1,024-worker window refresh."""
    from laggard.monitor.config import MonitorConfig
    from laggard.monitor.service import Collector
    from laggard.monitor.store import Store
    from laggard.wire.batch import encode_batch

    meta = meta_json()
    col = Collector(Store(tmp / "inproc.db"), MonitorConfig())
    bodies = [encode_batch(rank_table(r, b * STEPS_PER_BATCH, STEPS_PER_BATCH), job_id="bench", rank=r, seq=b, meta=meta)
              for b in range(2) for r in range(NUM_RANKS)]
    t0 = time.perf_counter()
    n = sum(col.ingest(body)["accepted"] for body in bodies)
    ingest_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ran = col.refresh("bench")
    refresh_s = time.perf_counter() - t0
    win = col.windows["bench"]
    col.stop()
    return {"ops_per_s": n / ingest_s, "refresh_s": refresh_s, "ran": ran,
            "window_ops": win.result.doc["num_ops"] if win.result else None}


def _tracer_cost(url: str | None, tmp: Path, n_ops: int = 200_000) -> float:
    """Training-thread CPU ns per op, first op to close() (``bench_tracer.tracer_cost``)."""
    sys.path.insert(0, str(HERE))
    from bench_tracer import tracer_cost

    return tracer_cost(url, tmp / ("on" if url else "off"), n_ops)["thread_ns"]


def _tracer(tmp: Path) -> dict:
    from tests.monitor_helpers import Server

    srv = Server(str(tmp / "tracer.db"), tmp, token=TOKEN).start()
    try:
        on, off = [], []
        for _ in range(3):  # interleaved rounds, median of each (shared machine)
            off.append(_tracer_cost(None, tmp))
            on.append(_tracer_cost(srv.url, tmp))
    finally:
        srv.stop()
    return {"on_ns": statistics.median(on), "off_ns": statistics.median(off)}


def _detection() -> dict:
    import logging

    from laggard.monitor.evaluate import NoisyJob, feed_windows, make_job

    logging.disable(logging.WARNING)
    cfg = None  # the collector's defaults (laggard.monitor.config, laggard.monitor.alerts.default_rules)
    delays: list[float] = []
    wrong = 0
    for seed in range(NUM_SEEDS):
        rank = seed % 8
        run = feed_windows(make_job(NoisyJob(seed=seed, steps=80, slow_rank=rank, start_step=30)), cfg)
        first = run.first_worker_alert(rank)
        delays.append(float("inf") if first is None else first - 30)
        wrong += sum(1 for _, _, d in run.alerts if "rank" in d and d["rank"] != rank)
    clean_alerts = []
    t0 = time.perf_counter()
    for seed in range(NUM_SEEDS):
        run = feed_windows(make_job(NoisyJob(seed=1000 + seed, steps=CLEAN_STEPS)), cfg)
        clean_alerts += [(seed, s, rule) for s, rule, _ in run.alerts]
    logging.disable(logging.NOTSET)
    d = sorted(delays)
    return {"median": statistics.median(d), "p90": d[int(0.9 * (len(d) - 1) + 0.5)], "delays": d, "wrong": wrong,
            "clean_alerts": clean_alerts, "clean_s": time.perf_counter() - t0}


def run() -> list[dict]:
    sys.path.insert(0, str(ROOT))
    tmp = Path(tempfile.mkdtemp(prefix="laggard-bench-monitor-"))
    print(f"  ingest: {NUM_RANKS} ranks for {DURATION_S:.0f} s ...", file=sys.stderr, flush=True)
    ing = _ingest(tmp)
    print("  in-process baseline and 1,024-worker refresh ...", file=sys.stderr, flush=True)
    base = _in_process(tmp)
    print("  tracer per-op cost, streaming on vs off ...", file=sys.stderr, flush=True)
    tr = _tracer(tmp)
    print(f"  detection: {NUM_SEEDS} seeds, clean {NUM_SEEDS} x {CLEAN_STEPS} steps ...", file=sys.stderr, flush=True)
    det = _detection()
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return [
        {"name": f"monitor sustained ingest, {NUM_RANKS} ranks over HTTP", "value": ing["ops_per_s"], "unit": "ops/s",
         "baseline": "the same batches through Collector.ingest in-process (no HTTP)", "baseline_value": base["ops_per_s"],
         "target": ">= 200000 ops/s", "ok": ing["ops_per_s"] >= 200_000, "detail": ing},
        {"name": "monitor ingest latency p99 (client side, per batch of ~1,000 ops)", "value": ing["p99_s"], "unit": "s",
         "detail": {"p50_s": ing["p50_s"]}},
        {"name": "monitor collector peak RSS", "value": ing["rss_mib"], "unit": "MiB",
         "detail": {"analysis_process_peak_rss_mib": ing["child_rss_mib"]}},
        {"name": "monitor refresh of the 1,024-worker window analysis", "value": base["refresh_s"], "unit": "s",
         "target": "< 0.75 s", "ok": base["refresh_s"] < 0.75,
         "detail": {"window_ops": base["window_ops"], "mean_refresh_in_service_s": ing["refresh_mean_s"],
                    "num_refreshes_in_service": ing["num_refreshes"]}},
        {"name": "tracer per-op cost with streaming on (training thread CPU)", "value": tr["on_ns"], "unit": "ns",
         "baseline": "streaming off", "baseline_value": tr["off_ns"]},
        {"name": "monitor detection delay of a 1.10x worker, median over seeds", "value": det["median"], "unit": "steps",
         "target": "<= 20 steps", "ok": det["median"] <= 20,
         "detail": {"p90_steps": det["p90"], "delays": det["delays"], "alerts_naming_another_rank": det["wrong"]}},
        {"name": f"monitor alerts on clean heavy-tailed jobs ({NUM_SEEDS} x {CLEAN_STEPS} steps)",
         "value": len(det["clean_alerts"]), "unit": "alerts", "target": "0", "ok": not det["clean_alerts"],
         "detail": {"alerts": det["clean_alerts"][:20], "wall_s": det["clean_s"]}},
    ]


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "generator":
    sys.path.insert(0, str(ROOT))
    lo, hi = (int(x) for x in sys.argv[3].split(":"))
    generator(sys.argv[2], list(range(lo, hi)), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
