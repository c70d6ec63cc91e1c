"""``window.load_ratios`` against a per-worker computation written out in plain Python here."""

from __future__ import annotations

import statistics
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest

from laggard.groundtruth.synth import SynthConfig, synthesize
from laggard.monitor.window import load_ratios
from laggard.optable.ops import make_table


def _reference(table: pa.Table) -> dict[int, float]:
    """Per worker: the median over the steps it computed in of its compute time per step, over the
    median of the same for its stage's other workers (workers alone in their stage left out)."""
    rows = table.select(["rank", "step", "pp_rank", "kind", "dur_ns"]).to_pylist()
    per: dict[int, dict[int, float]] = defaultdict(dict)
    stage: dict[int, int] = {}
    for r in rows:
        if r["kind"] != "compute":
            continue
        steps = per[r["rank"]]
        steps[r["step"]] = steps.get(r["step"], 0.0) + float(r["dur_ns"])
        stage[r["rank"]] = r["pp_rank"]
    load = {w: statistics.median(s.values()) for w, s in per.items()}
    out = {}
    for w in load:
        peers = [load[p] for p in load if p != w and stage[p] == stage[w]]
        if peers and statistics.median(peers) > 0:
            out[w] = load[w] / statistics.median(peers)
    return out


def _check(table: pa.Table) -> dict[int, float]:
    got, want = load_ratios(table), _reference(table)
    assert got.keys() == want.keys()
    for w, v in want.items():
        assert got[w] == pytest.approx(v, rel=1e-12), w
    return got


def test_a_slow_worker_of_a_data_parallel_job_and_its_healthy_peers():
    n_ranks, n_steps, mb = 16, 6, 4
    rank = np.repeat(np.arange(n_ranks), n_steps * mb)
    step = np.tile(np.repeat(np.arange(n_steps), mb), n_ranks)
    rng = np.random.default_rng(1)
    dur = rng.integers(900, 1100, len(rank)) * np.where(rank == 5, 1.3, 1.0)
    table = make_table({"rank": rank, "step": step, "pp_rank": np.zeros_like(rank), "kind": ["compute"] * len(rank),
                        "name": ["fwd"] * len(rank), "start_ns": np.arange(len(rank)) * 10_000,
                        "dur_ns": dur.astype(np.int64)})
    got = _check(table)
    assert max(got, key=got.get) == 5 and got[5] == pytest.approx(1.3, rel=0.05)


@pytest.mark.parametrize("seed", range(6))
def test_pipeline_jobs_with_workers_missing_from_steps(seed):
    """Stages are each other's strangers; a worker absent from some steps takes the median of the
    steps it ran in; a stage with one worker is left out."""
    rng = np.random.default_rng(seed)
    dp = 1 if seed == 0 else int(rng.integers(2, 5))
    job = synthesize(SynthConfig(dp=dp, pp=int(rng.integers(1, 4)), microbatches=2, steps=int(rng.integers(3, 8)),
                                 seed=seed))
    table = job.table
    if seed % 2:  # ops dropped at random, and every op of rank 1 in the second step
        rank, step = table.column("rank").to_numpy(), table.column("step").to_numpy()
        keep = (rng.random(table.num_rows) > 0.3) & ~((rank == 1) & (step == np.unique(step)[1]))
        table = table.filter(pa.array(keep))
    got = _check(table)
    if dp == 1:
        assert got == {}
