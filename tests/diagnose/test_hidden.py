"""The hidden-straggler pass (laggard.diagnose.hidden) on real traces it once got wrong.

Two runs of a real 4-rank DDP job (gloo, torch.profiler) whose rank 2 stalls 30 ms per step outside
every traced op. With rank 2's stall fixed, the detectors nominated the overhead every rank pays
(``--zero kind=host`` on every rank); replayed on the measured job that what-if zeroed rank 2's
stall as well, took its gain and came first, naming the healthy rank 1 (run a) or 0 (run b).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from laggard.analysis.pipeline import analyze
from laggard.errors import LaggardWarning
from laggard.io import load_job

KINETO = Path(__file__).parents[1] / "data" / "kineto"
SLOW = 2


@pytest.mark.parametrize("run", ["ddp_host_stall_a", "ddp_host_stall_b"])
def test_only_the_stalling_rank_is_named(run: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        res = analyze(load_job(KINETO / run))
    findings = res.diagnosis.findings
    top = findings[0]
    assert top.cause == "launch-delay" and [w["rank"] for w in top.workers] == [SLOW], findings
    named = {w["rank"] for f in findings for w in f.workers}
    assert named == {SLOW}, findings
    # a hidden cause's what-if never fixes a found one again
    for f in findings:
        if f.hidden:
            assert f"rank!={SLOW}" in " ".join(f.whatif), f
