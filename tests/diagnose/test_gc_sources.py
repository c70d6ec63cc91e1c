"""Whether a stretched forward pass may be called GC depends on what the trace records
(``laggard.diagnose.gc``): a trace whose importer took every long pause inside an op out of it (CPU
profiler traces, ``HOST_GAP_CUT_KEY`` in the job's metadata) and that records no collection leaves
only the busy host to stretch a forward, so no GC is named there. On real 2-core profiler traces
(no GC injected in any of them) the rule took "gc" findings naming healthy ranks off 7 of 24 jobs
of the seed-2024 corpus and 1 of 64 of the 2026 corpus (job059); without it, the microbatches the
importer now finds made stalled forwards read as GC on more jobs still (job057 of the 2026 corpus,
a clean dp 1 x pp 3 job, and 12 of the 24)."""

from __future__ import annotations

import laggard
from laggard.groundtruth.dessim import SimConfig, parse_cause, simulate_with_truth, to_job
from laggard.optable.ops import HOST_GAP_CUT_KEY


def _gc_job():
    truth = simulate_with_truth(SimConfig(dp=4, pp=2, steps=3, seed=3), [parse_cause("gc-pauses:prob=0.1,pause_ms=60")],
                                alone_below=0.05)
    return to_job(truth.sim)


def test_forward_stalls_are_gc_where_pauses_stay_inside_the_ops():
    d = laggard.analyze(_gc_job()).diagnosis
    assert "gc" in {f.cause for f in d.findings}, d.findings


def test_forward_stalls_are_not_gc_where_the_importer_took_pauses_out():
    job = _gc_job()
    job.meta.extra[HOST_GAP_CUT_KEY] = 0.05
    d = laggard.analyze(job).diagnosis
    assert "gc" not in {f.cause for f in d.findings}, d.findings
