"""The replay engine on hand-built graphs with known answers, and on synthetic jobs."""

from __future__ import annotations

import numpy as np
import pytest

from laggard.engine.graph import build_graph
from laggard.engine.replay import op_starts, put_rows, replay
from laggard.errors import LaggardError
from laggard.groundtruth.synth import SynthConfig, build_1f1b_template, schedule_1f1b, synthesize
from laggard.optable.ops import Job, JobMeta, make_table


def _job(rows: list[dict]) -> Job:
    keys = {k for r in rows for k in r}
    defaults = {"seq": -1}
    cols = {k: [r.get(k, defaults.get(k)) for r in rows] for k in keys}
    return Job(table=make_table(cols), meta=JobMeta())


def test_chain_and_collective_by_hand():
    # rank 0: a(2) -> c0 ; rank 1: b(5) -> c1 ; c0/c1 one collective with transfer 1 and 3
    rows = [
        dict(rank=0, step=0, name="a", kind="compute", start_ns=0, dur_ns=0, deps=[]),
        dict(rank=1, step=0, name="b", kind="compute", start_ns=0, dur_ns=0, deps=[]),
        dict(rank=0, step=0, name="ar", kind="collective", start_ns=0, dur_ns=0, deps=[0], group="g", seq=0),
        dict(rank=1, step=0, name="ar", kind="collective", start_ns=0, dur_ns=0, deps=[1], group="g", seq=0),
        dict(rank=0, step=0, name="d", kind="compute", start_ns=0, dur_ns=0, deps=[2]),
    ]
    g = build_graph(_job(rows))
    assert g.num_groups == 1
    ends, st = replay(g, np.array([2.0, 5.0, 1.0, 3.0, 4.0]))
    assert ends.tolist() == [2.0, 5.0, 6.0, 8.0, 10.0]  # collective starts at max(2, 5)
    assert st.tolist() == [10.0]
    starts = op_starts(g, ends)
    assert starts.tolist() == [0.0, 0.0, 2.0, 5.0, 6.0]
    # scenarios in one pass equal separate passes
    w = np.stack([np.array([2.0, 5.0, 1.0, 3.0, 4.0]), np.ones(5)], axis=1)
    _, st2 = replay(g, w)
    assert st2[:, 0].tolist() == [10.0] and st2[:, 1].tolist() == [3.0]


def test_stream_order_when_no_explicit_deps():
    rows = [
        dict(rank=0, step=0, name="x", kind="compute", start_ns=10, dur_ns=1, stream="s"),
        dict(rank=0, step=0, name="y", kind="compute", start_ns=0, dur_ns=1, stream="s"),
        dict(rank=0, step=0, name="z", kind="compute", start_ns=0, dur_ns=1, stream="t"),
    ]
    g = build_graph(_job(rows))
    ends, st = replay(g, np.array([1.0, 2.0, 7.0]))
    assert ends.tolist() == [3.0, 2.0, 7.0]  # x follows y on stream s; z runs alone on t
    assert st.tolist() == [7.0]


def test_cycle_is_a_clear_error():
    rows = [
        dict(rank=0, step=0, name="a", kind="compute", start_ns=0, dur_ns=1, deps=[1]),
        dict(rank=0, step=0, name="b", kind="compute", start_ns=0, dur_ns=1, deps=[0]),
    ]
    with pytest.raises(LaggardError, match="cycle"):
        build_graph(_job(rows))


