"""API tokens with roles: ``laggard monitor token create|list|revoke`` against a running
collector: ingest posts (its job's only, where given), read reads everything, admin changes; outside
its role 403 with the reason; revoked or expired 401 (their dashboard sessions too); the collector's
own token stays admin."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from laggard.groundtruth.synth import SynthConfig, synthesize  # noqa: E402
from laggard.monitor.push import step_batches  # noqa: E402
from laggard.monitor.tokens import CACHE_S  # noqa: E402
from laggard.wire.batch import CONTENT_TYPE, encode_batch  # noqa: E402
from tests.monitor_helpers import TOKEN, Server  # noqa: E402


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LAGGARD_TOKEN"}
    return subprocess.run([sys.executable, "-m", "laggard.cli.base", "monitor", "token", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def _make(db: str, *args: str) -> tuple[str, str]:
    """(token, id) of ``token create``: the token alone on stdout, its id on stderr."""
    r = _cli("create", "--db", db, *args)
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    assert token.startswith("lgk_") and len(r.stdout.strip().splitlines()) == 1
    return token, r.stderr.split()[1].rstrip(":")


def _first_batch(job_id: str) -> bytes:
    job = synthesize(SynthConfig(dp=2, pp=1, microbatches=2, steps=2, seed=1, name=job_id))
    _, rank, table = next(iter(step_batches(job)))
    return encode_batch(table, job_id=job_id, rank=rank, seq=0, meta=job.meta.to_json())


def _detail(ans) -> str:
    return ans["detail"] if isinstance(ans, dict) else str(ans)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tokens")
    s = Server(str(tmp / "m.db"), tmp).start()
    try:
        yield s
    finally:
        s.stop()


def test_each_role_does_what_it_may_and_is_told_why_not(srv):
    ingest_a, _ = _make(srv.db, "--role", "ingest", "--job", "jobA")
    ingest_any, _ = _make(srv.db, "--role", "ingest")
    reader, _ = _make(srv.db, "--role", "read")
    admin, _ = _make(srv.db, "--role", "admin")
    # ingest for jobA: its batches, heartbeats, reports and action log; nothing of another job
    assert srv.request("POST", "/api/v1/ops", _first_batch("jobA"), content_type=CONTENT_TYPE, token=ingest_a)[0] == 200
    code, ans = srv.request("POST", "/api/v1/ops", _first_batch("jobB"), content_type=CONTENT_TYPE, token=ingest_a)
    assert code == 403 and "for job 'jobA' only, not 'jobB'" in _detail(ans), ans
    assert srv.request("GET", "/api/v1/jobs/jobB", token=TOKEN)[0] == 404  # nothing of it was stored
    code, _ = srv.request("POST", "/api/v1/jobs/jobA/heartbeat", b'{"rank": -1}', token=ingest_a)
    assert code == 422  # past the guard: the body is what is wrong
    code, ans = srv.request("POST", "/api/v1/jobs/jobB/heartbeat", b'{"rank": 0}', token=ingest_a)
    assert code == 403 and "'jobA' only" in _detail(ans)
    assert srv.request("POST", "/api/v1/jobs/jobA/actions", b"[]", token=ingest_a)[0] == 200  # the controller's log
    assert srv.request("GET", "/api/v1/jobs/jobA", token=ingest_a)[0] == 200  # ... and its poll of the kill switch
    for method, path, body in (("GET", "/api/v1/jobs", None), ("GET", "/metrics", None), ("GET", "/", None),
                               ("PATCH", "/api/v1/jobs/jobA", b'{"act": false}'), ("PUT", "/api/v1/rules", b"[]"),
                               ("POST", "/api/v1/jobs/jobA/dump", None), ("GET", "/api/v1/tokens", None)):
        code, ans = srv.request(method, path, body, token=ingest_a)
        assert code == 403 and "token tk" in _detail(ans), (method, path, ans)
    code, _ = srv.request("POST", "/api/v1/ops", _first_batch("jobC"), content_type=CONTENT_TYPE, token=ingest_any)
    assert code == 200  # an ingest token without a job: any job's
    # read: every read, no change
    for path in ("/api/v1/jobs", "/api/v1/jobs/jobA", "/api/v1/rules", "/api/v1/alerts", "/metrics", "/"):
        assert srv.request("GET", path, token=reader)[0] == 200, path
    for method, path, body in (("PUT", "/api/v1/rules", b"[]"), ("PATCH", "/api/v1/jobs/jobA", b'{"act": false}'),
                               ("POST", "/api/v1/ops", _first_batch("jobA")), ("GET", "/api/v1/tokens", None)):
        code, ans = srv.request(method, path, body, token=reader, content_type=CONTENT_TYPE)
        assert code == 403 and ("read token" in _detail(ans) or "admin token" in _detail(ans)), (method, path, ans)
    # admin (a made one, and the collector's own): changes, tokens
    rules = srv.request("GET", "/api/v1/rules")[1]
    for tok in (admin, TOKEN):
        assert srv.request("PUT", "/api/v1/rules", json.dumps(rules).encode(), token=tok)[0] == 200
        assert srv.request("PATCH", "/api/v1/jobs/jobA", b'{"act": true}', token=tok)[0] == 200
    code, listed = srv.request("GET", "/api/v1/tokens", token=admin)
    assert code == 200 and {t["role"] for t in listed} == {"ingest", "read", "admin"}
    assert not any(ingest_a in json.dumps(t) or "digest" in t for t in listed)  # never the tokens


def test_revoked_and_expired_tokens_and_their_sessions_are_refused(srv):
    reader, reader_id = _make(srv.db, "--role", "read")
    brief, _ = _make(srv.db, "--role", "read", "--expires", str(3 / 86400))  # three seconds
    brief_ends = time.monotonic() + 3
    assert srv.request("GET", "/api/v1/jobs", token=brief)[0] == 200
    # a dashboard session signed in with the read token; an ingest token cannot sign in
    ingest, _ = _make(srv.db, "--role", "ingest")
    status, _, body = _post_form(srv, "/signin", {"token": ingest})
    assert status == 401 and "needs a read or admin token" in body
    status, headers, _ = _post_form(srv, "/signin", {"token": reader})
    assert status == 303
    cookie = headers["set-cookie"].split(";", 1)[0]
    assert cookie.startswith(f"laggard_session={reader_id}.")
    assert _get(srv, "/api/v1/jobs", Cookie=cookie) == 200
    # revoked from the CLI (the database, as another host would): refused within the cache time
    r = _cli("revoke", reader_id, "--db", srv.db)
    assert r.returncode == 0 and f"revoked {reader_id}" in r.stdout
    time.sleep(CACHE_S + 0.5)
    code, ans = srv.request("GET", "/api/v1/jobs", token=reader)
    assert code == 401 and f"token {reader_id} is revoked" in _detail(ans)
    assert _get(srv, "/api/v1/jobs", Cookie=cookie) == 401  # its session with it
    time.sleep(max(0.0, brief_ends - time.monotonic()) + 0.5)
    code, ans = srv.request("GET", "/api/v1/jobs", token=brief)
    assert code == 401 and "is expired" in _detail(ans)
    # made and revoked through the API by an admin: counts at once
    code, made = srv.request("POST", "/api/v1/tokens", b'{"role": "ingest", "job": "jobZ"}')
    assert code == 200 and made["token"].startswith("lgk_") and made["job"] == "jobZ"
    assert srv.request("POST", "/api/v1/jobs/jobZ/heartbeat", b'{"rank": -1}', token=made["token"])[0] == 422
    assert srv.request("DELETE", f"/api/v1/tokens/{made['id']}")[0] == 200
    assert srv.request("POST", "/api/v1/jobs/jobZ/heartbeat", b'{"rank": -1}', token=made["token"])[0] == 401
    # the list says each one's state; the collector's own token is untouched
    r = _cli("list", "--db", srv.db)
    lines = {ln.split()[0]: ln.split()[-1] for ln in r.stdout.splitlines()[1:]}
    assert lines[reader_id] == "revoked" and "expired" in lines.values() and "active" in lines.values()
    assert srv.request("GET", "/api/v1/jobs")[0] == 200


def test_the_token_commands_refuse_bad_input_in_one_line(srv, tmp_path: Path):
    cases = [
        (("create", "--db", srv.db, "--role", "root"), "--role root: one of ingest, read, admin"),
        (("create", "--db", srv.db, "--role", "read", "--job", "x"), "--job limits an ingest token"),
        (("create", "--db", srv.db, "--role", "ingest", "--expires", "-1"), "--expires -1"),
        (("create", "--db", srv.db, "--role", "ingest", "--expires", "nan"), "--expires nan"),
        (("create", "--db", str(tmp_path / "none.db"), "--role", "read"), "no such database file"),
        (("revoke", "tknosuch", "--db", srv.db), "no token 'tknosuch'"),
    ]
    for args, words in cases:
        r = _cli(*args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and words in lines[0], (args, r.stderr)
    _, tid = _make(srv.db, "--role", "read")
    assert _cli("revoke", tid, "--db", srv.db).returncode == 0
    r = _cli("revoke", tid, "--db", srv.db)
    assert r.returncode == 2 and "revoked before" in r.stderr


def _post_form(srv: Server, path: str, form: dict[str, str]):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    conn.request("POST", path, body=urllib.parse.urlencode(form),
                 headers={"Content-Type": "application/x-www-form-urlencoded", "Accept": "text/html"})
    r = conn.getresponse()
    out = r.status, r.headers, r.read().decode()
    conn.close()
    return out


def _get(srv: Server, path: str, **headers: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    conn.request("GET", path, headers=headers)
    r = conn.getresponse()
    r.read()
    conn.close()
    return r.status
