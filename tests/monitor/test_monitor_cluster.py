"""Three collectors on one real PostgreSQL database act as one (``laggard.monitor.cluster``): two live
4-rank gloo jobs post through different collectors; the collector analyzing one of them is SIGKILLed
mid-run; its ranks fail over to the next address they were given, another collector takes the job's
lease and analyses it, and when the job then hangs its verdict and alert come from the new owner
within 60 s of the stop. No job's metrics are exported by two collectors.

The ranks are tests/monitor/test_monitor_hang.py run as a script (the same traced gloo loop: one rank
blocks on the host before its all-reduce at a given step)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")
pytest.importorskip("torch")
pytest.importorskip("psycopg", reason="psycopg is not installed")

from laggard.collectives.launch import free_port  # noqa: E402
from tests.monitor_helpers import Postgres, Server, stopped_at, until  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RANKS = ROOT / "tests" / "monitor" / "test_monitor_hang.py"
WORLD, STUCK = 4, 2  # (as in test_monitor_hang.py)
FAILOVER_WITHIN_S = 30  # the kill to the next window analyzed by another collector
VERDICT_WITHIN_S = 60  # the stop to the verdict and alert on the API

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def pg_server(tmp_path_factory):
    server = Postgres(tmp_path_factory.mktemp("pg"))
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


@pytest.fixture
def pg(pg_server, request):  # noqa: ANN001, ANN201
    """A new database on the server, one per test."""
    import psycopg

    name = re.sub(r"\W", "", request.node.name)[:40].lower()
    with psycopg.connect(pg_server, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return pg_server.rsplit("/", 1)[0] + "/" + name


def _job(tmp: Path, url: str, job: str, stuck_step: int) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    port = free_port()
    return [subprocess.Popen([sys.executable, str(RANKS), str(r), str(WORLD), str(port), url, job, str(tmp / job),
                              str(stuck_step), "1", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env) for r in range(WORLD)]


def _owner(srv: Server, job: str) -> str | None:
    code, d = srv.request("GET", f"/api/v1/jobs/{job}")
    return (d.get("analyzed_by") or {}).get("collector") if code == 200 else None




def _exported(srv: Server) -> set[str]:
    """The jobs whose slowdown this collector exports."""
    import urllib.request

    req = urllib.request.Request(srv.url + "/metrics", headers={"Authorization": f"Bearer {srv.token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    return set(re.findall(r'^laggard_job_slowdown\{job="([^"]+)"\}', text, re.M))


def test_three_collectors_one_killed_its_job_analyzed_and_its_hang_decided_by_another(pg, tmp_path):
    hang = ["--hang-after-s", "3", "--hang-collect-s", "8"]
    a, b, c = (Server(pg, tmp_path, extra=hang).start() for _ in range(3))
    ids = {}
    procs: list[subprocess.Popen] = []
    try:
        # "moved" fails over from a to b; "stays" posts to c throughout. moved's rank 2 stops at step 500
        procs += _job(tmp_path, f"{a.url},{b.url}", "moved", 500)
        procs += _job(tmp_path, f"{c.url},{b.url}", "stays", 10**6)
        ids["a"] = until(lambda: _owner(a, "moved"), 60, "moved analyzed by the collector it posts to")
        ids["c"] = until(lambda: _owner(c, "stays"), 60, "stays analyzed by the collector it posts to")
        assert ids["a"] != ids["c"] and ids["a"].endswith(f":{a.port}") and ids["c"].endswith(f":{c.port}")
        until(lambda: a.request("GET", "/api/v1/jobs/moved/analysis")[0] == 200, 60, "a first window of moved")
        # b serves both jobs and says who analyses them (from its next lease round)
        until(lambda: _owner(b, "stays") == ids["c"], 10, "b naming c as the analyzer of stays")
        a.stop(signal.SIGKILL)
        killed_s = time.monotonic()

        def analyzed_elsewhere() -> bool:
            owner = _owner(b, "moved")
            return owner is not None and owner != ids["a"] and b.request(
                "GET", "/api/v1/jobs/moved/analysis")[0] == 200 and owner.endswith(f":{b.port}")

        until(analyzed_elsewhere, FAILOVER_WITHIN_S + 10, "moved analyzed by b after a's kill")
        failover_s = time.monotonic() - killed_s
        print(f"\nfailover: job moved analyzed by b {failover_s:.1f} s after a was killed")
        assert failover_s <= FAILOVER_WITHIN_S, failover_s

        stop_s = stopped_at(procs[:WORLD], STUCK, 240)  # moved's rank 2 stops after the failover

        def verdict() -> dict | None:
            code, doc = b.request("GET", "/api/v1/jobs/moved/hang")
            if code != 200:
                return None
            _, alerts = b.request("GET", "/api/v1/alerts?job=moved")
            return doc if any(x["detail"].get("kind") == "hang" and "verdict" in x["detail"] for x in alerts) else None

        doc = until(verdict, max(1.0, stop_s + VERDICT_WITHIN_S - time.time()), "moved's hang verdict and alert")
        print(f"verdict and alert {time.time() - stop_s:.1f} s after the stop")
        assert doc["verdict"] == "hang" and doc["culprit_ranks"] == [STUCK], doc
        # each job's metrics from one collector only
        assert "moved" in _exported(b) and "moved" not in _exported(c)
        assert "stays" in _exported(c) and "stays" not in _exported(b)
        # the stays job never moved: c analyzed it all along
        assert _owner(c, "stays") == ids["c"] and _owner(b, "stays") == ids["c"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for s in (a, b, c):
            s.stop()


def test_a_collector_with_other_lease_settings_refuses_to_start(pg, tmp_path):
    a = Server(pg, tmp_path).start()
    try:
        r = subprocess.run([*Server(pg, tmp_path, extra=["--window-steps", "8"]).command()], capture_output=True,
                           text=True, timeout=60, env={k: v for k, v in os.environ.items() if k != "LAGGARD_TOKEN"})
        assert r.returncode == 2, (r.returncode, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "other settings" in lines[0] and "window_steps=6 there, 8 here" in lines[0], lines
    finally:
        a.stop()
