"""The compiled kernels (engine/_replay.c, laggard.engine.kernels) against their numpy twins: the
replay loop (replay._propagate_numpy), the same node values to the bit on real graphs, 1-D and 2-D,
with and without floors, NaN included; the graph's levels (plan.levels_numpy), the same levels on
real graphs and random ones with cycles."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from laggard.engine import graph as graph_mod
from laggard.engine import kernels, plan
from laggard.engine.baseline import prepare
from laggard.engine.replay import node_values
from laggard.errors import GraphCycleError
from laggard.io import load_job

replay = importlib.import_module("laggard.engine.replay")  # `laggard.engine.replay` is also a function
DATA = Path(__file__).parents[1] / "data"
TRACES = {
    "AR": DATA / "ndtimeline" / "trace-AR.parquet",  # DP x PP 1F1B, templated graph
    "vpp": DATA / "corpus" / "c16v4_job047" / "trace",  # interleaved stages, tracer's native format
    "kineto": DATA / "kineto" / "ddp_gloo",  # profiler trace: streams, collectives
}

needs_compiled = pytest.mark.skipif(kernels._replay is None, reason="the compiled kernels were not built here")  # noqa: SLF001


@pytest.fixture(scope="module", params=sorted(TRACES))
def graph_and_values(request: pytest.FixtureRequest):  # noqa: ANN201
    base = prepare(load_job(TRACES[request.param]))
    return base.graph, node_values(base.graph, base.measured), node_values(base.graph, base.ideal)


def _both(graph, vals: np.ndarray, floor=None) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    os.environ[kernels.PURE_PYTHON_ENV] = "1"
    try:
        py = replay.propagate(graph, vals.copy(), floor)
    finally:
        del os.environ[kernels.PURE_PYTHON_ENV]
    return py, replay.propagate(graph, vals.copy(), floor)


@needs_compiled
def test_one_column_and_many_are_the_numpy_values(graph_and_values) -> None:  # noqa: ANN001
    graph, measured, ideal = graph_and_values
    assert kernels.compiled_replay()
    py, c = _both(graph, measured)
    assert py.tobytes() == c.tobytes()
    rng = np.random.default_rng(7)
    for width in (2, 5, 25):
        cols = np.stack([np.where(rng.random(len(measured)) < 0.5, measured, ideal) for _ in range(width)], axis=1)
        py, c = _both(graph, np.ascontiguousarray(cols))
        assert py.tobytes() == c.tobytes(), width
    assert not np.array_equal(py[:, 0], py[:, 1])  # the columns are different scenarios


@needs_compiled
def test_floors_are_the_numpy_values(graph_and_values) -> None:  # noqa: ANN001
    graph, measured, _ = graph_and_values
    rng = np.random.default_rng(3)
    n = graph.num_nodes
    fpos = np.unique(rng.integers(0, n, size=max(n // 20, 1)))
    fval = rng.random(len(fpos)) * float(np.nanmax(measured)) * 3
    py, c = _both(graph, measured, (fpos, fval))
    assert py.tobytes() == c.tobytes()
    plain = replay.propagate(graph, measured.copy())
    assert (c >= plain).all() and (c > plain).any()  # the floors held some nodes back


@needs_compiled
def test_nan_spreads_as_numpy_spreads_it(graph_and_values) -> None:  # noqa: ANN001
    graph, measured, ideal = graph_and_values
    vals = np.ascontiguousarray(np.stack([measured, ideal, measured], axis=1))
    first = int(graph.seg_start[0])
    vals[first // 2, 1] = np.nan  # a level-0 node: every node after it may see it
    py, c = _both(graph, vals)
    assert np.array_equal(py, c, equal_nan=True)
    assert np.isnan(c[:, 1]).any() and not np.isnan(c[:, [0, 2]]).any()
    py, c = _both(graph, np.ascontiguousarray(vals[:, 1]))  # one column: the kernel's scalar loop
    assert np.array_equal(py, c, equal_nan=True) and np.isnan(c).any()


@needs_compiled
def test_bad_arguments_raise() -> None:
    base = prepare(load_job(TRACES["AR"]))
    g = base.graph
    vals = node_values(g, base.measured)
    seg = [np.ascontiguousarray(a, dtype=np.int64) for a in (g.seg_start, g.seg_end, g.seg_k, g.seg_off)]
    kernel = kernels._replay.propagate  # noqa: SLF001
    with pytest.raises(TypeError, match="vals must be floats"):
        kernel(vals.astype(np.float32), *seg, g.seg_pred)
    with pytest.raises(ValueError, match="differ in length"):
        kernel(vals, seg[0], seg[1][:-1], seg[2], seg[3], g.seg_pred)
    for wrong in (len(vals), -1):  # one past the last row, and negative
        bad = np.array(g.seg_pred, copy=True)
        bad[len(bad) // 2] = wrong
        seg_of_bad = int(np.searchsorted(seg[3], len(bad) // 2, side="right")) - 1
        with pytest.raises(IndexError, match=f"segment {seg_of_bad} has positions or predecessors out of range"):
            kernel(vals.copy(), *seg, bad)
    with pytest.raises(IndexError, match="out of range"):
        kernel(vals.copy(), *seg, g.seg_pred[: len(g.seg_pred) // 2])
    with pytest.raises(IndexError, match="out of range"):
        kernel(vals[: len(vals) // 2].copy(), *seg, g.seg_pred)
    empty = np.zeros((len(vals), 0))
    kernel(empty, *seg, g.seg_pred)  # no scenario: nothing to do
    read_only = vals.copy()
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        kernel(read_only, *seg, g.seg_pred)
    # propagate itself takes the numpy loop for what the kernel does not take
    py = replay._propagate_numpy(g, vals.copy(), None)  # noqa: SLF001
    assert np.array_equal(replay.propagate(g, np.asfortranarray(np.stack([vals, vals], 1)))[:, 1], py)


def test_the_switch_turns_it_off() -> None:
    code = "from laggard.engine import kernels; print(kernels.compiled_replay(), kernels.kernel('levels'))"
    env = {**os.environ, kernels.PURE_PYTHON_ENV: "1"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False None"


def test_the_install_built_the_compiled_replay_where_it_could() -> None:
    """Optional like the tracer's (an install without a C compiler goes on); where a compiler and
    Python's headers are here, a missing module means the build is broken."""
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not (shutil.which("cc") or shutil.which("gcc")) or not headers.exists():
        pytest.skip("no C compiler or Python headers here: the numpy loop is the one expected")
    assert kernels._replay is not None  # noqa: SLF001
    assert kernels.kernel("levels") is not None  # built from this source, not an older one


