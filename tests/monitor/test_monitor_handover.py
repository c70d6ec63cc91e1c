"""A job's next collector goes on where its killed holder stopped (``laggard.monitor.handover``): two
in-process collectors on one SQLite database, one 4-rank job heartbeating. Collector a suspects a
hang, asks for reports, holds two of the four and is then killed (its thread stopped, its lease
left to expire). The ranks fail over to b, which takes the lease: it answers the same dump request,
holds the two reports a had, takes the last two, and its verdict has every rank (no rank missing);
the hang-suspected alert a fired is not fired again.

The ground truth is the reports themselves (rank 2 stuck in compute after 4 all-reduces, the others
inside the 5th: ``laggard hang``'s analysis of them, tested on real dumps in tests/hang, names rank 2).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from laggard.monitor.cluster import LeaseConfig  # noqa: E402
from laggard.monitor.config import MonitorConfig  # noqa: E402
from laggard.monitor.service import Collector  # noqa: E402
from laggard.monitor.store import Store  # noqa: E402
from tests.hang.test_hang import _state_only  # noqa: E402
from tests.monitor_helpers import until  # noqa: E402

pytestmark = pytest.mark.timeout(120)
JOB, WORLD = "handed", 4
META = {"name": JOB, "dp_size": WORLD, "pp_size": 1}


def _report(rank: int) -> bytes:
    return json.dumps(_state_only(rank, WORLD, 4 if rank == 2 else 5, pending=rank != 2,
                                  where="compute" if rank == 2 else "collective")).encode()


def _beat(c: Collector, rank: int) -> dict:
    # the ranks are alive and do not move: every heartbeat says the same progress
    return c.heartbeat(JOB, {"rank": rank, "state": {"progress": 10, "step": 4, "world_size": WORLD}, "meta": META})


def _crash(c: Collector) -> None:
    """What SIGKILL leaves: the collector stops, its lease is not given up (it expires)."""
    c._stop.set()
    c._wake.set()
    c._thread.join(10)


def test_the_next_collector_finishes_the_hang_verdict_and_does_not_alert_again(tmp_path):
    cfg = MonitorConfig(tick_s=0.05, analysis_process=False, hang_after_s=1.0, hang_collect_s=60.0,
                        lease=LeaseConfig(lease_s=2.0, renew_s=0.5, pull_margin_s=1.0))
    a = Collector(Store(tmp_path / "m.db"), cfg, identity=("a", "http://a"))
    b = Collector(Store(tmp_path / "m.db"), cfg, identity=("b", "http://b"))
    a.start()
    b.start()
    try:
        def beats_to(c: Collector) -> dict:
            return [_beat(c, r) for r in range(WORLD)][-1]

        until(lambda: beats_to(a)["dump_request"] == 1, 20, "a suspecting the hang and asking for reports")
        assert a.cluster.owns(JOB)
        for r in (0, 1):  # two ranks report before a dies
            assert a.add_report(JOB, 1, _report(r))["accepted"]
        _crash(a)

        # the ranks' heartbeats now reach b (their next address): b takes the expired lease
        until(lambda: beats_to(b) and b.cluster.owns(JOB), 20, "b taking the job's lease")
        win = b.windows[JOB]
        assert win.dump_request == 1 and sorted(win.hangs.reports) == [0, 1], "b goes on with a's request"
        assert beats_to(b)["dump_request"] == 1  # the ranks that reported are not asked again
        for r in (2, 3):
            assert b.add_report(JOB, 1, _report(r))["accepted"]
        pub = until(lambda: win.hangs.published, 10, "b's verdict")
        assert (pub["verdict"], pub["culprit_ranks"], pub["missing_ranks"]) == ("hang", [2], []), pub
        suspected = [x for x in b.store.alerts(JOB) if "hang suspected" in x["message"]]
        assert len(suspected) == 1, f"the hang-suspected alert fired again: {suspected}"
        assert b.store.hang_reports(JOB, 1) == [], "the reports go once the verdict has them"
    finally:
        b.stop()
        a.notifier.close()
        a.store.close()


def test_a_job_state_kept_by_an_older_holder_is_read_as_it_was_written(tmp_path):
    """What one collector keeps, another reads back the same (alert counts, fired alerts, seen findings)."""
    from laggard.monitor.alerts import RuleState

    st = RuleState()
    st.counts = {(JOB, "job-slow", ""): 2, ("other", "job-slow", ""): 5}
    st.fired = {(JOB, "hang", "")}
    st.seen_findings = {JOB: {"comm:wNone:sNone"}}
    kept = json.loads(json.dumps(st.of_job(JOB)))
    again = RuleState()
    again.counts = {(JOB, "job-slow", ""): 9}
    again.load_job(JOB, kept)
    assert again.counts == {(JOB, "job-slow", ""): 2} and again.fired == {(JOB, "hang", "")}
    assert again.seen_findings == {JOB: {"comm:wNone:sNone"}}
