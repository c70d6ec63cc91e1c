"""The kill switch and the action log outlive a collector restart (SQLite file and PostgreSQL), are served
by ``GET .../actions`` and the job detail with every field the dashboard shows, and the dashboard
renders them; a database made before the ``act`` column existed is migrated on open."""

from __future__ import annotations

import json
import sqlite3

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from laggard.groundtruth.synth import SynthConfig, synthesize  # noqa: E402
from laggard.mitigate import Controller  # noqa: E402
from laggard.monitor.store import Store  # noqa: E402
from laggard.wire.batch import CONTENT_TYPE, encode_batch  # noqa: E402
from tests.monitor_helpers import TOKEN, Postgres, Server, sign_in  # noqa: E402

SHIFT = {"step": 12, "kind": "rebalance", "ranks": [2], "reason": "DP rank 2 is 1.6x the other ranks' median",
         "counts": [9, 9, 5, 9], "step_s_before": 0.512, "step_s_after": 0.401, "evidence": {}}
DRAIN = {"step": 40, "kind": "drain", "ranks": [3], "reason": "too slow to rebalance", "step_s_before": 0.6,
         "step_s_after": None}


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request, tmp_path):
    if request.param == "sqlite":
        yield str(tmp_path / "m.db")
        return
    pg = Postgres(tmp_path)
    url = pg.start()
    try:
        yield url
    finally:
        pg.stop()


def _new_job(srv: Server, job_id: str) -> None:
    job = synthesize(SynthConfig(dp=4, pp=1, microbatches=2, steps=2, seed=1, name=job_id))
    b = encode_batch(job.table.slice(0, 4), job_id=job_id, rank=0, seq=0, meta=job.meta.to_json())
    assert srv.request("POST", "/api/v1/ops", b, content_type=CONTENT_TYPE)[0] == 200


def _drains(srv: Server, job_id: str) -> int:
    return sum(a["rule"] == "act-drain" for a in srv.request("GET", f"/api/v1/alerts?job={job_id}")[1])


def test_kill_switch_and_actions_survive_a_restart(db, tmp_path):
    srv = Server(db, tmp_path).start()
    try:
        _new_job(srv, "keepjob")
        _new_job(srv, "otherjob")
        assert srv.request("PATCH", "/api/v1/jobs/keepjob", json.dumps({"act": False}).encode())[0] == 200
        assert srv.request("POST", "/api/v1/jobs/keepjob/actions", json.dumps([SHIFT, DRAIN]).encode())[0] == 200
        assert _drains(srv, "keepjob") == 1
    finally:
        srv.stop()
    srv = Server(db, tmp_path).start()  # a new process on the same database
    try:
        detail = srv.request("GET", "/api/v1/jobs/keepjob")[1]
        assert detail["act"] is False, "a restart forgot the kill switch"
        assert detail["actions"] == [SHIFT, DRAIN]
        ctl = Controller(global_batch=8, dp_rank=0, dp_size=4, collector_url=srv.url, job_id="keepjob", token=TOKEN)
        try:
            ctl.link.stop()
            ctl.link.poll()
            assert ctl.link.act is False, "a controller polling the restarted collector sees the kill switch"
        finally:
            ctl.close()
        assert srv.request("GET", "/api/v1/jobs/keepjob/actions")[1] == {"id": "keepjob", "act": False,
                                                                         "actions": [SHIFT, DRAIN]}
        assert srv.request("GET", "/api/v1/jobs/otherjob/actions")[1] == {"id": "otherjob", "act": True, "actions": []}
        assert srv.request("GET", "/api/v1/jobs/nosuch/actions")[0] == 404
        # the controller sends its whole log again: the drain it already announced is not announced twice
        assert srv.request("POST", "/api/v1/jobs/keepjob/actions", json.dumps([SHIFT, DRAIN]).encode())[0] == 200
        assert _drains(srv, "keepjob") == 1
        assert srv.request("PATCH", "/api/v1/jobs/keepjob", json.dumps({"act": True}).encode())[0] == 200
    finally:
        srv.stop()
    srv = Server(db, tmp_path).start()
    try:
        assert srv.request("GET", "/api/v1/jobs/keepjob/actions")[1]["act"] is True
    finally:
        srv.stop()


