"""Host time inside a CPU rank's compute (``laggard.io.kineto.segments``): a profiler trace has no op
for a stall between two of a step's ops, and the segment that spans them must not read it as slower
compute.

The real case: a 4-rank DDP job (gloo, torch.profiler, ``tests/kineto_ddp.py``) whose rank 2 sleeps
40 ms per step between its forward and its backward, where no profiler op covers it. The stall is the
rank's untraced host time (a launch-delay finding naming rank 2, the what-if that removes host time
recovers it), never a slow worker. The same trace read with the stall kept inside the segment (the
importer before) names a slow worker: the check can fail.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from laggard.analysis.pipeline import analyze
from laggard.errors import LaggardWarning
from laggard.io import load_job
from laggard.io.kineto import segments
from tests.kineto_ddp import make_traces_in_subprocess

STALL_MS = 40.0
SLOW = 2


@pytest.fixture(scope="module")
def stall_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_traces_in_subprocess(tmp_path_factory.mktemp("ddp-mid-stall"), world=4, slow_rank=SLOW, steps=8,
                                     extra_matmuls=0, host_stall_ms=STALL_MS, stall_mid_step=True)


def _peers_s(gaps: dict[str, float]) -> float:
    """The other ranks' median untraced time per step: a machine busy with other work (the suite runs on
    two workers) deschedules every rank between its ops, and that time no op covers either."""
    return float(np.median([v for r, v in gaps.items() if r != str(SLOW)]))


def _over_peers_s(gaps: dict[str, float]) -> float:
    """The stalled rank's untraced time per step over its peers' (``_peers_s``)."""
    return gaps[str(SLOW)] - _peers_s(gaps)


def _analyze(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        return analyze(load_job(path))


def _said(res) -> list[tuple]:
    """The findings in short, each with the ranks it names (a finding's own repr is cut in a failure report)."""
    return [(f.cause, [w["rank"] for w in f.workers], f.ratio) for f in res.diagnosis.findings]


@pytest.mark.timeout(240)
def test_a_stall_between_two_ops_is_the_ranks_host_time(stall_dir: Path) -> None:
    res = _analyze(stall_dir)
    gaps = res.to_json()["untraced_gaps"]["per_rank_s_per_step"]
    assert _over_peers_s(gaps) > 0.8 * STALL_MS / 1e3, gaps
    assert all(v < 0.25 * STALL_MS / 1e3 + _peers_s(gaps) for r, v in gaps.items() if r != str(SLOW)), gaps
    top = res.diagnosis.findings[0]
    assert top.cause == "launch-delay" and [w["rank"] for w in top.workers] == [SLOW], _said(res)
    assert abs(res.replay_fidelity - 1) < 0.1, res.replay_fidelity
    if any(f.cause == "worker" for f in res.diagnosis.findings):
        # a known false alarm of the diagnosis: beside a host stall, now and then a second finding
        # names a healthy rank as a slow worker with the stalled one; the stall itself is read right above
        pytest.xfail(f"issue 60: a worker finding beside the stall: {_said(res)}, untraced time {gaps}")


@pytest.mark.timeout(240)
def test_kept_inside_the_segment_the_stall_reads_as_a_slow_worker(stall_dir: Path, monkeypatch) -> None:
    # the importer before: no idle gap is taken out of a segment, by its length or as a crumb's. The
    # forward before the sleep is 1-12% of the segment's busy time, near the crumb rule's 2%: on a busy
    # host half the steps went under it and their stalls were still taken out (CI read 22 ms over peers)
    monkeypatch.setattr(segments, "HOST_GAP_SHARE", np.inf)
    monkeypatch.setattr(segments, "_CRUMB_GAP_SHARE", np.inf)
    res = _analyze(stall_dir)
    gaps = res.to_json()["untraced_gaps"]["per_rank_s_per_step"]
    assert _over_peers_s(gaps) < 0.25 * STALL_MS / 1e3, gaps
    # the stall is rank 2's compute now, not its host time: a slow worker; on a busy host (two suite
    # workers and the job's four ranks on two cores) the other ranks' steps swing as much and the worker
    # detector's step-to-step check may not pass it, which leaves rank 2 named as unexplained (CI once)
    named = [f.cause for f in res.diagnosis.findings if [w["rank"] for w in f.workers] == [SLOW]]
    assert named and named[0] in ("worker", "unexplained"), _said(res)
    assert not any(f.cause == "launch-delay" and SLOW in [w["rank"] for w in f.workers]
                   for f in res.diagnosis.findings), _said(res)


def test_cut_stream_moves_only_large_inner_gaps_before_the_segment() -> None:
    # one stream, two steps of 100 us each: units 10 us long, 1 us apart; in step 0 a 30 us gap
    # (30% of the step) before the third unit; no collectives
    st = np.array([0, 11, 52, 63, 1000, 1011, 1022, 1033], float)
    en = st + 10
    sp = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    none = np.zeros(0)
    part, _, cut = segments._cut_stream(st, en, sp, none, none, np.zeros(0, np.int64), 0, 0, gpu=False,
                                        phase=np.ones(8, np.int8))
    _, step, start, dur, *_ = part
    assert step.tolist() == [0, 1]
    # step 0: spans 0..73 with a 31 us gap (units 2 and 3 start 31 us after unit 1 ended): 42 us of
    # compute starting after the gap; step 1 keeps its span (its 1 us gaps are the segment's work)
    assert start.tolist() == [31.0, 1000.0] and dur.tolist() == [42.0, 43.0]
    # the gap taken out (21..52 us) now lies before its segment, at its start: 0..31 us
    assert [c.tolist() for c in cut] == [[0], [21.0], [52.0], [0.0]]
    part, _, cut = segments._cut_stream(st, en, sp, none, none, np.zeros(0, np.int64), 0, 0, gpu=True,
                                        phase=np.ones(8, np.int8))
    assert part[3].tolist() == [40.0, 40.0]  # GPU streams: the busy time, as before
    assert all(len(c) == 0 for c in cut)
