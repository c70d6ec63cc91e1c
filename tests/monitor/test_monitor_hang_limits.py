"""The collector's hang reports are bounded: per job a cap on reports and on bytes, the oldest dropped
first, counted and said in the verdict's warnings; released once the verdict has them or the job's
tracers all close; a report for no open request is not kept. Bad reports get one 4xx line."""

from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from laggard.errors import LaggardError  # noqa: E402
from laggard.monitor.config import MonitorConfig  # noqa: E402
from laggard.monitor.hangs import HangCase, parse_report  # noqa: E402
from tests.hang.test_hang import _state_only  # noqa: E402
from tests.monitor_helpers import Server, sign_in  # noqa: E402

pytestmark = pytest.mark.timeout(180)
META = {"name": "capjob", "dp_size": 4, "pp_size": 1}


def _report(rank: int) -> bytes:
    """Rank 2 stuck in compute after 4 all_reduces, the others inside the 5th."""
    return json.dumps(_state_only(rank, 4, 4 if rank == 2 else 5, pending=rank != 2,
                                  where="compute" if rank == 2 else "collective")).encode()


def _add(case: HangCase, request: int, rank: int, *, max_reports: int = 100, max_bytes: int = 10**9) -> bool:
    body = _report(rank)
    return case.add_report(request, parse_report(body), len(body), max_reports=max_reports, max_bytes=max_bytes)


def test_the_oldest_reports_go_first_and_the_verdict_says_so():
    case = HangCase(world_size=4)
    assert not _add(case, 1, 0), "no request is open: not kept"
    case.open(1, 0.0, suspected=True)
    for r in (0, 1, 2, 0, 3):  # rank 0 sends twice: its newer report replaces the older, and is the newest
        assert _add(case, 1, r, max_reports=3)
    assert list(case.reports) == [2, 0, 3] and case.dropped_total == 1 and case.ready(1.0, 10.0)
    dumps, warnings = case.take()
    assert sorted(d.rank for d in dumps) == [0, 2, 3] and case.reports == {} and case.report_bytes == 0
    assert len(warnings) == 1 and "1 hang report(s)" in warnings[0] and "rank(s) [1] count as missing" in warnings[0]
    pub = case.decide("j", dumps, 10.0, False, warnings)
    assert case.doc["warnings"] == warnings and pub["warnings"] == warnings
    assert case.doc["missing_ranks"] == [1]
    assert not _add(case, 1, 1), "a late report for a decided request is not kept"

    # the bytes cap: room for two reports
    case.open(2, 20.0, suspected=False)
    size = len(_report(0))
    for r in range(4):
        _add(case, 2, r, max_bytes=2 * size + 10)
    assert list(case.reports) == [2, 3] and case.report_bytes <= 2 * size + 10 and case.dropped_total == 3
    assert case.dropped_ranks == [0, 1] and case.dropped == 2 and case.dropped_bytes == 2 * size
    case.open(3, 30.0, suspected=False)  # a new request releases the old one's reports
    assert case.reports == {} and case.dropped == 0 and case.dropped_ranks == []


def test_a_closed_job_is_decided_at_once_and_its_reports_released():
    case = HangCase(world_size=4)
    for r in range(4):
        case.beat(r, {"world_size": 4, "progress": 5}, 0.0)
    case.open(1, 0.0, suspected=False)
    _add(case, 1, 0)
    assert not case.ready(1.0, 600.0)
    for r in range(4):
        case.beat(r, {"closed": True}, 1.0)
    assert case.ready(1.0, 600.0)
    dumps, _ = case.take()
    assert len(dumps) == 1 and case.reports == {} and not case.ready(2.0, 600.0)


def test_the_caps_are_checked():
    with pytest.raises(LaggardError, match="hang_reports_per_job"):
        MonitorConfig(hang_reports_per_job=0)
    with pytest.raises(LaggardError, match="at least max_report_bytes"):
        MonitorConfig(hang_report_bytes_per_job=1000, max_report_bytes=2000)