def test_bad_action_logs_get_one_line(tmp_path):
    srv = Server(str(tmp_path / "m.db"), tmp_path).start()
    try:
        _new_job(srv, "badjob")
        for body in ([{"step": 1}], [{**SHIFT, "ranks": ["2"]}], [{**SHIFT, "step_s_after": "fast"}], {"a": 1}):
            code, ans = srv.request("POST", "/api/v1/jobs/badjob/actions", json.dumps(body).encode())
            assert code == 400 and "\n" not in ans["detail"] and ans["detail"].startswith("actions"), (body, ans)
        code, ans = srv.request("POST", "/api/v1/jobs/badjob/actions", b'[{"step": 1,')
        assert code == 400 and "\n" not in ans["detail"] and "not JSON" in ans["detail"], ans
        for method in ("POST", "GET"):
            code, ans = srv.request(method, "/api/v1/jobs/badjob/actions", json.dumps([SHIFT]).encode() if
                                    method == "POST" else None, token="wrong-token-0123456789")
            assert code == 401 and ans["detail"] == "missing or wrong bearer token", ans
        assert srv.request("GET", "/api/v1/jobs/badjob/actions")[1]["actions"] == []
    finally:
        srv.stop()


def test_an_old_database_gets_the_act_column(tmp_path):
    """A database file of a collector from before the kill switch was stored: opened, migrated, jobs kept."""
    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE jobs (job_id TEXT PRIMARY KEY, meta TEXT NOT NULL, tracing INTEGER NOT NULL, "
                "created_s DOUBLE PRECISION NOT NULL)")
    con.execute("INSERT INTO jobs VALUES ('oldjob', '{}', 1, 0.0)")
    con.commit()
    con.close()
    store = Store(path)
    try:
        assert store.act_states() == {"oldjob": (True, [])}
        assert store.set_act("oldjob", False) and store.set_act("nosuch", False) is False
        store.set_actions("oldjob", [SHIFT])
        store.set_actions("oldjob", [SHIFT, DRAIN])
        assert store.act_states() == {"oldjob": (False, [SHIFT, DRAIN])}
    finally:
        store.close()
    store = Store(path)  # opening a migrated file again changes nothing
    try:
        assert store.act_states() == {"oldjob": (False, [SHIFT, DRAIN])}
    finally:
        store.close()


def test_the_dashboard_shows_the_stored_actions(tmp_path):
    from laggard.report.browser import find_chromium, open_page

    exe, why = find_chromium()
    if exe is None:
        pytest.skip(why)
    srv = Server(str(tmp_path / "m.db"), tmp_path).start()
    try:
        _new_job(srv, "dashjob")
        assert srv.request("PATCH", "/api/v1/jobs/dashjob", json.dumps({"act": False}).encode())[0] == 200
        assert srv.request("POST", "/api/v1/jobs/dashjob/actions", json.dumps([SHIFT, DRAIN]).encode())[0] == 200
        with open_page(viewport={"width": 1400, "height": 1100}) as page:
            sign_in(page, srv.url, "/?job=dashjob")
            page.wait_for_selector("#actions tbody tr td")
            rows = page.evaluate("""() => [...document.querySelectorAll("#actions tbody tr")].map(r =>
                [...r.querySelectorAll("td")].map(c => c.textContent.trim()))""")
            head = page.evaluate(
                """() => [...document.querySelectorAll("#actions thead th")].map(c => c.textContent)""")
            note = page.inner_text("#act")
    finally:
        srv.stop()
    assert head == ["step", "kind", "DP ranks", "reason", "step s before", "after"]
    assert [r[:4] for r in rows] == [["40", "drain", "3", DRAIN["reason"]], ["12", "rebalance", "2", SHIFT["reason"]]]
    assert "0.512" in rows[1][4] and "0.401" in rows[1][5], rows
    assert "kill switch on" in note


def test_a_browser_without_the_token_gets_a_page_saying_how(tmp_path):
    """``/`` without the token answered a browser with raw JSON; it now gets a page saying where the
    token is (still 401). API clients keep the one-line JSON."""
    import urllib.error
    import urllib.request

    srv = Server(str(tmp_path / "m.db"), tmp_path).start()
    try:
        req = urllib.request.Request(srv.url + "/", headers={"Accept": "text/html,application/xhtml+xml"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 401 and e.value.headers["content-type"].startswith("text/html")
        page = e.value.read().decode()
        assert 'action=/signin' in page and "laggard monitor serve" in page and "?token=" not in page
        code, ans = srv.request("GET", "/api/v1/alerts", token="wrong-token-0123456789")
        assert code == 401 and ans["detail"] == "missing or wrong bearer token"
    finally:
        srv.stop()
