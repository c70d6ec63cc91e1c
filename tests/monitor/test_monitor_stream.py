"""Tracers streaming into a collector that is killed mid-stream and restarted (real processes)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from laggard.io import load_job  # noqa: E402
from laggard.optable.ops import to_numpy  # noqa: E402
from tests.monitor_helpers import TOKEN, Server  # noqa: E402

JOB = Path(__file__).parents[1] / "monitor_tracer_job.py"


def test_collector_killed_and_restarted_loses_nothing(tmp_path):
    srv = Server(str(tmp_path / "m.db"), tmp_path).start()
    steps = 120  # ~40 ms a step: ~5 s of streaming per rank
    procs = [subprocess.Popen([sys.executable, str(JOB), srv.url, TOKEN, str(tmp_path / "trace"), str(r), "2",
                               str(steps)], stdout=subprocess.PIPE, text=True) for r in range(2)]
    try:
        srv.wait_for(lambda js: js and js[0]["num_ops"] > 0, "/api/v1/jobs", timeout_s=60)
        srv.stop(signal.SIGKILL)  # mid-stream, no clean shutdown
        time.sleep(1.5)  # the tracers spool meanwhile
        srv.start()
        outs = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    try:
        assert all(p.returncode == 0 for p in procs)
        assert sum(o["spooled"] for o in outs) > 0, f"the kill came too late to test anything: {outs}"
        assert all(o["left"] == 0 and o["dropped"] == 0 for o in outs), outs
        # ground truth: the tracers' own Parquet trace on disk
        trace = load_job(tmp_path / "trace")
        rank = to_numpy(trace.table.column("rank"))
        detail = srv.wait_for(lambda d: True, "/api/v1/jobs/faultjob")
        per_rank = {r["rank"]: r["num_ops"] for r in detail["ranks"]}
        assert per_rank == {r: int((rank == r).sum()) for r in (0, 1)}
        assert detail["num_ops"] == trace.num_ops == sum(o["recorded"] for o in outs)
    finally:
        srv.stop()


def test_collector_asks_a_quiet_job_for_a_flight_recorder_dump(tmp_path):
    """POST /jobs/{id}/dump -> the stream thread sees it in a heartbeat answer (while it has nothing
    to send) and, used without a tracer (no report function), creates the Flight Recorder request
    file in its trace directory (laggard.tracer.flight dumps)."""
    import numpy as np

    from laggard.optable.ops import make_table
    from laggard.tracer import stream
    from laggard.tracer.flight import REQUEST_FILE

    srv = Server(str(tmp_path / "m.db"), tmp_path).start()
    trace = tmp_path / "trace"
    trace.mkdir()
    s = None
    try:
        s = stream.MonitorStream(srv.url, TOKEN, job_id="dumpjob", rank=0, meta={"dp_size": 1},
                                 spool_dir=trace / "monitor-spool", config=stream.StreamConfig(heartbeat_s=0.3))
        ops = make_table({"rank": np.zeros(2, np.int32), "step": np.array([0, 1]), "name": ["fwd", "fwd"],
                          "kind": ["compute", "compute"], "start_ns": np.array([0, 10**6]),
                          "dur_ns": np.array([10**5, 10**5])})
        s.submit(ops)
        srv.wait_for(lambda js: js and js[0]["num_ops"] == 2, "/api/v1/jobs", timeout_s=30)
        time.sleep(1.0)  # several idle polls: no request yet, no file
        assert not (trace / REQUEST_FILE).exists() and s.num_dump_requests == 0
        code, ans = srv.request("POST", "/api/v1/jobs/dumpjob/dump")
        assert code == 200 and ans["dump_request"] == 1
        deadline = time.monotonic() + 20
        while not (trace / REQUEST_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (trace / REQUEST_FILE).exists() and s.num_dump_requests == 1
        assert srv.request("POST", "/api/v1/jobs/nojob/dump")[0] == 404
    finally:
        if s is not None:
            s.close(timeout_s=2)
        srv.stop()
