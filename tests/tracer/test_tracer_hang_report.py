"""The tracer's side of hang verdicts, in one process: the report with the recorder off, the size
bound on reports, and when a published verdict ends a rank (the real jobs: tests/monitor/test_monitor_hang.py)."""

from __future__ import annotations

import json

import pytest

from laggard.tracer import Tracer, abort, flight
from laggard.tracer.stream import fit_report


def test_report_with_the_recorder_off_is_the_tracer_state(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    t = Tracer(tmp_path / "trace", rank=0, world_size=1, align=None, handle_signals=False)
    try:
        for s in range(3):
            with t.step(s), t.op("forward-compute"):
                pass
        rep = flight.report(t, "test")
    finally:
        t.close()
    extra = rep["laggard"]
    assert rep["entries"] == [] and extra["fr"] is False and extra["rank"] == 0 and extra["world_size"] == 1
    assert extra["step"] == 2 and extra["comm"] is None and extra["progress"] >= 3
    assert extra["where"]["state"] == "compute"  # the main thread, seen from here
    written = json.loads((tmp_path / "trace" / "flight-rank0.json").read_text())  # `laggard hang` reads it too
    assert written["laggard"]["fr"] is False


def test_reports_are_bounded_newest_entries_kept():
    data = {"version": "2.10", "entries": [{"record_id": i, "pad": "x" * 100} for i in range(1000)], "laggard": {}}
    body = fit_report(data, 20_000)
    assert body is not None and len(body) <= 20_000
    kept = [e["record_id"] for e in json.loads(body)["entries"]]
    assert kept and kept[-1] == 999 and kept == list(range(kept[0], 1000))
    assert fit_report({"entries": [], "laggard": {"pad": "x" * 100}}, 50) is None


@pytest.mark.parametrize(("verdict", "opted_in", "expected"), [
    ({"verdict": "hang", "suspected": True}, True, True),
    ({"verdict": "hang", "suspected": True}, None, False),  # the collector's rule did not ask
    ({"verdict": "hang", "suspected": True, "abort": True}, None, True),  # ... here it did
    ({"verdict": "hang", "suspected": True, "abort": True}, False, False),  # the job said never
    ({"verdict": "hang", "suspected": False, "abort": True}, True, False),  # an operator's dump: not a hang
    ({"verdict": "straggling", "suspected": True}, True, False),
    ({"verdict": "missing-ranks", "suspected": True}, True, True),
])
def test_which_verdicts_end_a_rank(verdict, opted_in, expected):
    assert abort.should_abort(verdict, opted_in=opted_in) is expected
