"""A real Prometheus (Debian's `prometheus`) scrapes a real collector with the bearer token from the
shipped scrape config (`deploy/prometheus/prometheus.yml`); every metric the docs name and every
query of the shipped Grafana dashboard (`deploy/grafana/laggard-dashboard.json`) returns data through
PromQL. Grafana itself is not available here: its queries are run against this Prometheus."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from laggard.collectives.launch import free_port  # noqa: E402
from laggard.groundtruth.synth import SynthConfig, synthesize  # noqa: E402
from laggard.monitor.push import step_batches  # noqa: E402
from laggard.wire.batch import CONTENT_TYPE, encode_batch  # noqa: E402
from tests.monitor_helpers import TOKEN, Server  # noqa: E402

ROOT = Path(__file__).parents[2]
PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.skipif(PROMETHEUS is None,
                       reason="Debian's prometheus is not installed (`make sysdeps` installs it as root)"),
    pytest.mark.timeout(240),
]


def _query(url: str, expr: str) -> list:
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10) as r:
        doc = json.loads(r.read())
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def _wait(url: str, expr: str, timeout_s: float = 90.0) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        res = _query(url, expr)
        if res:
            return res
        time.sleep(1.0)
    raise AssertionError(f"no data for {expr!r} within {timeout_s:.0f} s")


def _documented_metrics() -> list[str]:
    """The metrics the live monitor's guide page names (docs/guide/monitor.md)."""
    text = (ROOT / "docs" / "guide" / "monitor.md").read_text()
    names = sorted(set(re.findall(r"`(laggard_[a-z_]+)`", text)))
    assert len(names) >= 4, names
    return names


def _push(srv: Server, job_id: str, *, steps: int, pause_s: float = 0.0, stop: threading.Event | None = None) -> None:
    """A synthetic 2 x 2 job's ops, one step's batches at a time (until ``stop`` is set)."""
    job = synthesize(SynthConfig(dp=2, pp=2, microbatches=4, steps=steps, seed=3, name=job_id))
    seqs: dict[int, int] = {}
    last = None
    for step, r, t in step_batches(job):
        if pause_s and last is not None and step != last:
            if stop is not None and stop.wait(pause_s):
                return
            time.sleep(0 if stop is not None else pause_s)
        last = step
        seqs[r] = seqs.get(r, -1) + 1
        body = encode_batch(t, job_id=job_id, rank=r, seq=seqs[r], meta=job.meta.to_json())
        assert srv.request("POST", "/api/v1/ops", body, content_type=CONTENT_TYPE)[0] == 200


def _hang(srv: Server) -> None:
    """A 4-rank job whose heartbeats go on while no rank moves: suspected, its ranks' reports (the
    tracer states, rank 2 stuck before the 5th all_reduce) give a hang verdict naming rank 2."""
    from tests.hang.test_hang import _state_only

    meta = {"name": "hungjob", "dp_size": 4, "pp_size": 1}
    deadline = time.monotonic() + 60
    ans: dict = {}
    while ans.get("dump_request", 0) < 1 and time.monotonic() < deadline:
        for r in range(4):
            body = {"rank": r, "state": {"world_size": 4, "step": 3, "progress": 10}, "meta": meta}
            ans = srv.request("POST", "/api/v1/jobs/hungjob/heartbeat", json.dumps(body).encode())[1]
        time.sleep(0.3)
    for r in range(4):
        rep = _state_only(r, 4, 4 if r == 2 else 5, pending=r != 2, where="compute" if r == 2 else "collective")
        assert srv.request("POST", "/api/v1/jobs/hungjob/flight?request=1", json.dumps(rep).encode())[0] == 200
    assert srv.wait_for(lambda d: True, "/api/v1/jobs/hungjob/hang", timeout_s=30)["culprit_ranks"] == [2]


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    """A collector holding one analyzed job, and Prometheus scraping it every second."""
    tmp = tmp_path_factory.mktemp("prom")
    srv = Server(str(tmp / "m.db"), tmp, extra=["--window-steps", "4", "--hang-after-s", "2"]).start()
    prom_proc = None
    try:
        _push(srv, "promjob", steps=8)
        srv.wait_for(lambda d: d["window"] is not None, "/api/v1/jobs/promjob")
        _hang(srv)
        # the shipped scrape config, pointed at this collector, its token file and a 1 s interval
        cfg = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
        good = cfg["scrape_configs"][0]
        (tmp / "laggard.token").write_text(TOKEN + "\n")
        (tmp / "wrong.token").write_text("not-the-token-0123456789\n")
        good["authorization"]["credentials_file"] = str(tmp / "laggard.token")
        good["static_configs"] = [{"targets": [f"127.0.0.1:{srv.port}"]}]
        bad = json.loads(json.dumps(good))
        bad["job_name"] = "laggard-wrong-token"
        bad["authorization"]["credentials_file"] = str(tmp / "wrong.token")
        cfg["global"]["scrape_interval"] = "1s"
        cfg["scrape_configs"] = [good, bad]
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        port = free_port()
        prom_proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                                     stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "wb"))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or prom_proc.poll() is not None:
                    raise AssertionError((tmp / "prometheus.log").read_text()[-2000:]) from None
                time.sleep(0.5)
        _wait(url, 'up{job="laggard"} == 1')
        # a job streaming while Prometheus scrapes (rates and latency quantiles need ingest in their range)
        stop = threading.Event()
        live = threading.Thread(target=_push, args=(srv, "livejob"),
                                kwargs={"steps": 1000, "pause_s": 0.3, "stop": stop}, daemon=True)
        live.start()
        time.sleep(5)  # a few scrapes: rate() over [1m] needs two samples
        yield url
        stop.set()
        live.join(60)
    finally:
        if prom_proc is not None:
            prom_proc.terminate()
            prom_proc.wait(30)
        srv.stop()


def test_prometheus_scrapes_with_the_bearer_token(prom: str) -> None:
    assert _query(prom, 'up{job="laggard"}')[0]["value"][1] == "1"
    # the token is what lets it in: the same config with another token cannot scrape
    assert _wait(prom, 'up{job="laggard-wrong-token"}')[0]["value"][1] == "0"


def test_every_documented_metric_has_data(prom: str) -> None:
    for name in _documented_metrics():
        expr = name if not name.endswith("_seconds") else f"{name}_count"
        res = _wait(prom, f'{expr}{{job="laggard"}}')
        assert all(float(r["value"][1]) == float(r["value"][1]) for r in res), (name, res)
    slow = _query(prom, 'laggard_job_slowdown{job="laggard",exported_job="promjob"}')
    assert slow and float(slow[0]["value"][1]) > 1.0, slow
    hung = _query(prom, 'laggard_hang_culprit{job="laggard",exported_job="hungjob"}')
    assert [r["metric"]["rank"] for r in hung] == ["2"], hung


def test_every_grafana_query_returns_data(prom: str) -> None:
    dash = json.loads((ROOT / "deploy" / "grafana" / "laggard-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 6
    for expr in exprs:
        res = _wait(prom, expr, timeout_s=60)
        assert any(r["value"][1] not in ("NaN", "+Inf", "-Inf") for r in res), (expr, res)


def test_a_query_for_a_metric_that_does_not_exist_is_empty(prom: str) -> None:
    """The checks above can fail: a name the collector does not export has no data."""
    assert _query(prom, "laggard_no_such_metric") == []
