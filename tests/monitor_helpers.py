"""Real collector processes for the monitor tests: uvicorn in a subprocess on a free loopback port,
and a throwaway PostgreSQL cluster (initdb/pg_ctl as a non-root user in a temp dir)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from laggard.collectives.launch import free_port
from tests.rank_procs import line_from

TOKEN = "test-token-0123456789abcdef"


def until(pred, timeout_s: float, what: str, step_s: float = 0.1):  # noqa: ANN001, ANN201
    """``pred()``'s first true value, polled every ``step_s``; an AssertionError naming ``what`` past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step_s)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def stopped_at(procs: list[subprocess.Popen], stuck: int, within_s: float = 120.0) -> float:
    """The unix time rank ``stuck`` of a ``test_monitor_hang.py`` job printed ``stuck <time>``; a rank
    that ends first fails the test at once (``tests.rank_procs.line_from``)."""
    line = line_from(procs, stuck, within_s)
    assert line.startswith("stuck "), (line, procs[stuck].stderr.read())
    return float(line.split()[1])


class Server:
    """``laggard monitor serve`` in a subprocess."""

    def __init__(self, db: str, tmp: Path, *, token: str | None = TOKEN, extra: list[str] | None = None) -> None:
        self.db, self.tmp, self.token, self.extra = db, tmp, token, extra or []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log = tmp / f"server-{self.port}.log"

    what = "collector"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "laggard.cli.base", "monitor", "serve", "--db", self.db, "--port", str(self.port),
               *self.extra]
        return cmd + (["--token", self.token] if self.token is not None else [])

    def start(self, timeout_s: float = 60.0) -> Server:
        cmd = self.command()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("LAGGARD_TOKEN", None)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(self.log, "ab"), env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.what} exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(self.url + "/healthz", timeout=1).close()
                return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"{self.what} did not start: {self.log.read_text()[-2000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def request(self, method: str, path: str, body: bytes | None = None, *, token: str | None = TOKEN,
                content_type: str = "application/json", headers: dict[str, str] | None = None) -> tuple[int, Any]:
        h = {"Content-Type": content_type, **(headers or {})}
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                data = r.read()
                status = r.status
        except urllib.error.HTTPError as e:
            data, status = e.read(), e.code
        try:
            return status, json.loads(data)
        except ValueError:
            return status, data.decode(errors="replace")

    def post_declared(self, declared_bytes: int, body: bytes, *, chunked: bool = False) -> tuple[int, Any]:
        """POST ``body`` declaring ``declared_bytes`` (or chunked, no length): the server may answer before
        reading it all, so the send may fail; the answer is read anyway."""
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.putrequest("POST", "/api/v1/ops")
        conn.putheader("Authorization", f"Bearer {TOKEN}")
        conn.putheader("Content-Type", "application/vnd.apache.arrow.stream")
        conn.putheader("Transfer-Encoding" if chunked else "Content-Length",
                       "chunked" if chunked else str(declared_bytes))
        conn.endheaders()
        try:
            for i in range(0, len(body), 1 << 20):
                part = body[i : i + (1 << 20)]
                conn.send(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
            if chunked:
                conn.send(b"0\r\n\r\n")
        except OSError:
            pass
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, json.loads(data)

    def wait_for(self, pred, path: str, timeout_s: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            status, last = self.request("GET", path)
            if status == 200 and pred(last):
                return last
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting on {path}: {last}")


def sign_in(page: Any, url: str, path: str = "/", token: str = TOKEN) -> None:
    """Open ``url + path`` in the browser ``page`` and sign in on the sign-in page it shows, as a user does
    (the token typed into the form, never put in a URL); back at ``path`` once the session cookie is set.
    A page signed in before (its cookie kept) just opens ``path``."""
    page.goto(url + path)
    if page.query_selector("form[action='/signin'] #token") is None:
        return
    page.fill("#token", token)
    with page.expect_navigation():
        page.click("button[type=submit]")


class RelayProc(Server):
    """``laggard monitor relay`` in a subprocess, in front of the collector at ``upstream``."""

    def __init__(self, upstream: str, tmp: Path, *, extra: list[str] | None = None) -> None:
        super().__init__("", tmp, extra=extra)
        self.upstream = upstream
        self.log = tmp / f"relay-{self.port}.log"

    what = "relay"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "laggard.cli.base", "monitor", "relay", "--url", self.upstream,
                "--port", str(self.port), "--token", TOKEN, *self.extra]


class Postgres:
    """A throwaway cluster owned by a non-root user (initdb refuses root)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.user: str | None = None

    def _bin(self, name: str) -> str | None:
        found = shutil.which(name)
        if found:
            return found
        for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
            if (d / name).exists():
                return str(d / name)
        return None

    def _run(self, args: list[str]) -> subprocess.CompletedProcess:
        if os.geteuid() == 0:
            args = ["runuser", "-u", self.user or "nobody", "--", *args]
        return subprocess.run(args, capture_output=True, text=True, timeout=120)

    def start(self) -> str:
        initdb, pg_ctl = self._bin("initdb"), self._bin("pg_ctl")
        if not initdb or not pg_ctl:
            pytest.skip("PostgreSQL is not installed (initdb/pg_ctl not found; "
                        "`make test` installs Debian's postgresql as root)")
        if os.geteuid() == 0:  # initdb refuses root: the cluster belongs to nobody, in a dir it can reach
            import tempfile

            self.user = "nobody"
            self.tmp = Path(tempfile.mkdtemp(prefix="laggard-pg-"))
            shutil.chown(self.tmp, user=self.user)
        data = self.tmp / "pgdata"
        owner = self.user or pwd.getpwuid(os.getuid()).pw_name
        r = self._run([initdb, "-D", str(data), "-U", owner, "--auth=trust", "-E", "UTF8"])
        if r.returncode:
            pytest.skip(f"cannot create a PostgreSQL cluster: {r.stderr.strip().splitlines()[-1:]}")
        self.data, self.pg_ctl = data, pg_ctl
        r = self._server("start")
        if r.returncode:
            log = (self.tmp / "pg.log").read_text() if (self.tmp / "pg.log").exists() else r.stderr
            pytest.skip(f"cannot start PostgreSQL: {log.strip().splitlines()[-1:]}")
        return f"postgresql://{owner}@127.0.0.1:{self.port}/postgres"

    def _server(self, action: str) -> subprocess.CompletedProcess:
        if action == "stop":
            return self._run([self.pg_ctl, "-D", str(self.data), "-m", "immediate", "stop"])
        return self._run([self.pg_ctl, "-D", str(self.data), "-l", str(self.tmp / "pg.log"), "-w", "-o",
                          f"-p {self.port} -k {self.tmp} -c listen_addresses=127.0.0.1", "start"])

    def pause(self) -> None:
        """The server goes down as in a crash (its data kept): clients' connections break."""
        assert self._server("stop").returncode == 0

    def resume(self) -> None:
        """The server back on the same port and data."""
        r = self._server("start")
        assert r.returncode == 0, r.stderr

    def stop(self) -> None:
        if hasattr(self, "data"):
            self._server("stop")
        if self.user is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
