"""The collector's HTTP API against a real server process, on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from laggard.groundtruth.synth import SynthConfig, synthesize  # noqa: E402
from laggard.monitor.push import step_batches  # noqa: E402
from laggard.wire.batch import CONTENT_TYPE, FRAME_MAGIC, encode_batch  # noqa: E402
from tests.monitor_helpers import TOKEN, Postgres, Server  # noqa: E402

STEPS = 8


@pytest.fixture(scope="module")
def job():
    return synthesize(SynthConfig(dp=2, pp=2, microbatches=4, steps=STEPS, seed=3,
                                  name="apijob"))


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def db(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "sqlite":
        yield str(tmp / "monitor.db"), tmp
        return
    pg = Postgres(tmp)
    url = pg.start()
    try:
        yield url, tmp
    finally:
        pg.stop()


def batches(job, job_id="apijob"):
    meta = job.meta.to_json()
    seqs: dict[int, int] = {}
    out = []
    for _, r, t in step_batches(job):
        seq = seqs.get(r, 0)
        seqs[r] = seq + 1
        out.append(encode_batch(t, job_id=job_id, rank=r, seq=seq, meta=meta))
    return out


def test_api_suite(db, job):
    url, tmp = db
    srv = Server(url, tmp, extra=["--window-steps", "4"]).start()
    try:
        # auth: everything but /healthz
        assert srv.request("GET", "/healthz", token=None)[0] == 200
        for path in ("/api/v1/jobs", "/metrics", "/", "/api/v1/rules"):
            assert srv.request("GET", path, token=None)[0] == 401, path
        assert srv.request("GET", "/api/v1/jobs", token="wrong-token-xxxxxxxxxxxxx")[0] == 401
        # oversized payload: 413 with a reason, from the declared length and from the stream
        status, body = srv.post_declared(33 * 2**20, b"x" * 1000)
        assert status == 413 and "limit" in body["detail"], body
        status, body = srv.post_declared(0, b"x" * (33 * 2**20), chunked=True)
        assert status == 413 and "limit" in body["detail"], body
        # malformed bodies: 4xx with a reason, never a 500
        bodies = {
            "not arrow": b"hello",
            "empty": b"",
            "no metadata": _ipc(pa.table({"rank": [0], "step": [0]})),
            "missing columns": encode_batch(pa.table({"rank": pa.array([0], pa.int32()), "step": [0]}),
                                            job_id="bad", rank=0, seq=0, meta=job.meta),
            "wrong rank": encode_batch(job.table.slice(0, 5), job_id="bad", rank=7, seq=0, meta=job.meta),
            "bad job id": encode_batch(job.table.slice(0, 5), job_id="../x", rank=0, seq=0, meta=job.meta),
            "LZ4 frame of an absurd size": FRAME_MAGIC + (1 << 40).to_bytes(8, "big") + b"x" * 64,
            "LZ4 frame of garbage": FRAME_MAGIC + (1000).to_bytes(8, "big") + b"x" * 64,
        }
        for what, body in bodies.items():
            status, ans = srv.request("POST", "/api/v1/ops", body, content_type=CONTENT_TYPE)
            assert 400 <= status < 500, (what, status, ans)
            assert isinstance(ans, dict) and ans["detail"], what
        assert srv.request("PUT", "/api/v1/rules", b"{not json")[0] == 400
        assert srv.request("PUT", "/api/v1/rules", json.dumps([{"id": "x", "type": "nope"}]).encode())[0] == 400
        assert srv.request("PUT", "/api/v1/rules", json.dumps({"id": "x"}).encode())[0] == 400
        assert srv.request("PATCH", "/api/v1/jobs/apijob", json.dumps({"tracing": "yes"}).encode())[0] == 422
        assert srv.request("GET", "/api/v1/jobs/nosuchjob")[0] == 404
        # ingest: every batch, then all of them again (retries) and the first one last (reordering)
        bs = batches(job)
        accepted = 0
        for b in bs:
            status, ans = srv.request("POST", "/api/v1/ops", b, content_type=CONTENT_TYPE)
            assert status == 200, ans
            accepted += ans["accepted"]
        assert accepted == job.num_ops
        for b in [*bs[1:], bs[0]]:
            status, ans = srv.request("POST", "/api/v1/ops", b, content_type=CONTENT_TYPE)
            assert status == 200 and ans == {"accepted": 0, "duplicate": True, "tracing": True, "dump_request": 0}
        detail = srv.wait_for(lambda d: d["window"] is not None and d["window"][1] == STEPS - 2, "/api/v1/jobs/apijob")
        assert detail["num_ops"] == job.num_ops and detail["num_ranks"] == 4
        status, metrics = srv.request("GET", "/metrics")
        assert f"laggard_ingest_ops_total {float(job.num_ops)}" in metrics
        assert "laggard_job_slowdown{job=\"apijob\"}" in metrics and "laggard_ingest_latency_seconds_bucket" in metrics
        # rules and tracing changed while running, kept across the restart
        rules = [{"id": "slow", "type": "job_slowdown", "threshold": 1.2, "windows": 2}]
        assert srv.request("PUT", "/api/v1/rules", json.dumps(rules).encode())[0] == 200
        before = srv.request("GET", "/api/v1/jobs/apijob/analysis")[1]
    finally:
        srv.stop()
    srv = Server(url, tmp, extra=["--window-steps", "4"]).start()
    try:
        detail = srv.wait_for(lambda d: d["window"] is not None, "/api/v1/jobs/apijob")
        assert detail["num_ops"] == job.num_ops
        assert srv.request("GET", "/api/v1/rules")[1][0]["threshold"] == 1.2
        after = srv.request("GET", "/api/v1/jobs/apijob/analysis")[1]
        assert_same_doc(after, before)
        for b in bs:  # still idempotent after the restart
            assert srv.request("POST", "/api/v1/ops", b, content_type=CONTENT_TYPE)[1]["accepted"] == 0
        assert srv.request("PATCH", "/api/v1/jobs/apijob", json.dumps({"tracing": False}).encode())[0] == 200
        more = encode_batch(job.table.slice(0, 3), job_id="apijob", rank=0, seq=999, meta=None)
        assert srv.request("POST", "/api/v1/ops", more, content_type=CONTENT_TYPE)[1]["tracing"] is False
    finally:
        srv.stop()


def test_analysis_is_laggard_analyze_json(tmp_path, job):
    """GET .../analysis equals `laggard analyze --json` run by the CLI on the window's ops."""
    from laggard.optable.ops import Job, to_numpy, write_native

    srv = Server(str(tmp_path / "m.db"), tmp_path, extra=["--window-steps", "4"]).start()
    try:
        for b in batches(job, "cmpjob"):
            assert srv.request("POST", "/api/v1/ops", b, content_type=CONTENT_TYPE)[0] == 200
        d = srv.wait_for(lambda d: d["window"] == [STEPS - 5, STEPS - 2], "/api/v1/jobs/cmpjob")
        doc = srv.request("GET", "/api/v1/jobs/cmpjob/analysis")[1]
    finally:
        srv.stop()
    lo, hi = d["window"]
    step = to_numpy(job.table.column("step"))
    write_native(Job(table=job.table.filter(pa.array((step >= lo) & (step <= hi))), meta=job.meta), tmp_path / "win")
    out = tmp_path / "a.json"
    r = subprocess.run([sys.executable, "-m", "laggard.cli.base", "analyze", str(tmp_path / "win"),
                        "--json", str(out), "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert_same_doc(doc, json.loads(out.read_text()))


def assert_same_doc(a, b, where="$"):
    """Equal documents; floats to 1e-12 relative (the window's ops are summed in another order)."""
    if isinstance(a, float) or isinstance(b, float):
        assert b == pytest.approx(a, rel=1e-12, abs=1e-15), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for k in a:
            assert_same_doc(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_doc(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def test_token_created_once_with_mode_0600(tmp_path):
    srv = Server(str(tmp_path / "t.db"), tmp_path, token=None).start()
    try:
        first = srv.proc.stdout.readline().decode().strip()
    finally:
        srv.stop()
    assert first.startswith("token: ")
    tok = first.removeprefix("token: ")
    path = tmp_path / "t.db.token"
    assert path.read_text().strip() == tok and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    srv2 = Server(str(tmp_path / "t.db"), tmp_path, token=None).start()
    try:
        assert srv2.request("GET", "/api/v1/jobs", token=tok)[0] == 200
        assert srv2.request("GET", "/api/v1/jobs")[0] == 401  # the test token is not this server's
    finally:
        srv2.stop()
        out = srv2_out = srv2.proc  # noqa: F841
    assert "token:" not in (out or "")


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def test_server_bad_flags(tmp_path):
    r = subprocess.run([sys.executable, "-m", "laggard.cli.base", "monitor", "serve", "--db", str(tmp_path / "x.db"),
                        "--token", "short"], capture_output=True, text=True)
    assert r.returncode == 2 and "at least 16" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "laggard.cli.base", "monitor", "push", str(tmp_path / "none"),
                        "--token", TOKEN], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_push_cli_streams_a_published_trace(tmp_path):
    """`laggard monitor push` of the OSDI '25 AR trace (one slowed worker): the collector's window names it."""
    from laggard.io import load_job

    trace = Path(__file__).parents[1] / "data" / "ndtimeline" / "trace-AR.parquet"
    job = load_job(trace)
    srv = Server(str(tmp_path / "p.db"), tmp_path).start()
    try:
        r = subprocess.run([sys.executable, "-m", "laggard.cli.base", "monitor", "push", str(trace), "--url", srv.url,
                            "--token", TOKEN, "--speed", "0", "--job", "ar"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert f"pushed {job.num_ops:,} ops" in r.stdout and "pushing ar" not in r.stderr  # piped: no progress
        d = srv.wait_for(lambda d: d["window"] is not None, "/api/v1/jobs/ar", timeout_s=120)
        r2 = subprocess.run([sys.executable, "-m", "laggard.cli.base", "monitor", "push", str(trace), "--url", srv.url,
                             "--token", TOKEN, "--speed", "0", "--job", "ar"], capture_output=True, text=True,
                            env={**os.environ, "TTY_COMPATIBLE": "1"})
        assert "pushed 0 ops" in r2.stdout  # all duplicates
        assert "pushing ar" in r2.stderr and "steps" in r2.stderr  # on a terminal: the progress display
        bad = subprocess.run([sys.executable, "-m", "laggard.cli.base", "monitor", "push", str(trace), "--url", srv.url,
                              "--token", "wrong-token-0123456789", "--speed", "0"], capture_output=True, text=True)
        assert bad.returncode == 2 and "401" in bad.stderr and "Traceback" not in bad.stderr
    finally:
        srv.stop()
    assert d["num_ops"] == job.num_ops
    # the published analysis of this trace names one slowed worker; the window's worst is the same one
    from laggard.whatif.core import analyze

    full = analyze(job)
    assert d["top_current"][0]["rank"] == full.by_worker[0]["rank"]


def _children(pid: int) -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.add(int(d.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc (Linux)")
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_stopped_collector_leaves_no_process_behind(job, tmp_path, sig):
    """The analysis child (a process pool's worker) exits with the collector, even one killed
    outright (before: every killed or stopped collector left its analysis process running)."""
    import signal
    import time

    srv = Server(str(tmp_path / "m.db"), tmp_path, extra=["--window-steps", "4"]).start()
    try:
        for b in batches(job):
            assert srv.request("POST", "/api/v1/ops", b, content_type=CONTENT_TYPE)[0] == 200
        srv.wait_for(lambda d: d["window"] is not None, "/api/v1/jobs/apijob")
        kids = _children(srv.proc.pid)
        assert kids, "the analysis ran in no child process"
    finally:
        srv.stop(getattr(signal, sig))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(Path(f"/proc/{k}").exists() for k in kids):
        time.sleep(0.2)
    alive = [k for k in kids if Path(f"/proc/{k}").exists()
             and (Path(f"/proc/{k}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z")]
    assert not alive, f"left running after {sig}: {alive}"
