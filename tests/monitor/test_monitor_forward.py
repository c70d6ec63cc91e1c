"""A job's requests answered by the collector that holds it, whichever collector they reach
(``laggard.monitor.forward``): real collector processes on one database, a job's heartbeats, dump
request and hang reports sent to the collector that does not hold it.

- Collector a holds the job (its ranks' first heartbeats came to a). Everything asked of b about
  the job is a's answer: the detail, a dump request (a's request number, seen in the heartbeat
  answers b gives), the ranks' hang reports (a's verdict has all four), the verdict.
- Killed, a cannot answer: b answers from what it has, takes the lease, and serves a's verdict,
  kept in the database.
- A collector started with another token: the holder refuses the credentials it passes on, and the
  caller is told why (502), not a bare 401.
- A holder that stops answering (stopped, not killed: its socket still takes connections) does not
  take the other collector down with it: the requests waiting on it hold threads of their own, so
  b's health check and job list answer at once, and the requests past those few are answered by b
  from what it has.
- PostgreSQL down: both collectors answer ingest 503 (a tracer spools: ``wire.client`` treats 5xx
  as down) and nothing is lost once it is back: the batches sent again are stored and the holder's
  window has them all.
"""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from laggard.groundtruth.synth import SynthConfig, synthesize  # noqa: E402
from laggard.monitor.push import step_batches  # noqa: E402
from laggard.wire.batch import CONTENT_TYPE, encode_batch  # noqa: E402
from tests.hang.test_hang import _state_only  # noqa: E402
from tests.monitor_helpers import Postgres, Server, until  # noqa: E402

pytestmark = pytest.mark.timeout(240)
WORLD = 4
HANG = ["--hang-after-s", "600", "--hang-collect-s", "60"]  # verdicts only on request, within the test


def _meta(job: str) -> dict:
    return {"name": job, "dp_size": WORLD, "pp_size": 1}


def _beat(srv: Server, job: str, rank: int) -> tuple[int, dict]:
    body = {"rank": rank, "state": {"progress": 10, "step": 4, "world_size": WORLD}, "meta": _meta(job)}
    return srv.request("POST", f"/api/v1/jobs/{job}/heartbeat", json.dumps(body).encode())


def _report(rank: int) -> bytes:
    return json.dumps(_state_only(rank, WORLD, 4 if rank == 2 else 5, pending=rank != 2,
                                  where="compute" if rank == 2 else "collective")).encode()


def _holder(srv: Server, job: str) -> str | None:
    code, d = srv.request("GET", f"/api/v1/jobs/{job}")
    return (d.get("analyzed_by") or {}).get("url") if code == 200 else None


def test_a_jobs_requests_to_another_collector_get_its_holders_answers(tmp_path):
    db = str(tmp_path / "m.db")
    a = Server(db, tmp_path, extra=HANG).start()
    b = Server(db, tmp_path, extra=HANG).start()
    other = None
    try:
        for r in range(WORLD):
            assert _beat(a, "fw", r)[0] == 200
        until(lambda: _holder(b, "fw") == a.url, 20, "b naming a as the job's collector")
        assert b.request("GET", "/api/v1/jobs/fw")[1]["num_ranks"] == WORLD  # a's view: b was sent no beat

        code, ans = b.request("POST", "/api/v1/jobs/fw/dump")
        assert (code, ans["dump_request"]) == (200, 1)
        assert a.request("GET", "/api/v1/jobs/fw")[1]["dump_request"] == 1, "the request is a's"
        assert _beat(b, "fw", 0)[1]["dump_request"] == 1, "ranks beating to b see a's request"
        for r in range(WORLD):  # every report posted to b
            code, ans = b.request("POST", "/api/v1/jobs/fw/flight?request=1", _report(r))
            assert code == 200 and ans["accepted"], ans
        verdict = a.wait_for(lambda d: True, "/api/v1/jobs/fw/hang", 30)
        assert (verdict["verdict"], verdict["culprit_ranks"], verdict["missing_ranks"]) == ("hang", [2], [])
        assert b.request("GET", "/api/v1/jobs/fw/hang") == (200, verdict)
        # b's job list shows the job as a keeps it (b holds no window of it)
        line = until(lambda: next((j for j in b.request("GET", "/api/v1/jobs")[1] if j["id"] == "fw"
                                   and j["hang_verdict"]), None), 20, "b listing a's verdict")
        assert line["hang_verdict"]["culprit_ranks"] == [2] and line["analyzed_by"]["url"] == a.url

        other = Server(db, tmp_path, token="another-token-0123456789", extra=HANG).start()
        code, ans = other.request("GET", "/api/v1/jobs/fw", token="another-token-0123456789")
        assert code == 502 and "same --token" in ans["detail"], (code, ans)

        a.stop(signal.SIGKILL)
        assert _beat(b, "fw", 0)[0] == 200, "a holder that cannot be reached: b answers itself"
        until(lambda: _beat(b, "fw", 1) and _holder(b, "fw") == b.url, 60, "b taking the job's lease")
        assert b.request("GET", "/api/v1/jobs/fw/hang") == (200, json.loads(json.dumps(verdict)))
    finally:
        for s in (a, b, other):
            if s is not None:
                s.stop()


