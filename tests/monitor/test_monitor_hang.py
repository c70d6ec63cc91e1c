"""Hang verdicts in the collector, end to end: a real 4-rank gloo job traced with the Tracer and
streaming to a real collector; one rank blocks on the host before its all_reduce. No one touches a
file: the collector suspects the hang from the tracers' heartbeats, asks for their hang reports,
runs ``laggard hang``'s analysis and publishes the verdict (API, alert, metrics); with
``abort_on_hang`` every hung rank exits with ``HANG_EXIT_CODE`` long before the gloo timeout.

The ranks are this file run as a script (``python test_monitor_hang.py RANK WORLD PORT URL JOB
TRACE STUCK_STEP FR ABORT``). The stuck rank prints ``stuck <unix time>`` when it stops.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")
pytest.importorskip("torch")

from laggard.collectives.launch import free_port  # noqa: E402
from tests.monitor_helpers import TOKEN, Server, sign_in, stopped_at  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WORLD = 4
STUCK = 2  # the rank that stops
GLOO_TIMEOUT_S = 240  # far beyond the test: an exit before it is the abort's doing
HANG_AFTER_S = 3  # the collector's suspicion (a real job: 30 s)
COLLECT_S = 8  # how long it waits for the ranks' reports after asking
VERDICT_WITHIN_S = 60  # the target: the verdict on the API and in an alert within 60 s of the stop

pytestmark = pytest.mark.timeout(240)


def _rank(rank: int, world: int, port: int, url: str, job: str, trace: Path, stuck_step: int, fr: bool,
          abort: bool) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    from laggard.tracer import Tracer
    from laggard.tracer.flight import enable
    from laggard.tracer.stream import StreamConfig

    if fr:
        enable(256)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    t = Tracer(trace, dp_rank=rank, align=None, handle_signals=False, monitor_url=url, token=TOKEN, monitor_job=job,
               monitor_config=StreamConfig(heartbeat_s=0.5), abort_on_hang=True if abort else None)
    x = torch.ones(64)
    for step in range(1000):
        with t.step(step):
            with t.op("forward-compute"):
                time.sleep(0.005)
            if rank == STUCK and step == stuck_step:
                print(f"stuck {time.time()}", flush=True)
                time.sleep(10 * GLOO_TIMEOUT_S)  # stuck on the host, before its all_reduce
            t.all_reduce(x, name="grads-all-reduce")
    t.close()


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hangmon")
    s = Server(str(tmp / "m.db"), tmp, extra=["--hang-after-s", str(HANG_AFTER_S),
                                              "--hang-collect-s", str(COLLECT_S)]).start()
    yield s
    s.stop()


def _start(srv: Server, tmp: Path, job: str, *, stuck_step: int, fr: bool, abort: bool) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    env.pop("TORCH_FR_BUFFER_SIZE", None)
    env.pop("TORCH_NCCL_TRACE_BUFFER_SIZE", None)
    port = free_port()
    return [subprocess.Popen([sys.executable, __file__, str(r), str(WORLD), str(port), srv.url, job, str(tmp / job),
                              str(stuck_step), str(int(fr)), str(int(abort))], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env) for r in range(WORLD)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def _verdict(srv: Server, job: str, stop_s: float) -> tuple[dict, dict, float]:
    """The /hang document and the hang alert, waited for until VERDICT_WITHIN_S after the stop."""
    deadline = stop_s + VERDICT_WITHIN_S
    doc = alert = None
    while time.time() < deadline:
        code, got = srv.request("GET", f"/api/v1/jobs/{job}/hang")
        if code == 200 and doc is None:
            doc = got
        if doc is not None:
            _, alerts = srv.request("GET", f"/api/v1/alerts?job={job}")
            alert = next((a for a in alerts if a["detail"].get("kind") == "hang" and "verdict" in a["detail"]), None)
            if alert is not None:
                break
        time.sleep(0.25)
    took = time.time() - stop_s
    assert doc is not None, f"no verdict within {VERDICT_WITHIN_S} s of the stop"
    assert alert is not None, f"no hang alert within {VERDICT_WITHIN_S} s of the stop"
    print(f"\n{job}: verdict and alert {took:.1f} s after the stop (published "
          f"{alert['detail']['verdict']['time_unix_s'] - stop_s:.1f} s after)")
    return doc, alert, took


def _banner(srv: Server) -> str | None:
    """The dashboard's hang banner as a browser shows it (None without Chromium)."""
    from laggard.report.browser import find_chromium, open_page

    if find_chromium()[0] is None:
        return None
    with open_page(viewport={"width": 1200, "height": 800}) as page:
        sign_in(page, srv.url)
        page.wait_for_selector("#banner .hangjob", timeout=20_000)
        return page.inner_text("#banner")


