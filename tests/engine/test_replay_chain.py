"""The replay with steps back to back (laggard.engine.replay_chain), which replay fidelity compares with the
wall clock: against a job whose timeline is worked out by hand, and against a plain longest-path
computation over the ops (no replay plan, no passes) on synthetic, simulated and real traces."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from laggard.analysis.pipeline import analyze
from laggard.engine.baseline import Baseline, prepare
from laggard.engine.gaps import HOST_KIND
from laggard.engine.replay_chain import chained_wall_step_times, plan_chain
from laggard.errors import LaggardWarning
from laggard.optable.ops import Job
from tests.conftest import job_from_rows

DATA = Path(__file__).parents[1] / "data"


def _staggered_job() -> tuple[Job, list[float]]:
    """Rank 0 computes 10 ms and runs a 10 ms optimizer tail after the all-reduce; rank 1 computes
    20 ms and has no tail. Each rank starts a step when its previous one is done, so rank 1 starts
    every step 10 ms before rank 0 and the all-reduce (5 ms) always waits for rank 1:
    step 0: 0-35, step 1: 35-60, step 2: 60-85 on the wall clock (last end to last end)."""
    rows = []
    r0, r1 = 0.0, 0.0  # when each rank starts the step
    for step in range(3):
        ar = max(r0 + 10, r1 + 20)
        rows += [
            (0, step, "fwd", "compute", r0, 10, None, -1),
            (0, step, "ar", "collective", r0 + 10, ar + 5 - (r0 + 10), "dp", step),
            (0, step, "opt", "compute", ar + 5, 10, None, -1),
            (1, step, "fwd", "compute", r1, 20, None, -1),
            (1, step, "ar", "collective", r1 + 20, ar + 5 - (r1 + 20), "dp", step),
        ]
        r0, r1 = ar + 15, ar + 5
    return job_from_rows(rows), [0.035, 0.025, 0.025]


def test_staggered_step_starts_replay_to_the_wall_clock() -> None:
    job, wall = _staggered_job()
    res = analyze(job, diagnose=False)
    assert res.step_wall_s == pytest.approx(wall, abs=1e-9)
    assert res.step_replayed_wall_s == pytest.approx(wall, abs=1e-9)
    assert res.replay_fidelity == pytest.approx(1.0, abs=1e-9)
    # the per-step replay (every rank from t=0) counts rank 0's tail in every step: 35 ms, not 25
    assert res.step_simulated_s == pytest.approx([0.035] * 3, abs=1e-9)
    assert np.mean(res.step_wall_s) / res.T_s < 0.85


def _reference_walls(base: Baseline) -> np.ndarray:
    """Longest paths over the ops by plain relaxation: an op starts when its dependencies have
    ended, when its stream's last op of the previous step has ended (a host op: the rank's last op)
    and, in a collective, when every member may start; it ends its measured weight later."""
    g = base.graph
    n = g.num_ops
    stream = base.job.codes("stream")[0]
    host = np.array([k == HOST_KIND for k in base.kinds])[base.kind_code]
    step = g.op_step
    deps = [g.dep_idx[g.dep_ptr[i]:g.dep_ptr[i + 1]].tolist() for i in range(n)]
    # cross-step waits
    key = {}
    for i in sorted(range(n), key=lambda i: base.start_s[i]):
        key.setdefault((int(step[i]), int(base.rank[i]), int(stream[i])), []).append(i)
    chain = [[] for _ in range(n)]
    for (s, r, x), ops in key.items():
        if s == 0 or g.steps[s] - g.steps[s - 1] != 1:
            continue
        same = key.get((s - 1, r, x))
        rank_ops = [i for (s2, r2, _), o in key.items() if s2 == s - 1 and r2 == r for i in o]
        chain[ops[0]] = rank_ops if host[ops[0]] or not same else same
    members = {}
    for i in range(n):
        if g.op_group[i] >= 0:
            members.setdefault(int(g.op_group[i]), []).append(i)
    end = np.zeros(n)
    for _ in range(n + 1):
        ready = np.array([max([end[j] for j in deps[i] + chain[i]], default=0.0) for i in range(n)])
        start = ready.copy()
        for ms in members.values():
            start[ms] = ready[ms].max()
        new = start + base.measured
        if np.array_equal(new, end):
            break
        end = new
    step_end = np.array([end[step == s].max() for s in range(len(g.steps))])
    follows = np.diff(g.steps, prepend=g.steps[0] - 2) == 1
    return np.where(follows, np.diff(step_end, prepend=0.0), step_end)


def _chained(base: Baseline) -> tuple[np.ndarray, int]:
    stream = base.job.codes("stream")[0].astype(np.int64)
    host = np.array([k == HOST_KIND for k in base.kinds])[base.kind_code]
    return chained_wall_step_times(base.graph, plan_chain(base.graph, base.rank, stream, host, base.start_s),
                                   base.measured)


def _synth(seed: int) -> Job:
    from laggard.groundtruth.inject import parse_injection
    from laggard.groundtruth.synth import SynthConfig, synthesize_with_truth

    return synthesize_with_truth(SynthConfig(dp=2, pp=3, microbatches=3, steps=4, seed=seed),
                                 [parse_injection("launch-delay:ms=3")]).job


def _dessim(vpp: int) -> Job:
    from laggard.groundtruth.dessim import SimConfig, parse_cause, simulate, to_job

    return to_job(simulate(SimConfig(dp=2, pp=2, vpp=vpp, microbatches=4, steps=3),
                           [parse_cause("gc-pauses:prob=0.2,pause_ms=20"),
                            parse_cause("slow-worker:rank=1,factor=1.4")]))


def _kineto() -> Job:
    from laggard.io import load_job

    return load_job(DATA / "kineto" / "ddp_gloo")


@pytest.mark.parametrize("make", [lambda: _staggered_job()[0], lambda: _synth(3), lambda: _synth(11),
                                  lambda: _dessim(1), lambda: _dessim(2), _kineto],
                         ids=["by-hand", "synth-3", "synth-11", "dessim", "dessim-vpp2", "kineto-ddp"])
def test_passes_reach_the_longest_paths(make) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        base = prepare(make())
    walls, passes = _chained(base)
    assert walls == pytest.approx(_reference_walls(base), rel=1e-9, abs=1e-12)
    assert 1 <= passes <= len(base.graph.steps) + 1


def test_host_ops_wait_for_the_whole_rank() -> None:
    """A host op that opens a step began where the rank's last op ended, on whatever stream. Rank 0
    idles 20 ms before its forward pass in each step, and its all-reduce runs on a stream of its
    own: step 1 starts after the all-reduce (at 50 ms), not after the forward pass (at 30 ms)."""
    rows = []
    for step, t0 in ((0, 0.0), (1, 60.0)):
        rows += [
            (0, step, "fwd", "compute", t0 + 20, 10, None, -1),
            (0, step, "ar", "collective", t0 + 30, 20, "dp", step),
            (1, step, "fwd", "compute", t0, 30, None, -1),
            (1, step, "ar", "collective", t0 + 30, 20, "dp", step),
        ]
    job = job_from_rows(rows, streams=True)
    res = analyze(job, diagnose=False)
    base = res.base
    assert base is not None and base.gaps.num_ops > 0
    assert res.step_wall_s == pytest.approx([0.05, 0.06], abs=1e-9)
    assert res.step_replayed_wall_s == pytest.approx([0.05, 0.06], abs=1e-9)
    # the reference gets the same, and the rule matters: waiting on its own stream, rank 0's host
    # op would start at 30 ms and step 1 would replay in 40 ms
    assert _chained(base)[0] == pytest.approx(_reference_walls(base), abs=1e-12)
