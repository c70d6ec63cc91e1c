"""The collector's side of runtime actions: the kill switch (PATCH {"act": false}), the action log the
dashboard shows, and a drain forwarded to the webhooks; with a real Controller polling a real server."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from laggard.groundtruth.synth import SynthConfig, synthesize  # noqa: E402
from laggard.mitigate import Controller  # noqa: E402
from laggard.wire.batch import CONTENT_TYPE, encode_batch  # noqa: E402
from tests.monitor_helpers import TOKEN, Server  # noqa: E402


def test_kill_switch_and_action_log(tmp_path):
    job = synthesize(SynthConfig(dp=2, pp=1, microbatches=2, steps=3, seed=1, name="actjob"))
    srv = Server(str(tmp_path / "m.db"), tmp_path).start()
    try:
        t = job.table.slice(0, 4)
        b = encode_batch(t, job_id="actjob", rank=0, seq=0, meta=job.meta.to_json())
        assert srv.request("POST", "/api/v1/ops", b, content_type=CONTENT_TYPE)[0] == 200
        assert srv.request("GET", "/api/v1/jobs/actjob")[1]["act"] is True
        assert srv.request("PATCH", "/api/v1/jobs/actjob", json.dumps({"act": "no"}).encode())[0] == 422
        assert srv.request("PATCH", "/api/v1/jobs/nosuch", json.dumps({"act": False}).encode())[0] == 404
        assert srv.request("POST", "/api/v1/jobs/actjob/actions", b'{"a": 1}')[0] == 400
        ctl = Controller(global_batch=8, dp_rank=0, dp_size=2, collector_url=srv.url, job_id="actjob", token=TOKEN)
        ctl.link.stop()
        ctl.link.poll()
        assert ctl.link.act is True
        status, ans = srv.request("PATCH", "/api/v1/jobs/actjob", json.dumps({"act": False}).encode())
        assert status == 200 and ans == {"id": "actjob", "act": False}
        ctl.link.poll()
        assert ctl.link.act is False, "the controller sees the kill switch"
        drain = {"step": 9, "kind": "drain", "ranks": [1], "reason": "too slow", "step_s_before": 0.5,
                 "step_s_after": None}
        ctl.link.post_actions([drain])
        detail = srv.request("GET", "/api/v1/jobs/actjob")[1]
        assert detail["act"] is False and detail["actions"] == [drain]
        alerts = srv.request("GET", "/api/v1/alerts?job=actjob")[1]
        assert any(a["rule"] == "act-drain" for a in alerts)
        ctl.close()
    finally:
        srv.stop()