def test_a_rank_stuck_on_the_host_is_named_with_its_collective(srv, tmp_path):
    procs = _start(srv, tmp_path, "hang-fr", stuck_step=12, fr=True, abort=False)
    try:
        stop = stopped_at(procs, STUCK)
        doc, alert, _ = _verdict(srv, "hang-fr", stop)
        _, metrics = srv.request("GET", "/metrics")
        _, detail = srv.request("GET", "/api/v1/jobs/hang-fr")
        banner = _banner(srv)
    finally:
        _stop(procs)
    if banner is not None:  # (None: no Chromium here)
        assert f"job hang-fr: hang, culprit rank(s) {STUCK} at all_reduce seq {doc['seq']}" in banner, banner
    assert (doc["verdict"], doc["culprit_ranks"]) == ("hang", [STUCK]), doc["evidence"]
    assert doc["group_ranks"] == list(range(WORLD)) and doc["op"] == "all_reduce"
    assert doc["ranks"]["0"]["last_entered"]["seq"] == doc["seq"]  # the others wait in that collective
    assert doc["ranks"][str(STUCK)]["where"]["state"] == "compute"
    pub = alert["detail"]["verdict"]
    assert ((pub["culprit_ranks"], pub["op"], pub["seq"], pub["group"])
            == ([STUCK], "all_reduce", doc["seq"], doc["group"]))
    assert f"culprit rank(s) [{STUCK}] at all_reduce seq {doc['seq']}" in alert["message"]
    assert 'laggard_job_hung{job="hang-fr"} 1.0' in metrics
    assert f'laggard_hang_culprit{{job="hang-fr",rank="{STUCK}"}} 1.0' in metrics
    assert detail["hang_verdict"]["culprit_ranks"] == [STUCK] and detail["verdict"].startswith("hang")


def test_recorder_off_and_an_early_stop_the_tracer_states_give_the_verdict(srv, tmp_path):
    """No TORCH_FR_BUFFER_SIZE, and the rank stops in step 1 (the job is seconds old: it must be known
    to the collector from its heartbeats)."""
    procs = _start(srv, tmp_path, "hang-nofr", stuck_step=1, fr=False, abort=False)
    try:
        stop = stopped_at(procs, STUCK)
        doc, alert, _ = _verdict(srv, "hang-nofr", stop)
    finally:
        _stop(procs)
    assert (doc["verdict"], doc["culprit_ranks"]) == ("hang", [STUCK]), doc["evidence"]
    # the tracer's own numbering: the world group's 2nd call (step 0's all_reduce done, step 1's pending)
    assert (doc["group"], doc["group_ranks"], doc["op"], doc["seq"]) == ("world", list(range(WORLD)),
                                                                          "grads-all-reduce", 2)
    assert any("Flight Recorder off" in n for n in doc["notes"])
    assert alert["detail"]["verdict"]["culprit_ranks"] == [STUCK]


def test_abort_on_hang_ends_every_hung_rank_with_the_documented_code(srv, tmp_path):
    from laggard.tracer.abort import HANG_EXIT_CODE

    procs = _start(srv, tmp_path, "hang-abort", stuck_step=8, fr=True, abort=True)
    try:
        stop = stopped_at(procs, STUCK)
        codes = [p.wait(timeout=VERDICT_WITHIN_S + 30) for p in procs]
        took = time.time() - stop
        errs = [p.stderr.read() for p in procs]
    finally:
        _stop(procs)
    print(f"\nhang-abort: every rank exited {took:.1f} s after the stop (gloo timeout {GLOO_TIMEOUT_S} s)")
    assert codes == [HANG_EXIT_CODE] * WORLD, errs
    assert took < GLOO_TIMEOUT_S / 2
    for r, e in enumerate(errs):
        assert f"rank {r} has not moved since its hang report: aborting its process group and exiting with code " \
               f"{HANG_EXIT_CODE}" in e, e[-2000:]
        assert f"culprit rank(s) [{STUCK}]" in e
    code, doc = srv.request("GET", "/api/v1/jobs/hang-abort/hang")
    assert code == 200 and doc["culprit_ranks"] == [STUCK]
    # what was recorded up to the stop was written, with the reason
    import json

    st = json.loads((tmp_path / "hang-abort" / "rank0.state.json").read_text())
    assert st["status"] == "aborted: hang"


if __name__ == "__main__":
    a = sys.argv[1:]
    _rank(int(a[0]), int(a[1]), int(a[2]), a[3], a[4], Path(a[5]), int(a[6]), a[7] == "1", a[8] == "1")
