"""`laggard demo --monitor-url URL --token T`: the demo streams into a collector already running.

Run beside an existing collector, the demo can go wrong in several ways: its own collector cannot
bind the port; the other server answers `/healthz`, so it can be taken for the demo's own; every rank
then gets 401; and the demo can still exit 0 and print a dashboard address whose token does not work.
Each of those cases is checked here against real servers on loopback.
"""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")
pytest.importorskip("torch", reason="the demo job needs torch")

from laggard.collectives.launch import free_port  # noqa: E402
from tests.monitor_helpers import TOKEN, Server  # noqa: E402

SMALL = ["--quick", "--dp", "2", "--pp", "1", "--steps", "4", "--no-screenshot"]


def _demo(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laggard.cli.base", "demo", *args], capture_output=True, text=True,
                          timeout=timeout_s)


@pytest.fixture
def collector(tmp_path: Path):
    srv = Server(str(tmp_path / "c.db"), tmp_path).start()
    yield srv
    srv.stop()


def _one_line_error(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("laggard: error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in errors[0], errors[0]
    assert "training the demo GPT" not in r.stdout  # said before anything ran


@pytest.mark.timeout(400)
def test_the_demo_streams_into_an_existing_collector(collector: Server, tmp_path: Path) -> None:
    r = _demo(*SMALL, "--out", str(tmp_path / "out"), "--monitor-url", collector.url, "--token", TOKEN)
    assert r.returncode == 0, r.stderr[-3000:]
    # the dashboard address printed carries no token (the user has it: they gave --token)
    assert f"live dashboard: {collector.url}/  (job" in r.stdout and TOKEN not in r.stdout
    status, jobs = collector.request("GET", "/api/v1/jobs")
    assert status == 200 and len(jobs) == 1, jobs
    job = jobs[0]
    assert job["id"].startswith("demo-") and job["id"] in r.stdout
    assert job["num_ranks"] == 2 and job["num_ops"] > 0, job
    # no local collector was started beside it
    assert not (tmp_path / "out" / "monitor.db").exists()


def test_a_wrong_token_stops_the_demo_before_it_trains(collector: Server, tmp_path: Path) -> None:
    r = _demo(*SMALL, "--out", str(tmp_path / "out"), "--monitor-url", collector.url, "--token", "x" * 24,
              timeout_s=120)
    _one_line_error(r, "refused the token", "401", collector.url)
    assert collector.request("GET", "/api/v1/jobs")[1] == []


def test_a_taken_port_is_said_instead_of_trusting_whoever_answers(collector: Server, tmp_path: Path) -> None:
    """The collector already on the port answers /healthz: the demo must not take it for its own."""
    r = _demo(*SMALL, "--out", str(tmp_path / "out"), "--monitor", "--monitor-port", str(collector.port),
              timeout_s=120)
    _one_line_error(r, f"port {collector.port}", "--monitor-url")


def test_a_server_that_is_not_a_collector_is_refused(tmp_path: Path) -> None:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Quiet)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        r = _demo(*SMALL, "--out", str(tmp_path / "out"), "--monitor-url", url, "--token", TOKEN, timeout_s=120)
        _one_line_error(r, "is not a laggard collector", "404")
    finally:
        srv.shutdown()
        srv.server_close()


def test_nothing_listening(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    r = _demo(*SMALL, "--out", str(tmp_path / "out"), "--monitor-url", url, "--token", TOKEN, timeout_s=120)
    _one_line_error(r, "no collector answers", url)


@pytest.mark.parametrize("flags, words", [
    (["--token", TOKEN], "--token is the token of --monitor-url"),
    (["--monitor-url", "http://127.0.0.1:1", "--monitor-port", "9000"], "apply to a local collector"),
    (["--monitor-port", "9000"], "apply with --monitor"),
    (["--monitor-url", "ftp://x"], "expected http://HOST:PORT"),
])
def test_wrong_flags(flags: list[str], words: str, tmp_path: Path) -> None:
    from tests.conftest import run_cli

    assert run_cli("demo", *SMALL, "--out", tmp_path / "out", *flags) == 2
    r = _demo(*SMALL, "--out", str(tmp_path / "out"), *flags, timeout_s=120)
    _one_line_error(r, words)


def test_a_job_whose_batches_never_arrived_is_said(collector: Server) -> None:
    """What the demo checks after the run (its ranks' batches refused mid-run, e.g. a rotated token)."""
    from laggard.monitor.local import job_arrived

    why = job_arrived(collector.url, TOKEN, "demo-never-sent")
    assert "has no job demo-never-sent" in why and "refused or never arrived" in why
    assert "refused" in job_arrived(collector.url, "y" * 24, "demo-never-sent")
