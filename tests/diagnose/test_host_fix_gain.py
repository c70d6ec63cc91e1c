"""A host stall's fix, judged against the stall injected: a real ddp2 gloo job traced
with torch.profiler (the demo job, 10 steps) whose rank 1 sleeps 600 ms before every step's first
forward, a host stall every step pays (rank 0 waits for it in the gradient all-reduce).

The finding's what-if sets the stalled rank's host time to its peers' (``context.to_peers``), not to
its op type's median over every rank: that median includes the stalled rank, and with two ranks it lies
halfway, so the predicted speed-up would be about half of what removing the stall gains. The ground
truth is the stall the job was given: the time per step the fix removes (wall-clock step x (1 - 1 / its
predicted speed-up)) against the 600 ms slept (a clean twin run beside it is no steadier a yardstick:
two runs on this machine can differ by 10% of the step). On a busy machine rank 0 is descheduled too
(tens of ms per step beside a full suite run), which the trace shows as its own host time and which
removing the stall would not remove: with a stall several times that, the fix removes at least 60% of
it, where a job-wide median's fix removes about half. Beside another pytest worker's processes rank 0's
own host time can take a large share of a 300 ms stall, so the stall is 600 ms: the check is about the
fix, not the machine's load.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from laggard.demo.launch import JobConfig, run_job
from laggard.groundtruth.inject import parse_injections

pytestmark = pytest.mark.timeout(300)


def _run(base: Path, specs: list[str]) -> Path:
    cfg = JobConfig.quick(dp=2, pp=1, steps=10, injections=parse_injections(specs), freeze_gc=True,
                          trace_dir=str(base / "trace"), profiler_dir=str(base / "prof"))
    res = run_job(cfg)
    assert res.ok, res.failures
    return base / "prof"


def _analysis(path: Path):
    from laggard.analysis.pipeline import analyze
    from laggard.io import load_job

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gloo's collectives carry no process-group name
        return analyze(load_job(path))


STALL_S = 0.600


@pytest.fixture(scope="module")
def stalled(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 - an Analysis
    return _analysis(_run(tmp_path_factory.mktemp("host-fix"), [f"host-stall:rank=1,ms={1e3 * STALL_S:g},every=1"]))


def test_the_stall_fix_predicts_what_removing_the_stall_gains(stalled) -> None:  # noqa: ANN001
    found = [f for f in stalled.diagnosis.findings if f.cause == "launch-delay" and not f.hidden
             and [w["rank"] for w in f.workers] == [1]]
    assert found, [(f.cause, f.workers, f.evidence) for f in stalled.diagnosis.findings]
    step_s = float(np.median(stalled.step_wall_s))
    assert "--peer" in found[0].whatif, found[0].whatif
    removed_s = step_s * (1 - 1 / found[0].gain)
    assert 0.6 * STALL_S <= removed_s <= 1.3 * STALL_S, (removed_s, step_s, found[0].gain)