def test_1f1b_schedule():
    def fb(sched):
        return [(k, m) for k, m, _ in sched]

    assert fb(schedule_1f1b(0, 4, 4)) == [("F", 0), ("F", 1), ("F", 2), ("F", 3),
                                          ("B", 0), ("B", 1), ("B", 2), ("B", 3)]
    assert fb(schedule_1f1b(3, 4, 4)) == [("F", 0), ("B", 0), ("F", 1), ("B", 1),
                                          ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    for chunks in (1, 2, 3):
        for s in range(4):
            sched = schedule_1f1b(s, 4, 8, chunks)
            for kind in "FB":
                units = sorted((c, m) for k, m, c in sched if k == kind)
                assert units == [(c, m) for c in range(chunks) for m in range(8)]
    tpl = build_1f1b_template(4, 8)
    assert tpl.name.count("forward-send") == 3 * 8 == tpl.name.count("forward-recv")
    tpl2 = build_1f1b_template(4, 8, 2)  # interleaved: the last stage also sends to stage 0
    assert tpl2.name.count("forward-send") == (2 * 4 - 1) * 8 == tpl2.name.count("forward-recv")


@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_interleaved_jobs_replay_exactly(chunks):
    from laggard.analysis.pipeline import analyze

    job = synthesize(SynthConfig(dp=2, pp=3, vpp=chunks, microbatches=6, steps=3, seed=4))
    r = analyze(job)
    assert r.launch_slowdown == pytest.approx(1.0, abs=1e-6)
    assert job.meta.vpp_size == chunks


def test_tiled_graph_equals_generic(analyses):
    """Steps that repeat step 0 are built once and tiled; the result is the same graph."""
    for job in (analyses["AR"].base.job, synthesize(SynthConfig(dp=3, pp=4, microbatches=8, steps=5, seed=3))):
        tiled = build_graph(job)
        assert tiled.ops_per_step > 0
        _replays_as_built_whole(job, tiled)


def _replays_as_built_whole(job: Job, g) -> None:
    """``g`` (``build_graph``'s) replays random weights exactly as the graph built over every op."""
    from laggard.engine.graph import _build

    steps, op_step = np.unique(job.column("step"), return_inverse=True)
    generic = _build(job, steps, op_step.astype(np.int64))
    w = np.random.default_rng(0).random((job.num_ops, 3))
    e1, s1 = replay(g, w)
    e2, s2 = replay(generic, w)
    assert np.array_equal(e1, e2) and np.array_equal(s1, s2)


def _implicit_job(swap_in_step: int | None = None, tie: bool = False) -> Job:
    """3 steps of 2 ranks, each with a compute stream (3 ops) and a copy stream (1 op), then an
    all-reduce; no explicit deps (each op follows the one before it on its stream by start time),
    rows step by step. ``swap_in_step``: the first two computes of rank 1 trade start times there;
    ``tie``: rank 0's first two computes start together (their rows order them)."""

    cols: dict[str, list] = {k: [] for k in ("step", "rank", "dp_rank", "name", "kind", "stream", "start_ns", "dur_ns",
                                             "group", "seq")}
    for step in range(3):
        for rank in range(2):
            starts = [0, 10, 20] if not (tie and rank == 0) else [0, 0, 20]
            if swap_in_step == step and rank == 1:
                starts = [10, 0, 20]
            rows = [(f"c{i}", "compute", "compute", t, 7 + i + rank) for i, t in enumerate(starts)]
            rows += [("copy", "compute", "copy", 5, 4), ("ar", "collective", "compute", 40, 3)]
            for name, kind, stream, t, d in rows:
                for k, v in zip(cols, (step, rank, rank, name, kind, stream, step * 1000 + t, d,
                                       "world" if kind == "collective" else None, 0 if kind == "collective" else -1),
                                strict=True):
                    cols[k].append(v)
    return Job(table=make_table(cols), meta=JobMeta())


@pytest.mark.parametrize(("swap", "tie", "tiled"), [(None, False, True), (None, True, True), (2, False, False)])
def test_steps_without_explicit_deps_are_tiled_when_every_chain_keeps_its_order(swap, tie, tiled):
    """Without explicit deps, step 0's chains are every step's only where each (rank, stream) runs
    its ops in the same start order in every step; where one step swaps two, the graph is built
    whole. Either way it replays as the generic build does."""
    job = _implicit_job(swap, tie)
    g = build_graph(job)
    assert (g.ops_per_step > 0) is tiled
    _replays_as_built_whole(job, g)


def test_synthetic_trace_replays_exactly():
    """A trace generated by replaying its own graph has fidelity 1 and reproduces its step times."""
    from laggard.analysis.pipeline import analyze

    job = synthesize(SynthConfig(dp=3, pp=4, microbatches=6, steps=4, seed=1))
    r = analyze(job)
    assert r.launch_slowdown == pytest.approx(1.0, abs=1e-6)
    assert np.allclose(r.step_simulated_s, r.step_measured_s, rtol=1e-6)
    assert 1.0 <= r.slowdown < 1.2  # jitter only


def test_dp_symmetry_reduction_is_exact():
    """Per-DP-rank what-ifs on the two-rank equivalent equal full replays."""
    from laggard.engine.baseline import prepare
    from laggard.engine.symmetry import reduce_dp
    from laggard.whatif.core import by_dp_rank_step_times

    scale = None
    job = synthesize(SynthConfig(dp=6, pp=3, microbatches=5, steps=3, seed=2))
    base = prepare(job)
    red = reduce_dp(base.job, base.graph)
    assert red is not None and red.graph.num_ops == job.num_ops // 3
    dps = np.unique(base.dp_rank)
    full = by_dp_rank_step_times(base, dps)
    fast = by_dp_rank_step_times(base, dps, red)
    assert np.allclose(full, fast, rtol=0, atol=1e-12)
    del scale


def test_dp_symmetry_refuses_asymmetric_jobs(analyses):
    from laggard.engine.symmetry import reduce_dp

    base = analyses["AR"].base
    keep = ~((base.dp_rank == 2) & (base.job.column("step") == base.job.column("step")[0]) & (base.pp_rank == 1))
    import pyarrow as pa

    sub = Job(table=base.job.table.filter(pa.array(keep)), meta=base.job.meta)
    assert reduce_dp(sub, build_graph(sub)) is None


@pytest.mark.parametrize("values", [
    np.array([5, 3, 5, 9, 3, 3], dtype=np.int64),  # narrow range: the lookup table
    np.array([-4, 7, -4, 0], dtype=np.int32),  # negative, 32-bit
    np.array([10**12, 3, 10**12, 7], dtype=np.int64),  # too wide for a table: np.unique
    np.zeros(0, dtype=np.int64),
    np.array([2.5, 1.0, 2.5]),  # not integers
])
def test_unique_inverse_equals_numpy(values):
    from laggard.optable.ops import unique_inverse

    u, inv = unique_inverse(values)
    nu, ninv = np.unique(values, return_inverse=True)
    assert np.array_equal(u, nu) and u.dtype == nu.dtype
    assert np.array_equal(inv, ninv.ravel()) and inv.dtype == np.int64


@pytest.mark.parametrize("seed", [0, 1])
def test_modal_size_and_fwd_bwd_partner_match_a_plain_count(seed):
    """The lookup-table paths (``graph.modal_size``, ``spikes.fwd_bwd_partner``) and their sorting
    fallbacks against dictionaries counted by hand."""
    from collections import Counter

    from laggard.engine.graph import modal_size
    from laggard.engine.spikes import fwd_bwd_partner

    rng = np.random.default_rng(seed)
    label = rng.integers(0, 6, 300)
    size = rng.integers(1, 5, 300)
    want = np.zeros(7, dtype=np.int64)
    for lab in range(7):
        c = Counter(size[label == lab].tolist())
        if c:
            top = max(c.values())
            want[lab] = min(s for s, k in c.items() if k == top)
    assert np.array_equal(modal_size(label, size, 7), want)  # table
    big = 10**6  # wide sizes: the sorting path
    assert np.array_equal(modal_size(label, size * big, 7), want * big)

    names = ["forward", "backward", "other"]
    n = 400
    name_code = rng.integers(0, 3, n)
    compute = rng.random(n) < 0.9
    mb = rng.integers(-1, 4, n)
    step = rng.integers(0, 3, n)
    for rank_scale in (1, 10**7):  # small keys: the table; huge rank ids: the sorting path
        rank = rng.integers(0, 3, n) * rank_scale
        got = fwd_bwd_partner(names, name_code, compute, rank, step, mb)
        key = list(zip(rank.tolist(), step.tolist(), mb.tolist(), strict=True))
        fw = [i for i in range(n) if name_code[i] == 0 and compute[i] and mb[i] >= 0]
        bw = [i for i in range(n) if name_code[i] == 1 and compute[i] and mb[i] >= 0]
        cf, cb = Counter(key[i] for i in fw), Counter(key[i] for i in bw)
        exp = np.full(n, -1)
        by_key = {key[i]: i for i in bw}
        for i in fw:
            if cf[key[i]] == 1 and cb[key[i]] == 1:
                exp[i] = by_key[key[i]]
        assert np.array_equal(got, exp)


@pytest.mark.parametrize("shape", [(50,), (50, 1), (50, 2), (50, 7), "strided"])
def test_put_rows_is_numpy_row_assignment(shape):
    """put_rows (rows written as items of their bytes) against numpy's own fancy assignment."""
    rng = np.random.default_rng(len(str(shape)))
    base = rng.random((50, 6))
    dst = base[:, ::2] if shape == "strided" else rng.random(shape)  # a view that is not C-ordered
    rows = rng.permutation(50)[:31]
    src = rng.random((31,) + dst.shape[1:])
    for value in (src, 2.5):  # whole rows, and one value broadcast
        want, got = dst.copy(), dst.copy() if shape != "strided" else base.copy()[:, ::2]
        want[rows] = value
        put_rows(got, rows, value)
        assert np.array_equal(got, want)