def test_a_holder_that_stops_answering_leaves_the_other_collector_serving(tmp_path):
    db = str(tmp_path / "m.db")
    a = Server(db, tmp_path, extra=HANG).start()
    b = Server(db, tmp_path, extra=HANG).start()
    stopped = False
    try:
        for r in range(WORLD):
            assert _beat(a, "fw", r)[0] == 200
        until(lambda: _holder(b, "fw") == a.url, 20, "b naming a as the job's collector")
        a.proc.send_signal(signal.SIGSTOP)
        stopped = True
        # a 64-rank job's heartbeats reaching b at once, each to be passed to a, which never answers
        with ThreadPoolExecutor(64) as pool:
            beats = [pool.submit(_beat, b, "fw", r % WORLD) for r in range(64)]
            time.sleep(1.0)
            for path in ("/healthz", "/api/v1/jobs"):
                t0 = time.monotonic()
                code, _ = b.request("GET", path)
                took_s = time.monotonic() - t0
                # seconds on a busy host; waiting on a, it is the forward timeout
                assert code == 200 and took_s < 5.0, (path, code, took_s)
            answers = [f.result(timeout=90) for f in beats]
        assert all(code == 200 for code, _ in answers), [code for code, _ in answers]
    finally:
        if stopped:
            a.proc.send_signal(signal.SIGCONT)
        for s in (a, b):
            s.stop()


def test_postgresql_down_is_a_503_and_nothing_is_lost_once_it_is_back(tmp_path):
    pg = Postgres(tmp_path)
    db = pg.start()
    a = b = None
    try:
        a = Server(db, tmp_path).start()
        b = Server(db, tmp_path).start()
        job = synthesize(SynthConfig(dp=2, pp=1, microbatches=1, steps=6, seed=5, name="pgdown"))
        meta, seqs, bodies = job.meta.to_json(), {}, []
        for _, r, t in step_batches(job):
            seqs[r] = seqs.get(r, -1) + 1
            bodies.append(encode_batch(t, job_id="pgdown", rank=r, seq=seqs[r], meta=meta if seqs[r] == 0 else None))
        first, later = bodies[: len(bodies) // 2], bodies[len(bodies) // 2:]
        for i, body in enumerate(first):
            assert (a if i % 2 == 0 else b).request("POST", "/api/v1/ops", body, content_type=CONTENT_TYPE)[0] == 200

        pg.pause()
        for srv in (a, b):
            code, ans = srv.request("POST", "/api/v1/ops", later[0], content_type=CONTENT_TYPE)
            assert code == 503 and "down" in ans["detail"], (code, ans)
        pg.resume()
        # what a tracer does with a 503: it spools the batch and sends it again
        until(lambda: a.request("POST", "/api/v1/ops", later[0], content_type=CONTENT_TYPE)[0] == 200, 30,
              "a storing again once PostgreSQL is back")
        for i, body in enumerate(later):
            assert (a if i % 2 == 0 else b).request("POST", "/api/v1/ops", body, content_type=CONTENT_TYPE)[0] == 200
        want = int(job.table.num_rows)
        d = until(lambda: (x := a.request("GET", "/api/v1/jobs/pgdown")[1]).get("num_ops") == want and x, 60,
                  "the holder's window with every op")
        assert d["analyzed_by"]["url"] in (a.url, b.url)
    finally:
        for s in (a, b):
            if s is not None:
                s.stop()
        pg.stop()
