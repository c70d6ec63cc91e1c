"""Tracers given two collectors' addresses (``monitor_url="http://a,http://b"``) fail over when the one
they post to is killed: every batch ends up stored once in the database the two share (real processes;
the ground truth is the tracers' own Parquet trace)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from laggard.collectives.launch import free_port  # noqa: E402
from laggard.io import load_job  # noqa: E402
from laggard.optable.ops import to_numpy  # noqa: E402
from laggard.wire.client import Client, CollectorDown  # noqa: E402
from tests.monitor_helpers import TOKEN, Server  # noqa: E402

JOB = Path(__file__).parents[1] / "monitor_tracer_job.py"


class _Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"port": self.server.server_address[1]}).encode())

    def log_message(self, *args: object) -> None:
        pass


def test_the_client_goes_to_the_next_address_and_stays_there():
    dead = free_port()  # nothing listens there
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        live = srv.server_address[1]
        c = Client(f"http://127.0.0.1:{dead}, http://127.0.0.1:{live}", None, timeout_s=2)
        assert c.request("GET", "/x") == {"port": live}
        assert c.url == f"http://127.0.0.1:{live}"  # the next request starts there
        assert c.request("GET", "/x") == {"port": live}
        c.close()
    finally:
        srv.shutdown()
        srv.server_close()
    c = Client(f"http://127.0.0.1:{dead},http://127.0.0.1:{live}", None, timeout_s=2)
    with pytest.raises(CollectorDown) as e:  # both down: the error names both
        c.request("GET", "/x")
    assert str(dead) in str(e.value) and str(live) in str(e.value)


def test_tracers_fail_over_to_the_second_collector_and_nothing_is_lost(tmp_path):
    db = str(tmp_path / "m.db")
    a, b = Server(db, tmp_path).start(), Server(db, tmp_path).start()
    steps = 150  # ~40 ms a step: ~6 s of streaming per rank
    procs = [subprocess.Popen([sys.executable, str(JOB), f"{a.url},{b.url}", TOKEN, str(tmp_path / "trace"), str(r),
                               "2", str(steps)], stdout=subprocess.PIPE, text=True) for r in range(2)]
    try:
        a.wait_for(lambda js: js and js[0]["num_ops"] > 0, "/api/v1/jobs", timeout_s=60)
        a.stop(signal.SIGKILL)  # mid-stream, no clean shutdown
        b.wait_for(lambda js: js and js[0]["num_ops"] > 0, "/api/v1/jobs", timeout_s=60)  # they went on at b
        outs = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        b.stop()
    assert all(p.returncode == 0 for p in procs)
    assert all(o["left"] == 0 and o["dropped"] == 0 for o in outs), outs
    # a collector started afterwards on the database reads every stored batch back
    c = Server(db, tmp_path).start()
    try:
        trace = load_job(tmp_path / "trace")
        rank = to_numpy(trace.table.column("rank"))
        detail = c.wait_for(lambda d: True, "/api/v1/jobs/faultjob")
        assert {r["rank"]: r["num_ops"] for r in detail["ranks"]} == {r: int((rank == r).sum()) for r in (0, 1)}
        assert detail["num_ops"] == trace.num_ops == sum(o["recorded"] for o in outs)
    finally:
        c.stop()
