"""A collector in a child process on loopback (``laggard demo --monitor``)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
import urllib.request
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
        return f"{self.url}/?token={self.token}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_local_collector(db: Path, port: int, *, log: Path, timeout_s: float = 60.0) -> LocalCollector:
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
            raise LaggardError(f"the local collector exited ({'; '.join(tail) or proc.returncode}); is port {port} free?")
        try:
            urllib.request.urlopen(url + "/healthz", timeout=1).close()
            return LocalCollector(proc=proc, url=url, token=token)
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise LaggardError(f"the local collector did not start within {timeout_s:.0f} s (log: {log})")
