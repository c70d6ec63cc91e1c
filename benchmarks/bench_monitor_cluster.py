"""Several collectors on one PostgreSQL database (``laggard.monitor.cluster``): how many 1,024-rank jobs
1, 2 and 3 collectors keep analyzed on this machine (bench_monitor's jobs-held run, each job posting to
one collector with the others as its failover addresses), and the failover time: from SIGKILL of the
collector analyzing a job to the next window of that job served by another.

The baseline is one collector on the same PostgreSQL server, in the same run. On 2 shared cores the
collectors compete for the same CPUs, so more collectors add failover, not capacity, here; on a
platform each runs on its own host.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RELAY_RANKS = 32  # a relay per 32 ranks: the setting bench_monitor's headline figure uses
FAILOVER_ROUNDS = 25  # flushes of the failover run's jobs (3 steps of 1 s each): long enough to outlive a lease


def _bench_monitor():  # noqa: ANN202 - the module
    sys.path.insert(0, str(HERE))
    import bench_monitor

    return bench_monitor


def _failover(tmp: Path, db: str) -> dict:
    """Three collectors, two jobs (one posting to each of the first two, the others as failover); the
    first collector is killed once it served a window of its job; the seconds until another serves
    a window of that job as its analyzer."""
    from tests.monitor_helpers import Server  # noqa: PLC0415

    bm = _bench_monitor()
    servers = [Server(db, tmp, token=bm.TOKEN, extra=["--analysis-workers", "1"]).start() for _ in range(3)]
    gens = []
    try:
        for i in range(2):
            urls = ",".join(servers[(i + k) % 3].url for k in range(3))
            gens.append(subprocess.Popen([sys.executable, str(HERE / "bench_monitor.py"), "job-generator", urls,
                                          f"fail{i}", str(i + 1), str(FAILOVER_ROUNDS), "4",
                                          str(tmp / f"fail{i}.json"), str(RELAY_RANKS), "0"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for g in gens:
            if g.stdout.readline().strip() != "ready":
                raise RuntimeError("a job generator did not start")
        t0 = time.time() + 0.5
        for g in gens:
            g.stdin.write(f"{t0}\n")
            g.stdin.flush()

        def window(srv: Server) -> list[int] | None:  # fail0's window as served by its analyzer
            code, d = srv.request("GET", "/api/v1/jobs/fail0")
            return d["window"] if code == 200 and d.get("window") and (d.get("analyzed_by") or {}).get("this") \
                else None

        deadline = time.time() + 120
        while window(servers[0]) is None and time.time() < deadline:
            time.sleep(0.25)
        before = window(servers[0])
        if before is None:
            raise RuntimeError("the first collector never analyzed its job")
        servers[0].stop(signal.SIGKILL)
        killed = time.monotonic()
        after, by = None, None
        while time.monotonic() - killed < 90 and after is None:
            for k in (1, 2):
                w = window(servers[k])
                if w is not None:
                    after, by = w, k
            time.sleep(0.25)
        took = time.monotonic() - killed if after is not None else None
    finally:
        for g in gens:
            if g.poll() is None:
                g.kill()
        for s in servers:
            s.stop()
    return {"failover_s": took, "window_before": before, "window_after": after, "taken_by": by}


def run() -> list[dict]:
    sys.path.insert(0, str(ROOT))
    import psycopg

    from tests.monitor_helpers import Postgres  # noqa: PLC0415

    bm = _bench_monitor()
    tmp = Path(tempfile.mkdtemp(prefix="laggard-bench-cluster-"))
    pg = Postgres(tmp)
    try:
        url = pg.start()
    except BaseException as e:  # pytest.skip's exception: PostgreSQL is not installed
        raise RuntimeError(f"no PostgreSQL for this benchmark: {e}") from None
    made = iter(range(10_000))

    def db_of(name: str) -> str:
        db = f"{name}_{next(made)}".lower()
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {db}")
        return url.rsplit("/", 1)[0] + "/" + db

    try:
        held = {}
        for k in (1, 2, 3):
            print(f"  jobs held by {k} collector(s) on one PostgreSQL ...", file=sys.stderr, flush=True)
            held[k] = bm._many_jobs(tmp, RELAY_RANKS, db_of=db_of, collectors=k)
        print("  failover: the collector analyzing a job SIGKILLed ...", file=sys.stderr, flush=True)
        fo = _failover(tmp, db_of("failover"))
    finally:
        pg.stop()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    how = (f"bench_monitor's jobs-held run ({bm.NUM_RANKS} ranks a job at 1 step/s, a relay per {RELAY_RANKS} "
           f"ranks, {bm.JOBS_ANALYSIS_WORKERS} analysis processes per collector) with job i posting to collector "
           "i mod k; a window counts when the collector holding the job's lease serves it")
    out = [{"name": f"monitor jobs kept analyzed within {bm.FRESH_STEPS} steps by {k} collectors on one PostgreSQL",
            "value": held[k]["max_jobs"], "unit": "jobs",
            "baseline": "1 collector on the same PostgreSQL, same run", "baseline_value": held[1]["max_jobs"],
            "detail": {"how": how, "runs": held[k]["runs"]}} for k in (2, 3)]
    out.insert(0, {"name": f"monitor jobs kept analyzed within {bm.FRESH_STEPS} steps by 1 collector on PostgreSQL",
                   "value": held[1]["max_jobs"], "unit": "jobs", "detail": {"how": how, "runs": held[1]["runs"]}})
    out.append({"name": "monitor failover: SIGKILL of a job's collector to its next window analyzed by another",
                "value": fo["failover_s"] if fo["failover_s"] is not None else float("inf"), "unit": "s",
                "target": "<= 30 s", "ok": fo["failover_s"] is not None and fo["failover_s"] <= 30,
                "detail": {**fo, "lease_s": 15.0, "renew_s": 3.0,
                           "how": "3 collectors, 2 jobs of 1,024 ranks (relays of 32); json: " + json.dumps(
                               {"rounds": FAILOVER_ROUNDS})}})
    return out
