"""The collector's database schema: several collectors started at once on a new PostgreSQL database
all come up (creating the same tables at once can fail on a duplicate key in ``pg_type``), the schema
version is recorded, an older database is upgraded and a newer one refused in one line, exit 2."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from laggard.collectives.launch import free_port  # noqa: E402
from laggard.monitor.schema import SCHEMA_VERSION  # noqa: E402
from tests.monitor_helpers import Postgres  # noqa: E402


@pytest.fixture(scope="module")
def pg(tmp_path_factory):
    psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed")
    server = Postgres(tmp_path_factory.mktemp("pg"))
    url = server.start()
    made = iter(range(1000))

    def fresh() -> str:
        """A new, empty database on the server."""
        name = f"fresh{next(made)}"
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        return url.rsplit("/", 1)[0] + "/" + name

    try:
        yield fresh
    finally:
        server.stop()


def _env(tmp: Path) -> dict[str, str]:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp / "config"), "PYTHONUNBUFFERED": "1"}
    env.pop("LAGGARD_TOKEN", None)
    return env


def _serve(db: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laggard.cli.base", "monitor", "serve", "--db", db,
                           "--port", str(free_port()), *extra],
                          capture_output=True, text=True, timeout=60, env=_env(tmp), cwd=tmp)


def _get(url: str, token: str | None = None) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_three_collectors_started_at_once_on_a_new_postgres_database_all_come_up(pg, tmp_path):
    """Three ``monitor serve`` processes started at the same moment on one new database, without a
    token: all three make (or find) the schema, share the one token file one of them wrote, and
    answer an authenticated request; the database records the schema version once."""
    import psycopg

    db = pg()
    ports = [free_port() for _ in range(3)]
    logs = [open(tmp_path / f"serve{i}.log", "w+") for i in range(3)]
    procs = [subprocess.Popen([sys.executable, "-m", "laggard.cli.base", "monitor", "serve", "--db", db,
                               "--port", str(p)], stdout=log, stderr=subprocess.STDOUT, env=_env(tmp_path))
             for p, log in zip(ports, logs, strict=True)]
    try:
        deadline = time.monotonic() + 90
        up: set[int] = set()
        while len(up) < 3 and time.monotonic() < deadline:
            for i, (p, proc) in enumerate(zip(ports, procs, strict=True)):
                if proc.poll() is not None:
                    logs[i].seek(0)
                    pytest.fail(f"collector {i} exited with {proc.returncode}: {logs[i].read()[-2000:]}")
                try:
                    if _get(f"http://127.0.0.1:{p}/healthz") == 200:
                        up.add(i)
                except OSError:
                    pass
            time.sleep(0.2)
        assert up == {0, 1, 2}, f"only {sorted(up)} came up"
        token = (tmp_path / "config" / "laggard" / "monitor.token").read_text().strip()
        for p in ports:  # one token for all: each answers it
            assert _get(f"http://127.0.0.1:{p}/api/v1/jobs", token) == 200
        for log in logs:
            log.seek(0)
            assert "Traceback" not in log.read()
    finally:
        for proc in procs:
            proc.terminate()
        for proc, log in zip(procs, logs, strict=True):
            proc.wait(30)
            log.close()
    with psycopg.connect(db) as c:
        assert c.execute("SELECT key, value FROM laggard_meta WHERE key = 'schema_version'").fetchall() == [
            ("schema_version", str(SCHEMA_VERSION))]


def _refused(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("laggard: error:"), r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert "token:" not in r.stdout


def test_a_database_of_a_newer_laggard_is_refused_in_one_line_and_left_as_it_was(pg, tmp_path):
    import psycopg

    path = tmp_path / "newer.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE laggard_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    con.executemany("INSERT INTO laggard_meta VALUES (?, ?)", [("schema_version", "99"), ("laggard_version", "9.0")])
    con.commit()
    con.close()
    _refused(_serve(str(path), tmp_path), str(path), "schema version 99", "laggard 9.0", "upgrade laggard")
    con = sqlite3.connect(path)
    assert [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["laggard_meta"]
    con.close()
    assert not (tmp_path / "newer.db.token").exists()

    db = pg()
    with psycopg.connect(db) as c:
        c.execute("CREATE TABLE laggard_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        c.execute("INSERT INTO laggard_meta VALUES ('schema_version', '7')")
    _refused(_serve(db, tmp_path), "schema version 7", "a newer laggard", f"up to version {SCHEMA_VERSION}")
    with psycopg.connect(db) as c:
        assert c.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0] == 1

    path = tmp_path / "other.db"  # a version that is not laggard's
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE laggard_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    con.execute("INSERT INTO laggard_meta VALUES ('schema_version', 'v2-beta')")
    con.commit()
    con.close()
    _refused(_serve(str(path), tmp_path), "not a laggard monitor database", "v2-beta")


def test_an_older_database_is_upgraded_and_records_the_version(tmp_path):
    """A database of a collector from before the version was recorded (and before the kill switch
    column): its jobs kept, the missing column and tables added, the version recorded."""
    from laggard.monitor.store import Store

    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE jobs (job_id TEXT PRIMARY KEY, meta TEXT NOT NULL, tracing INTEGER NOT NULL, "
                "created_s DOUBLE PRECISION NOT NULL)")
    con.execute("INSERT INTO jobs VALUES ('oldjob', '{}', 1, 0.0)")
    con.commit()
    con.close()
    store = Store(path)
    try:
        assert store.schema_found == 0
        assert store.act_states() == {"oldjob": (True, [])}
    finally:
        store.close()
    store = Store(path)
    try:
        assert store.schema_found == SCHEMA_VERSION  # nothing left to do
    finally:
        store.close()
    con = sqlite3.connect(path)
    assert dict(con.execute("SELECT key, value FROM laggard_meta"))["schema_version"] == str(SCHEMA_VERSION)
    assert {"batches", "packs", "rules", "alerts", "actions"} <= {
        r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    con.close()
