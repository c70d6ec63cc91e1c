"""The collector's hang endpoints against a real server process, fed by hand (no torch): heartbeats
make a job known from its first step, a dump request collects the ranks' hang reports and the
verdict is ``laggard hang``'s; bad and oversized reports get one clear 4xx line."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from tests.hang.test_hang import _state_only  # noqa: E402
from tests.monitor_helpers import Server  # noqa: E402

pytestmark = pytest.mark.timeout(180)
META = {"name": "beatjob", "dp_size": 4, "pp_size": 1}


def _beat(srv: Server, rank: int, progress: int, **extra) -> tuple[int, dict]:
    body = {"rank": rank, "state": {"world_size": 4, "step": 3, "progress": progress}, **extra}
    return srv.request("POST", "/api/v1/jobs/beatjob/heartbeat", json.dumps(body).encode())


def test_heartbeats_reports_and_the_verdict(tmp_path):
    srv = Server(str(tmp_path / "m.db"), tmp_path,
                 extra=["--hang-after-s", "600", "--hang-collect-s", "5", "--max-report-bytes", "100000"]).start()
    try:
        assert _beat(srv, 0, 10)[0] == 404  # unknown job, no meta
        code, ans = _beat(srv, 0, 10, meta=META)
        assert code == 200 and ans == {"dump_request": 0, "tracing": True, "hang": None}
        for r in (1, 2, 3):
            assert _beat(srv, r, 10)[0] == 200
        jobs = srv.request("GET", "/api/v1/jobs")[1]
        assert [(j["id"], j["num_ranks"], j["last_step"]) for j in jobs] == [("beatjob", 4, 3)]
        assert srv.request("GET", "/api/v1/jobs/beatjob/hang")[0] == 404  # no verdict yet
        assert srv.request("POST", "/api/v1/jobs/beatjob/heartbeat", b'{"rank": -1}')[0] == 422
        assert srv.request("POST", "/api/v1/jobs/beatjob/heartbeat", b'not json')[0] == 400

        # bad reports: one line each
        code, ans = srv.request("POST", "/api/v1/jobs/beatjob/flight?request=1", b"garbage")
        assert code == 422 and "\n" not in ans["detail"] and "hang report" in ans["detail"], ans
        code, ans = srv.request("POST", "/api/v1/jobs/beatjob/flight?request=1", b'{"version": 1, "entries": []}')
        assert code == 422 and "names no rank" in ans["detail"], ans
        code, ans = srv.request("POST", "/api/v1/jobs/beatjob/flight?request=1", b"{" + b" " * 200_000 + b"}")
        assert code == 413 and "limit of 100000 bytes" in ans["detail"], ans
        assert srv.request("POST", "/api/v1/jobs/nojob/flight?request=1", b"{}")[0] == 404
        assert srv.request("GET", "/api/v1/jobs/nojob/hang")[0] == 404
        bad_rank = json.dumps(_state_only(7, 4, 5, pending=True, where="collective")).encode()
        assert srv.request("POST", "/api/v1/jobs/beatjob/flight?request=1", bad_rank)[0] == 422

        # an operator's dump request: the heartbeat answers carry it; the reports give the verdict
        assert srv.request("POST", "/api/v1/jobs/beatjob/dump")[1]["dump_request"] == 1
        assert _beat(srv, 0, 10)[1]["dump_request"] == 1
        for r in range(4):
            rep = _state_only(r, 4, 4 if r == 2 else 5, pending=r != 2, where="compute" if r == 2 else "collective")
            code, ans = srv.request("POST", "/api/v1/jobs/beatjob/flight?request=1", json.dumps(rep).encode())
            assert code == 200 and ans["accepted"], ans
        doc = srv.wait_for(lambda d: True, "/api/v1/jobs/beatjob/hang", timeout_s=30)
        assert (doc["verdict"], doc["culprit_ranks"], doc["op"], doc["seq"]) == ("hang", [2], "grads-all-reduce", 5)
        ans = _beat(srv, 1, 10)[1]
        assert ans["hang"]["culprit_ranks"] == [2] and ans["hang"]["suspected"] is False
        # the collector did not suspect a hang (an operator asked): published, no alert
        assert not [a for a in srv.request("GET", "/api/v1/alerts")[1] if a["detail"].get("kind") == "hang"]
        # a rank that closes its tracer is not a stopped rank
        srv.request("POST", "/api/v1/jobs/beatjob/heartbeat", b'{"rank": 3, "state": {"closed": true}}')
        time.sleep(0.5)
        assert srv.request("GET", "/api/v1/jobs/beatjob")[1]["hang_suspected"] is False
    finally:
        srv.stop()


def test_a_stalled_job_is_suspected_decided_alerted_and_told_to_abort_by_its_rule(tmp_path):
    """Heartbeats keep coming but no rank moves: suspected after --hang-after-s, the reports give the
    verdict, the alert names the culprit, and a hang rule with abort: true is in the verdict the
    tracers read (a tracer with abort_on_hang=None then ends its hung rank)."""
    srv = Server(str(tmp_path / "m.db"), tmp_path, extra=["--hang-after-s", "2", "--hang-collect-s", "30"]).start()
    try:
        rules = srv.request("GET", "/api/v1/rules")[1]
        for r in rules:
            r["abort"] = r["type"] == "hang"
        assert srv.request("PUT", "/api/v1/rules", json.dumps(rules).encode())[0] == 200
        ans = {}
        deadline = time.monotonic() + 60
        while ans.get("dump_request", 0) < 1 and time.monotonic() < deadline:
            for r in range(4):
                ans = _beat(srv, r, 10, meta=META)[1]  # alive, not moving
            time.sleep(0.3)
        assert ans["dump_request"] == 1 and srv.request("GET", "/api/v1/jobs/beatjob")[1]["hang_suspected"]
        for r in range(4):
            rep = _state_only(r, 4, 4 if r == 2 else 5, pending=r != 2, where="compute" if r == 2 else "collective")
            assert srv.request("POST", "/api/v1/jobs/beatjob/flight?request=1", json.dumps(rep).encode())[0] == 200
        doc = srv.wait_for(lambda d: True, "/api/v1/jobs/beatjob/hang", timeout_s=30)
        assert doc["culprit_ranks"] == [2]
        pub = _beat(srv, 0, 10)[1]["hang"]
        assert (pub["suspected"], pub["abort"], pub["culprit_ranks"], pub["seq"]) == (True, True, [2], 5)
        kinds = [(a["detail"].get("kind"), "verdict" in a["detail"]) for a in srv.request("GET", "/api/v1/alerts")[1]]
        assert ("hang", True) in kinds and ("hang", False) in kinds  # the verdict, and the suspicion before it
        assert 'laggard_job_hung{job="beatjob"} 1.0' in srv.request("GET", "/metrics")[1]
        summary = srv.request("GET", "/api/v1/jobs")[1][0]
        assert summary["verdict"] == "hang: rank(s) [2]"
        for r in range(4):  # the job moves again
            _beat(srv, r, 11)
        time.sleep(1.0)
        assert srv.request("GET", "/api/v1/jobs/beatjob")[1]["hang_suspected"] is False
        assert 'laggard_job_hung{job="beatjob"} 0.0' in srv.request("GET", "/metrics")[1]
    finally:
        srv.stop()
