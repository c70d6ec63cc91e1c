"""Empirical worker-time distributions from a trace: extraction, decomposition, projection."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from laggard.errors import LaggardError, LaggardWarning
from laggard.optable.ops import make_table
from laggard.simulate.empirical import EmpiricalTrace, from_table, worker_times
from laggard.simulate.policies import compare_policies
from laggard.simulate.tail import tail_at_scale

AR_TRACE = Path(__file__).parents[1] / "data" / "ndtimeline" / "trace-AR.parquet"

OFFSETS_S = np.array([1.0, 1.0, 1.0, 2.0])
NUM_STEPS = 10


def _table(*, drop_cell: tuple[int, int] | None = None, seed: int = 0):
    """4 workers x 10 steps: per (rank, step) a forward and a backward compute op that sum to
    offset + step effect + noise, plus a collective that must be ignored."""
    rng = np.random.default_rng(seed)
    step_eff = rng.normal(0, 0.05, NUM_STEPS)
    noise = rng.normal(0, 0.02, (4, NUM_STEPS))
    cols: dict[str, list] = {k: [] for k in ("rank", "pp_rank", "step", "name", "kind", "start_ns", "dur_ns")}
    truth = np.zeros((4, NUM_STEPS))
    for w in range(4):
        for s in range(NUM_STEPS):
            if drop_cell == (w, s):
                continue
            total = OFFSETS_S[w] + step_eff[s] + noise[w, s]
            truth[w, s] = total
            fwd = round(total * 0.4e9)
            bwd = round(total * 1e9) - fwd
            for name, kind, dur in (("forward-compute", "compute", fwd), ("backward-compute", "compute", bwd),
                                    ("grads-reduce-scatter", "collective", 7_000_000_000)):
                cols["rank"].append(w)
                cols["pp_rank"].append(w // 2)
                cols["step"].append(100 + s)
                cols["name"].append(name)
                cols["kind"].append(kind)
                cols["start_ns"].append(0)
                cols["dur_ns"].append(dur)
    return make_table({k: np.asarray(v) if k not in ("name", "kind") else v for k, v in cols.items()}), truth


def test_worker_times_sum_compute_ops_per_rank_and_step() -> None:
    table, truth = _table()
    wt = worker_times(table)
    assert wt.times_s.shape == (4, NUM_STEPS)
    assert np.allclose(wt.times_s, truth, atol=1e-8)
    assert list(wt.ranks) == [0, 1, 2, 3]
    assert wt.measured_barrier_s() == pytest.approx(truth.max(axis=0).mean())
    fwd = worker_times(table, names=["forward-compute"])
    assert np.allclose(fwd.times_s, truth * 0.4, atol=1e-8)
    ops = worker_times(table, level="op", names=["backward-compute"])
    assert np.allclose(ops.times_s, truth * 0.6, atol=1e-8)


def test_decomposition_into_offsets_step_effects_and_noise() -> None:
    table, truth = _table()
    d = from_table(table, path="synthetic")
    assert isinstance(d, EmpiricalTrace)
    assert np.allclose(d.offsets_s, truth.mean(axis=1))
    assert np.allclose(d.offsets_s, OFFSETS_S, atol=0.05)
    # the three parts add back up to the measurements
    rebuilt = d.offsets_s[:, None] + d.step_effects_s[None, :] + d.noise_s.reshape(4, NUM_STEPS)
    assert np.allclose(rebuilt, truth)
    assert abs(d.noise_s.mean()) < 1e-12 and abs(d.step_effects_s.mean()) < 1e-12
    assert d.info["slowest_worker_rank"] == 3
    assert d.mean() == pytest.approx(truth.mean())
    assert "synthetic" in d.describe()


def test_jobs_tile_the_measured_workers() -> None:
    table, _ = _table()
    d = from_table(table)
    rng = np.random.default_rng(0)
    x = d.sample_jobs(rng, 5000, 8)  # twice the measured job: two copies of every worker
    assert x.shape == (5000, 8)
    assert np.all(x.max(axis=1) > 1.8)  # the slow worker is always there
    assert np.mean(x > 1.5) == pytest.approx(2 / 8, abs=1e-9)
    x3 = d.sample_jobs(rng, 20_000, 3)  # a partial job: a random subset of distinct workers
    assert np.mean((x3 > 1.5).sum(axis=1)) == pytest.approx(3 / 4, abs=0.02)
    assert ((x3 > 1.5).sum(axis=1) <= 1).all()
    steps = d.sample_steps(rng, 3, 50, 4)
    assert steps.shape == (3, 50, 4)
    assert np.all(steps[:, :, 3] > 1.5)  # persistent: worker 3 of every run is slow at every step
    iid = d.sample(rng, 40_000)
    assert np.mean(iid > 1.5) == pytest.approx(0.25, abs=0.01)
    assert (iid >= d.floor_s).all()


def test_simulated_barrier_at_the_measured_size_reproduces_the_trace() -> None:
    table, truth = _table()
    d = from_table(table)
    res = tail_at_scale(d, [4, 16, 64], num_trials=20_000, seed=0, reference_workers=4)
    assert res.rows[0].vs_reference == 1.0
    assert res.rows[0].mean == pytest.approx(truth.max(axis=0).mean(), rel=0.01)
    # more workers: more draws of the slow worker's noise, a slightly longer barrier
    assert 1.0 < res.rows[1].vs_reference < res.rows[2].vs_reference < 1.1
    assert res.rows[0].exact_mean is None


def test_missing_cells_drop_the_step_with_a_warning() -> None:
    table, truth = _table(drop_cell=(2, 5))
    with pytest.warns(LaggardWarning, match="left out 1 of 10 steps"):
        wt = worker_times(table)
    assert wt.times_s.shape == (4, 9)
    assert wt.num_dropped == 1


def test_trace_errors() -> None:
    table, _ = _table()
    with pytest.raises(LaggardError, match="no compute ops named nope"):
        worker_times(table, names=["nope"])
    with pytest.raises(LaggardError, match="level must be"):
        worker_times(table, level="microbatch")
    one = make_table({"rank": np.zeros(3, int), "step": np.arange(3), "name": ["f"] * 3, "kind": ["compute"] * 3,
                      "start_ns": np.zeros(3, int), "dur_ns": np.ones(3, int)})
    with pytest.raises(LaggardError, match="one worker"):
        worker_times(one)


@pytest.mark.skipif(not AR_TRACE.exists(), reason="shipped trace missing")
def test_projection_of_the_shipped_ar_trace() -> None:
    from laggard.simulate.empirical import trace_distribution

    d = trace_distribution(AR_TRACE)
    assert d.num_workers == 16
    assert d.info["slowest_worker_rank"] == 0
    measured = d.info["measured_barrier_s"]
    res = tail_at_scale(d, [16, 64, 256], num_trials=4000, seed=0, reference_workers=16)
    one_x, four_x, sixteen_x = res.rows
    assert one_x.mean == pytest.approx(measured, rel=0.005)
    # worker 0 (about 2.3x the others) sets the barrier at every size: growing the job keeps the
    # same share of slow workers and adds only their noise
    assert 1.0 <= four_x.vs_reference <= sixteen_x.vs_reference < 1.02
    assert sixteen_x.slowdown > 2.0
    pol = compare_policies(d, 64, ["bsp", "backup:1", "drop:4"], num_trials=2000, seed=0)
    # dropping the 4 slowest of 64 drops the 4 copies of the slow worker
    assert pol.row("drop:4").barrier_cut > 0.5
    assert pol.row("backup:1").barrier_cut > 0.3


def test_persistent_straggler_defeats_staleness_but_not_dynamic_assignment() -> None:
    """A worker that is always 2x slower: SSP/async cannot hide it (it falls behind without
    bound), work handed out dynamically can (the others take its pieces)."""
    table, _ = _table()
    d = from_table(table)
    res = compare_policies(d, 8, ["bsp", "ssp:4", "async", "overdecomp:8"], num_trials=4000, num_steps=50, seed=1)
    assert res.row("ssp:4").verdict.startswith("no real gain")
    assert res.row("async").verdict.startswith("no real gain")
    assert res.row("async").mean == pytest.approx(2.0, rel=0.02)  # the slow worker's own pace
    # 64 pieces of 1/8 step; 6 workers run a piece in 1/8, the 2 slow ones in 2/8: total rate
    # 6 + 2 x 1/2 = 7 steps' worth per unit time, so >= 8/7, plus at most one slow piece at the end
    assert res.row("overdecomp:8").barrier_cut > 0.25
    assert 8 / 7 * 0.98 < res.row("overdecomp:8").mean < 8 / 7 + 2 / 8
