"""Untraced host time is work of the rank that spends it (laggard.engine.gaps).

The real case: a 4-rank DDP job (gloo, torch.profiler) whose rank 2 sleeps 30 ms per step where no
profiler op covers it. The other ranks wait for it inside their all-reduces: they must not be blamed.
"""

from __future__ import annotations

import json
import shlex
import warnings
from pathlib import Path

import pytest

from laggard.analysis.pipeline import analyze
from laggard.engine.gaps import GapConfig, insert_host_gaps
from laggard.errors import LaggardWarning
from laggard.optable.ops import Job
from tests.conftest import job_from_rows, run_cli
from tests.kineto_ddp import make_traces_in_subprocess

STALL_MS = 30.0
SLOW = 2


@pytest.fixture(scope="module")
def stall_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_traces_in_subprocess(tmp_path_factory.mktemp("ddp-stall"), world=4, slow_rank=SLOW, steps=8,
                                     extra_matmuls=0, host_stall_ms=STALL_MS)


def _load(path: Path) -> Job:
    from laggard.io import load_job

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        return load_job(path)


@pytest.mark.timeout(240)
def test_host_stall_is_blamed_on_the_rank_that_spends_it(stall_dir: Path, tmp_path: Path) -> None:
    job = _load(stall_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        res = analyze(job)
    # the replay is the job: the stall is in the model, where it happened (without it fidelity is
    # > 1.2, next test). The 4 ranks start each step 3-9 ms apart (their optimizer tails differ on
    # 2 shared cores): compared with a per-step replay that starts them together, this job read
    # 0.926-0.979; replayed with its steps back to back (laggard.engine.replay_chain) it reads 1.00-1.01
    assert abs(res.replay_fidelity - 1) < 0.05, res.replay_fidelity
    # the stalling rank has the highest S_w, well above the others
    assert res.by_worker[0]["rank"] == SLOW, res.by_worker
    # (1.3x: the other ranks share 2 busy cores, their noise is real too)
    assert res.by_worker[0]["slowdown"] > 1.3 * res.by_worker[1]["slowdown"], res.by_worker
    top = res.diagnosis.findings[0]
    assert top.cause == "launch-delay" and [w["rank"] for w in top.workers] == [SLOW], top
    assert top.score > 0.5
    # time per rank in untraced gaps: the stall on rank 2, little elsewhere (waiting is not blamed)
    gaps = res.to_json()["untraced_gaps"]["per_rank_s_per_step"]
    assert gaps[str(SLOW)] > 0.8 * STALL_MS / 1e3, gaps
    assert all(v < 0.25 * STALL_MS / 1e3 for r, v in gaps.items() if r != str(SLOW)), gaps
    # the finding's what-if is one a user can run, and gives the same number
    # (the command carries the steps analyzed: warm-up steps are skipped)
    out = tmp_path / "w.json"
    cmd = shlex.split(top.command)
    assert cmd[:3] == ["laggard", "whatif", str(stall_dir)] and f"rank={SLOW},kind=host" in cmd, cmd
    assert run_cli(*cmd[1:], "--json", out) == 0
    assert json.loads(out.read_text())["speedup"] == pytest.approx(top.gain, rel=1e-9)


@pytest.mark.timeout(120)
def test_without_host_ops_the_same_job_is_misread(stall_dir: Path) -> None:
    """The check above can fail: the published method (gaps left out) misreads this job."""
    from laggard.engine.baseline import prepare
    from laggard.whatif.core import _analyze

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        res = _analyze(prepare(_load(stall_dir), GapConfig(enabled=False)))
    assert res.replay_fidelity > 1.2
    assert res.by_worker[0]["rank"] != SLOW or res.by_worker[0]["slowdown"] < 1.3 * res.by_worker[1]["slowdown"]


def test_gap_rules_on_a_known_job() -> None:
    # rank 0 stalls 20 ms before its compute and 5 ms before the all-reduce, which rank 1 waits
    # for inside the op (no gap); between the steps rank 0 idles 55 ms, rank 1 35 ms
    rows = []
    for step, t0 in ((0, 0.0), (1, 100.0)):
        rows += [
            (0, step, "fwd", "compute", t0 + 20, 30, None, -1),
            (0, step, "ar", "collective", t0 + 55, 10, "dp", step),
            (1, step, "fwd", "compute", t0, 30, None, -1),
            (1, step, "ar", "collective", t0 + 30, 35, "dp", step),  # waits 25 ms for rank 0
        ]
    job = job_from_rows(rows)
    out, summary = insert_host_gaps(job, GapConfig(min_share_of_step=0.02))
    per = dict(zip(summary.ranks.tolist(), (summary.idle_s / 2).tolist(), strict=True))
    # rank 0: 20 ms before fwd in step 0 (the step began on rank 1), 55 ms between the steps,
    # and 5 ms before each all-reduce after rank 1 had started it; rank 1: 35 ms between steps
    assert per[0] == pytest.approx((20 + 5 + 55 + 5) / 2 / 1e3)
    assert per[1] == pytest.approx(35 / 2 / 1e3)
    assert out.num_ops > job.num_ops
    names = set(out.table.column("name").to_pylist())
    assert {"host:fwd[0]", "host:ar[0]"} <= names
    # the analysis keeps rank 0's stall where it was: the replay is the job
    res = analyze(job)
    assert abs(res.replay_fidelity - 1) < 0.01
    assert res.by_worker[0]["rank"] == 0


def test_waiting_for_a_late_peer_is_not_host_time() -> None:
    # a receive recorded only once its data arrives (idle before it = waiting for the sender)
    rows = [
        (0, 0, "fwd", "compute", 0, 50, None, -1),
        (0, 0, "send", "p2p_send", 50, 1, "p", 0),
        (1, 0, "prep", "compute", 0, 5, None, -1),
        (1, 0, "recv", "p2p_recv", 50, 1, "p", 0),
        (1, 0, "fwd", "compute", 51, 50, None, -1),
    ]
    job = job_from_rows(rows)
    _, summary = insert_host_gaps(job)
    assert summary.idle_s.tolist() == [0.0, 0.0]


def test_published_traces_keep_their_gaps_out(analyses) -> None:
    for res in analyses.values():
        g = res.to_json()["untraced_gaps"]
        assert g["num_positions"] == 0 and g["num_host_ops"] == 0


def test_ungrouped_comm_is_not_blamed() -> None:
    rows = [
        (0, 0, "fwd", "compute", 0, 10, None, -1),
        (0, 0, "tp-ar", "collective", 40, 1, None, -1),  # 30 ms idle before an unmatched collective
        (1, 0, "fwd", "compute", 0, 41, None, -1),
    ]
    _, summary = insert_host_gaps(job_from_rows(rows))
    assert summary.idle_s.tolist() == [0.0, 0.0]


def test_synth_tables_with_not_null_fields_take_host_ops():
    """laggard synth writes not-null fields; the host ops' table is nullable: they must concatenate
    (a launch delay big enough to become host ops puts both in one table, and a nullability mismatch
    fails with ArrowInvalid)."""
    from laggard.analysis.pipeline import analyze
    from laggard.groundtruth.inject import parse_injection
    from laggard.groundtruth.synth import SynthConfig, synthesize_with_truth

    truth = synthesize_with_truth(SynthConfig(dp=4, pp=2, microbatches=4, steps=4, seed=739805459),
                                  [parse_injection("launch-delay:ms=4.81")])
    res = analyze(truth.job)
    assert res.base is not None and res.base.gaps.num_ops > 0


def test_order_is_lexsort_when_the_keys_do_not_fit_one_int64():
    import numpy as np

    from laggard.engine.sorting import lex_order as _order

    rng = np.random.default_rng(5)
    n = 4000
    step, group, seq = rng.integers(0, 3, n), rng.integers(0, 50, n), rng.integers(0, 4, n)
    for start in (rng.integers(0, 10, n), rng.integers(0, 2**60, n)):  # packed whole, and not
        assert np.array_equal(_order(step, group, seq, start), np.lexsort((start, seq, group, step)))
    wide = rng.integers(0, 2**61, n)
    assert np.array_equal(_order(wide, wide, step), np.lexsort((step, wide, wide)))
    neg, frac = rng.integers(-5, 5, n), rng.random(n) * 3  # negative keys; a float key is sorted as it is
    assert np.array_equal(_order(neg, group, frac), np.lexsort((frac, group, neg)))


def test_only_instances_with_a_gap_are_sorted_and_the_result_is_the_same(monkeypatch):
    """``_exclude_waits`` sorts only the (step, group, seq) instances where some participant has host
    time; on random collectives and transfers it gives what sorting every instance gives."""
    import numpy as np

    from laggard.engine import gaps as G

    rng = np.random.default_rng(11)
    rows = []
    for step in range(3):
        for seq in range(40):
            group = f"g{rng.integers(0, 6)}"
            for r in rng.choice(8, size=int(rng.integers(2, 5)), replace=False):
                rows.append((int(r), step, "ar", "collective", float(rng.integers(0, 50)) + 100 * step, 1, group, seq))
        for r in range(8):
            rows.append((r, step, "fwd", "compute", 100 * step + float(rng.integers(0, 30)), 5, None, -1))
    job = job_from_rows(rows)
    _, op_step = G.unique_inverse(job.column("step"))
    start = job.column("start_ns").astype(np.int64)
    host = np.where(rng.random(job.num_ops) < 0.1, rng.integers(1, 10**6, job.num_ops), 0)
    fast = G._exclude_waits(job, op_step, start, host)
    assert (fast > 0).any()
    monkeypatch.setattr(G, "_groups_with_gaps", lambda *a: None)  # every instance sorted
    assert np.array_equal(fast, G._exclude_waits(job, op_step, start, host))
    monkeypatch.setattr(G, "_instance_keys", lambda *a: (None, 0))  # keys too wide to pack: sorted by three
    assert np.array_equal(fast, G._exclude_waits(job, op_step, start, host))
