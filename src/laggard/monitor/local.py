"""A collector for ``laggard demo --monitor``: a child process on loopback, or one already running.

Started here, it is up when it answers an authenticated request with the token it was given (a
``/healthz`` answer alone could come from another server on the port); a taken port is said before
anything starts. An existing collector (``--monitor-url URL --token T``) is probed the same way
before the job runs, so a wrong token or address ends the demo with one line, not with every rank's
batches refused.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from laggard.errors import LaggardError


@dataclass(kw_only=True, slots=True)
class LocalCollector:
    proc: subprocess.Popen
    url: str
    token: str

    @property
    def dashboard(self) -> str:
        """The dashboard's address and the token to sign in there with (this collector is the demo's own)."""
        return f"{dashboard_url(self.url)}  (sign in with the token {self.token})"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def dashboard_url(url: str, token: str | None = None) -> str:
    """The dashboard's address; never with ``token`` in it (a URL is kept in logs and browser history:
    the collector refuses ``?token=``): one signs in on the page."""
    return f"{url.rstrip('/')}/"


def job_arrived(url: str, token: str | None, job_id: str) -> str:
    """Why the collector at ``url`` holds no op of job ``job_id`` ("" when it does)."""
    from laggard.wire.client import Client, CollectorDown

    client = Client(url, token, timeout_s=5.0)
    try:
        doc = client.request("GET", f"/api/v1/jobs/{job_id}")
    except (CollectorDown, LaggardError) as e:
        return f"the collector at {url} has no job {job_id} ({e}): its ranks' batches were refused or never arrived"
    finally:
        client.close()
    if not isinstance(doc, dict) or not doc.get("num_ops"):
        return f"the collector at {url} holds no op of job {job_id}: its ranks' batches were refused or never arrived"
    return ""


def probe_collector(url: str, token: str | None) -> str:
    """Why the laggard collector at ``url`` cannot take this token's batches ("" when it can)."""
    from laggard.wire.client import Client, CollectorDown

    client = Client(url, token, timeout_s=5.0)
    try:
        doc = client.request("GET", "/api/v1/jobs")
    except CollectorDown as e:
        return f"no collector answers at {url} ({e})"
    except LaggardError as e:
        if " 401 " in str(e) or " 403 " in str(e):
            return f"the collector at {url} refused the token ({e}); pass the token it was started with (--token)"
        return f"{url} is not a laggard collector ({e})"
    finally:
        client.close()
    if not isinstance(doc, list):
        return f"{url} is not a laggard collector (GET /api/v1/jobs did not answer a list of jobs)"
    return ""


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on ``host:port`` already."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def start_local_collector(db: Path, port: int, *, log: Path, timeout_s: float = 60.0) -> LocalCollector:
    if port_taken(port):
        raise LaggardError(f"port {port} on 127.0.0.1 is taken (another collector?): pass --monitor-port with a free "
                           "port, or --monitor-url URL --token TOKEN to stream into the collector running there")
    token = secrets.token_urlsafe(24)
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "laggard.cli.base", "monitor", "serve", "--db", str(db), "--port", str(port),
           "--token", token]
    with open(log, "ab") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=f, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            raise LaggardError("the local collector exited "
                               f"({'; '.join(tail) or proc.returncode}); is port {port} free?")
        if not probe_collector(url, token):  # ours: it knows the token
            return LocalCollector(proc=proc, url=url, token=token)
        time.sleep(0.2)
    proc.kill()
    raise LaggardError(f"the local collector did not start within {timeout_s:.0f} s (log: {log})")