def test_over_the_caps_bad_reports_and_wrong_tokens_over_http(tmp_path):
    srv = Server(str(tmp_path / "m.db"), tmp_path,
                 extra=["--hang-after-s", "600", "--hang-collect-s", "600", "--max-report-bytes", "100000",
                        "--hang-reports-per-job", "2", "--hang-report-bytes-per-job", "100000"]).start()
    try:
        for r in range(4):
            body = {"rank": r, "state": {"world_size": 4, "step": 3, "progress": 10}, "meta": META}
            assert srv.request("POST", "/api/v1/jobs/capjob/heartbeat", json.dumps(body).encode())[0] == 200
        flight = "/api/v1/jobs/capjob/flight?request=1"
        # bad payloads: one 4xx line each
        for path, body, token, code, words in [
                (flight, _report(0), "wrong-token-0123456789", 401, "token"),
                ("/api/v1/jobs/capjob/heartbeat", b'{"rank": 0}', None, 401, "token"),
                (flight, b'{"version": 1, "entries": [', "ok", 422, "hang report"),
                (flight, b"{" + b" " * 150_000 + b"}", "ok", 413, "limit of 100000 bytes"),
                ("/api/v1/jobs/capjob/heartbeat", b'{"rank": 0, "state": [', "ok", 400, "not JSON")]:
            kw = {} if token == "ok" else {"token": token}
            got, ans = srv.request("POST", path, body, **kw)
            assert got == code and "\n" not in ans["detail"] and words in ans["detail"], (path, got, ans)
        assert srv.request("POST", "/api/v1/jobs/capjob/dump")[1]["dump_request"] == 1
        held = [srv.request("POST", flight, _report(r))[1]["accepted"] for r in range(4)]
        assert held == [True, True, True, True]  # each was held when it came; ranks 0 and 1 went later
        doc = srv.wait_for(lambda d: True, "/api/v1/jobs/capjob/hang", timeout_s=30)
        assert doc["missing_ranks"] == [0, 1] and len(doc["warnings"]) == 1, doc
        assert "2 hang report(s)" in doc["warnings"][0] and "[0, 1]" in doc["warnings"][0]
        assert "laggard_hang_reports_dropped_total 2.0" in srv.request("GET", "/metrics")[1]
        assert srv.request("GET", "/api/v1/jobs/capjob")[1]["hang_verdict"]["warnings"] == doc["warnings"]
        assert srv.request("POST", flight, _report(0))[1]["accepted"] is False  # decided: not kept
    finally:
        srv.stop()


def _beat_all(srv: Server) -> dict:
    ans: dict = {}
    for r in range(4):  # alive, not moving
        body = {"rank": r, "state": {"world_size": 4, "step": 3, "progress": 10}, "meta": META}
        ans = srv.request("POST", "/api/v1/jobs/capjob/heartbeat", json.dumps(body).encode())[1]
    return ans


def test_the_dashboard_banner_says_reports_were_dropped(tmp_path):
    from laggard.report.browser import find_chromium, open_page

    if find_chromium()[0] is None:
        pytest.skip(find_chromium()[1])
    srv = Server(str(tmp_path / "m.db"), tmp_path,
                 extra=["--hang-after-s", "2", "--hang-collect-s", "600", "--hang-reports-per-job", "3"]).start()
    stop = threading.Event()

    def beating() -> None:  # the ranks stay alive (a job whose heartbeats all stop is no longer "suspected")
        while not stop.wait(0.5):
            _beat_all(srv)

    beats = threading.Thread(target=beating, daemon=True)
    try:
        deadline = time.monotonic() + 60
        while _beat_all(srv).get("dump_request", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.3)
        beats.start()
        for r in range(4):
            assert srv.request("POST", "/api/v1/jobs/capjob/flight?request=1", _report(r))[0] == 200
        srv.wait_for(lambda d: True, "/api/v1/jobs/capjob/hang", timeout_s=30)
        with open_page(viewport={"width": 1200, "height": 800}) as page:
            sign_in(page, srv.url)
            page.wait_for_selector("#banner .hangjob", timeout=20_000)
            banner = page.inner_text("#banner")
    finally:
        stop.set()
        if beats.is_alive():
            beats.join(5)
        srv.stop()
    assert "job capjob: missing-ranks" in banner or "job capjob: hang" in banner, banner
    assert "1 hang report(s)" in banner and "rank(s) [0] count as missing" in banner, banner
