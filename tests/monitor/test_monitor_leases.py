"""Two in-process collectors on one SQLite database (``laggard.monitor.cluster``): one job's ranks post
half to each; the lease holder's window holds every rank's ops and its analysis covers them, the other
collector analyses nothing of it; a clean stop hands the job over at once."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="the monitor extra is not installed")

from laggard.groundtruth.synth import SynthConfig, synthesize  # noqa: E402
from laggard.monitor.config import MonitorConfig  # noqa: E402
from laggard.monitor.push import step_batches  # noqa: E402
from laggard.monitor.service import Collector  # noqa: E402
from laggard.monitor.store import Store  # noqa: E402
from laggard.wire.batch import encode_batch  # noqa: E402
from tests.monitor_helpers import until  # noqa: E402


def test_the_lease_holder_sees_the_batches_the_other_collector_stored(tmp_path):
    job = synthesize(SynthConfig(dp=2, pp=2, microbatches=2, steps=10, seed=3, name="split"))
    cfg = MonitorConfig(window_steps=4, refresh_every_steps=2, tick_s=0.05, analysis_process=False)
    a = Collector(Store(tmp_path / "m.db"), cfg, identity=("a", "http://a"))
    b = Collector(Store(tmp_path / "m.db"), cfg, identity=("b", "http://b"))
    a.start()
    b.start()
    meta = job.meta.to_json()
    seqs: dict[int, int] = {}
    try:
        for s, r, t in step_batches(job):  # ranks 0, 1 post to a (it sees the job first), 2, 3 to b
            seqs[r] = seqs.get(r, -1) + 1
            (a if r < 2 else b).ingest(encode_batch(t, job_id="split", rank=r, seq=seqs[r], meta=meta))
            if s == 0 and r == 0:
                assert a.cluster.owns("split")
        until(lambda: sorted(a.windows["split"].ranks) == [0, 1, 2, 3], 20, "a holding every rank")
        want = int(job.table.num_rows)
        until(lambda: a.windows["split"].num_ops == want, 20, "a holding every op")
        until(lambda: a.windows["split"].result is not None and a.windows["split"].result.steps[1] >= 8, 30,
               "a window analyzed by a")
        assert a.windows["split"].result.doc["num_workers"] == 4  # the ranks b stored are in it
        assert not b.cluster.owns("split") and b.windows["split"].result is None  # b analyses nothing of it
        assert b.detail("split")["analyzed_by"]["collector"] == "a"
        a.stop()  # a clean stop gives the lease up: b takes it at its next round and rebuilds the job
        until(lambda: b.cluster.owns("split"), 10, "b taking the job over")
        until(lambda: b.windows["split"].num_ops == want and b.windows["split"].result is not None, 30,
               "b's window of the whole job")
    finally:
        for c in (a, b):
            if not c._stop.is_set():
                c.stop()