# --- the graph's levels ---------------------------------------------------------------------------

def _levels_both(pptr: np.ndarray, sptr: np.ndarray, sidx: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    lv = np.empty(len(pptr) - 1, dtype=np.int64)
    count = kernels.kernel("levels")(sptr, np.ascontiguousarray(sidx), np.diff(pptr), lv)
    return plan.levels_numpy(pptr, sptr, sidx), lv, count


@needs_compiled
@pytest.mark.parametrize("name", sorted(TRACES))
def test_levels_are_the_numpy_levels_on_real_graphs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    job = load_job(TRACES[name])
    g = graph_mod.build_graph(job)
    monkeypatch.setenv(kernels.PURE_PYTHON_ENV, "1")
    g_py = graph_mod.build_graph(job)
    for field in ("op_pos", "group_pos", "seg_start", "seg_end", "seg_k", "seg_pred", "sink_pos"):
        assert np.array_equal(getattr(g, field), getattr(g_py, field)), field
    assert g.num_levels == g_py.num_levels > 3  # levelled, not one flat frontier


@needs_compiled
def test_levels_are_the_numpy_levels_on_random_graphs_with_cycles() -> None:
    rng = np.random.default_rng(3)
    cyclic = 0
    for trial in range(300):
        n = int(rng.integers(1, 60))
        src, dst = rng.integers(0, n, int(rng.integers(0, 150))), rng.integers(0, n, int(rng.integers(0, 150)))
        m = min(len(src), len(dst))
        src, dst = src[:m], dst[:m]
        if trial % 3:  # a DAG: every edge from a lower node to a higher one
            lo, hi = np.minimum(src, dst), np.maximum(src, dst)
            src, dst = lo[lo != hi], hi[lo != hi]
        pptr, _ = plan.to_csr(dst, src, n)
        sptr, sidx = plan.to_csr(src, dst, n)
        for narrow in (False, True):
            ref, lv, count = _levels_both(pptr, sptr, sidx.astype(np.int32) if narrow else sidx)
            assert np.array_equal(ref, lv), trial
            assert count == int((ref >= 0).sum())
        cyclic += bool((ref < 0).any())
    assert cyclic > 20  # the cycles were exercised


@needs_compiled
def test_levels_bad_arguments_raise() -> None:
    kernel = kernels.kernel("levels")
    sptr, sidx = np.array([0, 1, 2, 2]), np.array([1, 2])  # 0 -> 1 -> 2
    indeg, level = np.array([0, 1, 1]), np.empty(3, dtype=np.int64)
    assert kernel(sptr, sidx, indeg.copy(), level) == 3 and level.tolist() == [0, 1, 2]
    with pytest.raises(IndexError, match="successor edge 1 names a node out of range"):
        kernel(sptr, np.array([1, 3]), indeg.copy(), level)
    with pytest.raises(IndexError, match="fewer predecessors counted"):
        kernel(sptr, sidx, np.array([0, 1, 0]), level)  # node 2's edge was not counted
    with pytest.raises(IndexError, match="successors of node 2 are out of range"):
        kernel(np.array([0, 1, 2, 5]), sidx, indeg.copy(), level)
    with pytest.raises(ValueError, match="sptr needs a row per node"):
        kernel(sptr[:-1], sidx, indeg.copy(), level)
    with pytest.raises(TypeError, match="levels: sidx must be int32 or int64"):
        kernel(sptr, sidx.astype(np.float64), indeg.copy(), level)
    with pytest.raises(TypeError, match="levels: level must be signed integers of 8 bytes"):
        kernel(sptr, sidx, indeg.copy(), level.astype(np.int32))


@pytest.mark.parametrize("pure", ["1", ""])
def test_a_cycle_is_reported_either_way(pure: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from laggard.optable.ops import Job, JobMeta, make_table

    monkeypatch.setenv(kernels.PURE_PYTHON_ENV, pure)
    cols = {"rank": np.zeros(3, dtype=np.int32), "step": np.zeros(3, dtype=np.int64),
            "name": ["a", "b", "c"], "kind": ["compute"] * 3, "stream": ["s"] * 3,
            "start_ns": np.arange(3, dtype=np.int64), "dur_ns": np.ones(3, dtype=np.int64),
            "deps": [[], [2], [1]]}
    with pytest.raises(GraphCycleError, match=r"cycle through 2 op\(s\)"):
        graph_mod.build_graph(Job(table=make_table(cols), meta=JobMeta()))


# --- the gap step's running maxima ----------------------------------------------------------------

@needs_compiled
def test_running_max_is_the_numpy_twin() -> None:
    from laggard.engine import gaps

    rng = np.random.default_rng(5)
    kernel = kernels.kernel("running_max")
    for trial in range(300):
        n = int(rng.integers(0, 80))
        values = rng.integers(-3, 4, n) * int(rng.choice([1, 10**12]))  # ties and wide spans
        starts = np.flatnonzero(rng.random(n) < 0.2) if n else np.zeros(0, dtype=np.int64)
        starts = np.union1d([0], starts).astype(np.int64) if n else starts.astype(np.int64)
        ref = gaps._running_max_numpy(values, starts)  # noqa: SLF001
        running, pos = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        kernel(values.astype(np.int64), starts, running, pos)
        assert np.array_equal(ref[0], running) and np.array_equal(ref[1], pos), trial
    with pytest.raises(ValueError, match="first run must start at 0"):
        kernel(np.arange(3), np.array([1]), np.empty(3, dtype=np.int64), np.empty(3, dtype=np.int64))
    with pytest.raises(ValueError, match="run 1 does not start after"):
        kernel(np.arange(3), np.array([0, 0]), np.empty(3, dtype=np.int64), np.empty(3, dtype=np.int64))
    with pytest.raises(ValueError, match="run 1 does not start after"):
        kernel(np.arange(3), np.array([0, 3]), np.empty(3, dtype=np.int64), np.empty(3, dtype=np.int64))
    with pytest.raises(ValueError, match="a slot per value"):
        kernel(np.arange(3), np.array([0]), np.empty(2, dtype=np.int64), np.empty(3, dtype=np.int64))
    with pytest.raises(TypeError, match="running_max: values must be signed integers of 8 bytes"):
        kernel(np.arange(3, dtype=np.int32), np.array([0]), np.empty(3, dtype=np.int64), np.empty(3, dtype=np.int64))


@needs_compiled
@pytest.mark.parametrize("name", ["AR", "kineto"])
def test_the_gap_step_is_the_same_either_way(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from laggard.engine.gaps import GapConfig, insert_host_gaps

    job = load_job(TRACES[name])
    compiled = insert_host_gaps(job, GapConfig())[0].table
    monkeypatch.setenv(kernels.PURE_PYTHON_ENV, "1")
    assert insert_host_gaps(job, GapConfig())[0].table.equals(compiled)
