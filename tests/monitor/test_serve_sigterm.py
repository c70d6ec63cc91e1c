"""SIGTERM stops `laggard monitor serve` as Ctrl-C does: the collector stops, its analysis processes
are shut down and joined, exit code 0, and multiprocessing reports nothing leaked."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from laggard.monitor.shutdown import stop_on_sigterm

SIGTERM_STOP = 0  # a requested stop is a clean one


# The handler is checked in a child process: raised in a pytest worker (under pytest-xdist the tests
# may not run on the main thread, where no handler can be installed), SIGTERM would end the worker.
_CHILD = """
import signal, sys
from laggard.monitor.shutdown import stop_on_sigterm
ran = []
before = signal.getsignal(signal.SIGTERM)
with stop_on_sigterm():
    try:
        signal.raise_signal(signal.SIGTERM)  # in the main thread: the handler runs as it returns
        ran.append("not unwound")
    finally:
        ran.append("finally")
with stop_on_sigterm():
    x = 1
ran.append(f"ran through {x}")
ran.append("handler back" if signal.getsignal(signal.SIGTERM) == before else "handler left set")
print(",".join(ran))
"""


def test_sigterm_unwinds_the_block_and_ends_there() -> None:
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "finally,ran through 1,handler back", out.stdout + out.stderr[-2000:]


def test_outside_the_main_thread_the_block_runs_without_a_handler() -> None:
    seen: list[object] = []

    def body() -> None:
        with stop_on_sigterm():
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=body)
    t.start()
    t.join(30)
    assert seen == [before]


def _push_and_wait_for_an_analysis(srv) -> None:  # noqa: ANN001 - tests.monitor_helpers.Server
    from laggard.groundtruth.synth import SynthConfig, synthesize
    from laggard.monitor.push import step_batches
    from laggard.wire.batch import CONTENT_TYPE, encode_batch

    job = synthesize(SynthConfig(dp=2, pp=1, microbatches=2, steps=6, seed=1, name="termjob"))
    seqs: dict[int, int] = {}
    for _, r, t in step_batches(job):
        body = encode_batch(t, job_id="termjob", rank=r, seq=seqs.setdefault(r, 0), meta=job.meta.to_json())
        seqs[r] += 1
        status, ans = srv.request("POST", "/api/v1/ops", body, content_type=CONTENT_TYPE)
        assert status == 200, ans
    # a window analyzed: it ran in the collector's analysis process, which SIGTERM must now shut down
    srv.wait_for(lambda d: d["window"] is not None, "/api/v1/jobs/termjob", timeout_s=120)


def _terminate(srv) -> tuple[int, str]:  # noqa: ANN001
    srv.proc.send_signal(signal.SIGTERM)
    try:
        code = srv.proc.wait(90)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        srv.proc.wait()
        pytest.fail(f"the collector did not stop on SIGTERM: {srv.log.read_text()[-2000:]}")
    srv.proc = None
    return code, srv.log.read_text()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("analyzed", [True, False], ids=["after-an-analysis", "idle"])
def test_sigterm_stops_the_collector_cleanly(tmp_path: Path, analyzed: bool) -> None:
    pytest.importorskip("fastapi", reason="the monitor extra is not installed")
    from tests.monitor_helpers import Server

    srv = Server(str(tmp_path / "m.db"), tmp_path, extra=["--window-steps", "4", "--analysis-workers", "1"]).start()
    try:
        if analyzed:
            _push_and_wait_for_an_analysis(srv)
        code, stderr = _terminate(srv)
    finally:
        srv.stop()
    assert code == SIGTERM_STOP, stderr[-2000:]
    assert "leaked semaphore" not in stderr and "resource_tracker" not in stderr, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
