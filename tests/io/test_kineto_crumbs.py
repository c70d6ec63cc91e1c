"""A launch delay inside a profiler trace's passes, against the Tracer's timers of the same run: a
real dp 1 x pp 3 gloo job (the demo job, 6 steps, 6 layers: two per stage) that sleeps 12 ms before
every forward and backward on every rank, traced by torch.profiler and by laggard's Tracer at once.

A CPU segment of the profiler trace spans its ops. The forward begins with the batch's slicing (a few
microseconds of ops), then the sleep, then the layers; the last stage's ends with the loss's item(),
the sleep before the backward, then autograd's ones_like for the loss's gradient (named like forward
work). Read whole, such segments count both sleeps as forward compute, the last stage's forward per
step comes out over twice the Tracer's, and the last stage is named heavy. A gap that cuts such
a crumb off a segment's end is host time (``segments._CRUMB_SHARE``). The Tracer's forward op starts
after the sleep: it is the yardstick here, an instrument the importer does not read.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from laggard.demo.launch import JobConfig, run_job
from laggard.groundtruth.inject import parse_injections

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("crumbs")
    cfg = JobConfig.quick(dp=1, pp=3, steps=6, num_layers=6, injections=parse_injections(["launch-delay:ms=12"]),
                          freeze_gc=True, trace_dir=str(base / "trace"), profiler_dir=str(base / "prof"))
    res = run_job(cfg)
    assert res.ok, res.failures
    return base


def _load(path: Path):
    from laggard.io import load_job

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gloo's collectives carry no process-group name
        return load_job(path)


def _ms_per_step(job, name: str) -> dict[int, float]:
    t = job.table
    rank, step, dur = t["rank"].to_numpy(), t["step"].to_numpy(), t["dur_ns"].to_numpy()
    on = np.asarray(t["name"].to_pylist()) == name
    num_steps = len(np.unique(step))
    return {int(r): float(dur[on & (rank == r)].sum()) / 1e6 / num_steps for r in np.unique(rank)}


def test_a_sleep_beside_a_crumb_is_not_forward_compute(run: Path) -> None:
    prof = _ms_per_step(_load(run / "prof"), "cpu-forward")
    tracer = _ms_per_step(_load(run / "trace"), "forward-compute")
    assert sorted(prof) == sorted(tracer) == [0, 1, 2]
    # 8 sleeps of 12 ms a step on the last stage were its "forward": 96 ms over (2.7x). Within 30%: on a
    # busy host descheduled time inside a pass is cut as idle from the profiler's segments and kept in
    # the Tracer's op (rank 2 68.6 against 86.6 ms a step beside two CPU-bound processes), or a sleep
    # is partly read as forward (rank 0 34.4 against 27.9 ms, once in a full local suite)
    for r in tracer:
        assert prof[r] == pytest.approx(tracer[r], rel=0.3, abs=5.0), (r, prof, tracer)


def test_the_stages_weigh_what_the_tracer_measures(run: Path) -> None:
    """What the stage detector reads: each stage's forward and backward compute over the others'. The
    last stage holds the LM head and the loss (1.1-1.2x here by the Tracer); both sleeps in its
    forwards made it 1.6x and more in the profiler trace."""
    prof, tracer = _load(run / "prof"), _load(run / "trace")
    p = {r: a + b for (r, a), b in zip(_ms_per_step(prof, "cpu-forward").items(),
                                      _ms_per_step(prof, "cpu-backward").values(), strict=True)}
    t = {r: a + b for (r, a), b in zip(_ms_per_step(tracer, "forward-compute").items(),
                                      _ms_per_step(tracer, "backward-compute").values(), strict=True)}
    last_p, last_t = p[2] / np.mean([p[0], p[1]]), t[2] / np.mean([t[0], t[1]])
    # (0.96 against 1.08 once on a busy run, see above; the sleeps made it 1.6x and more)
    assert last_p == pytest.approx(last_t, abs=0.2), (p, t)
