"""The dependency graph (laggard.engine.graph) on tiny hand-built jobs.

Each test works out the timeline by hand (comments) and checks the graph's structure, or the
replay's end times where that says it more plainly. Replay weights are per op: its duration, or
for a member of a communication group its transfer time after the group's last member arrived.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from laggard.engine.graph import Graph, build_graph, group_sizes_check
from laggard.engine.replay import op_starts, replay, replay_steps
from laggard.errors import GraphCycleError, LaggardError, LaggardWarning
from laggard.optable.ops import Job, JobMeta, make_table


def _job(rows: list[dict]) -> Job:
    """Rows of column values; step 0, start 0, no group (seq -1), no peer and null deps unless given."""
    defaults = {"step": 0, "start_ns": 0, "dur_ns": 0, "seq": -1, "peer": -1}
    keys = set(defaults) | {k for r in rows for k in r}
    return Job(table=make_table({k: [r.get(k, defaults.get(k)) for r in rows] for k in keys}), meta=JobMeta())


def _deps(g: Graph) -> list[list[int]]:
    """Each op's dependencies (op rows), sorted."""
    return [sorted(g.dep_idx[g.dep_ptr[i] : g.dep_ptr[i + 1]].tolist()) for i in range(g.num_ops)]


def _ends(rows: list[dict], weights: list[float]) -> list[float]:
    ends, _ = replay(build_graph(_job(rows)), np.array(weights, dtype=float))
    return ends.tolist()


def op(rank: int, name: str, kind: str = "compute", **kw) -> dict:
    return dict(rank=rank, name=name, kind=kind, **kw)


# --- the stream chain -------------------------------------------------------------------------

def test_one_stream_chains_its_ops_in_start_order():
    # rows out of time order: the chain follows start_ns, not the row order: b(0) -> c(10) -> a(20)
    rows = [op(0, "a", start_ns=20), op(0, "b", start_ns=0), op(0, "c", start_ns=10)]
    g = build_graph(_job(rows))
    assert _deps(g) == [[2], [], [1]]
    # weights a=1, b=2, c=3: b 0..2, c 2..5, a 5..6
    ends, steps = replay(g, np.array([1.0, 2.0, 3.0]))
    assert ends.tolist() == [6.0, 2.0, 5.0] and steps.tolist() == [6.0]
    assert op_starts(g, ends).tolist() == [5.0, 0.0, 2.0]


def test_chains_are_per_rank_step_and_stream():
    # one stream name everywhere, but (rank, step, stream) differ: nothing waits for anything
    rows = [op(0, "a", stream="s"), op(1, "a", stream="s", start_ns=5), op(0, "a", stream="t", start_ns=5),
            op(0, "a", stream="s", step=1, start_ns=5)]
    g = build_graph(_job(rows))
    assert _deps(g) == [[], [], [], []]
    assert g.steps.tolist() == [0, 1]
    # each step replays from its own t=0: step 0 ends with its longest op, step 1 with its only one
    assert replay_steps(g, np.array([4.0, 3.0, 2.0, 1.0])).tolist() == [4.0, 1.0]


def test_two_streams_of_a_rank_run_concurrently():
    # compute stream: c1 0..4, c2 4..8; comm stream: x 0..5 (not after c2: 13)
    rows = [op(0, "c1", stream="compute"), op(0, "c2", stream="compute", start_ns=10),
            op(0, "x", "other", stream="comm", start_ns=1)]
    g = build_graph(_job(rows))
    assert _deps(g) == [[], [0], []]
    ends, steps = replay(g, np.array([4.0, 4.0, 5.0]))
    assert ends.tolist() == [4.0, 8.0, 5.0] and steps.tolist() == [8.0]


# --- communication groups -----------------------------------------------------------------------

def _p2p(recv_seq: int = 0, recv_step: int = 0) -> list[dict]:
    # rank 0: fwd (10) -> send ; rank 1: recv -> fwd2 (3); transfer 2 on both ends
    return [
        op(0, "fwd", start_ns=0),
        op(0, "forward-send", "p2p_send", start_ns=10, group="pp", seq=0, peer=1),
        op(1, "forward-recv", "p2p_recv", start_ns=0, group="pp", seq=recv_seq, peer=0, step=recv_step),
        op(1, "fwd2", start_ns=12, step=recv_step),
    ]


def test_p2p_pair_is_one_transfer():
    g = build_graph(_job(_p2p()))
    assert g.num_groups == 1
    assert g.op_group.tolist() == [-1, 0, 0, -1]
    # the receiver arrives at 0 but the transfer starts when the sender does (10, after fwd):
    # send and recv both end at 10 + 2; fwd2 follows the recv: 12..15
    ends = _ends(_p2p(), [10.0, 2.0, 2.0, 3.0])
    assert ends == [10.0, 12.0, 12.0, 15.0]
    send_start = op_starts(build_graph(_job(_p2p())), np.array(ends))[1]
    assert ends[2] >= send_start == 10.0  # the receiver cannot end before the sender starts


@pytest.mark.parametrize("recv_seq, recv_step", [(1, 0), (0, 1)])
def test_p2p_ends_pair_only_on_equal_step_group_and_seq(recv_seq, recv_step):
    g = build_graph(_job(_p2p(recv_seq, recv_step)))
    assert g.num_groups == 2
    # unpaired, the recv no longer waits for rank 0: 0..2, fwd2 2..5
    ends = _ends(_p2p(recv_seq, recv_step), [10.0, 2.0, 2.0, 3.0])
    assert ends == [10.0, 12.0, 2.0, 5.0]


def test_collective_waits_for_its_last_member():
    # three ranks compute 1, 7 and 3, then all-reduce (transfer 2, 1, 4), then a tail (1 each):
    # the all-reduce starts everywhere at 7 (rank 1's arrival); rank r's tail follows its own end
    rows = []
    for r in range(3):
        rows += [op(r, "compute"), op(r, "all-reduce", "collective", start_ns=10, group="dp", seq=0),
                 op(r, "tail", start_ns=20)]
    g = build_graph(_job(rows))
    assert g.num_groups == 1 and sorted(g.group_ops.tolist()) == [1, 4, 7]
    w = np.array([1, 2, 1, 7, 1, 1, 3, 4, 1], dtype=float)
    ends, steps = replay(g, w)
    assert ends.tolist() == [1, 9, 10, 7, 8, 9, 3, 11, 12]
    assert steps.tolist() == [12.0]
    # two all-reduces in a row (seq 0, 1) are two groups; the second waits for the first everywhere
    rows2 = [op(r, "ar", "collective", start_ns=s, group="dp", seq=s) for r in range(2) for s in (0, 1)]
    g2 = build_graph(_job(rows2))
    assert g2.num_groups == 2
    # rank 0: ar0 transfer 5, rank 1: ar0 transfer 1; both ar1 start at max(5, 1) = 5, transfer 1
    assert replay(g2, np.array([5.0, 1.0, 1.0, 1.0]))[0].tolist() == [5.0, 6.0, 1.0, 6.0]


def test_a_group_of_one_is_a_plain_op():
    rows = [op(0, "a"), op(0, "ar", "collective", start_ns=1, group="solo", seq=0)]
    assert _ends(rows, [2.0, 3.0]) == [2.0, 5.0]


# --- explicit dependencies ------------------------------------------------------------------------

def test_explicit_deps_override_the_stream_chain():
    # one stream a(0) b(10) c(20): chained, a 0..1, b 1..6, c 6..7
    chain = [op(0, "a", start_ns=0), op(0, "b", start_ns=10), op(0, "c", start_ns=20)]
    assert _ends(chain, [1.0, 5.0, 1.0]) == [1.0, 6.0, 7.0]
    # b and c wait for a only: c runs beside b, 1..2
    fork = [op(0, "a", start_ns=0, deps=[]), op(0, "b", start_ns=10, deps=[0]), op(0, "c", start_ns=20, deps=[0])]
    g = build_graph(_job(fork))
    assert _deps(g) == [[], [0], [0]]
    assert _ends(fork, [1.0, 5.0, 1.0]) == [1.0, 6.0, 2.0]
    # an empty list: no dependency at all, although the op is last on its stream
    free = [op(0, "a", start_ns=0, deps=[]), op(0, "b", start_ns=10, deps=[0]), op(0, "c", start_ns=20, deps=[])]
    assert _ends(free, [1.0, 5.0, 1.0]) == [1.0, 6.0, 1.0]


def test_explicit_deps_refer_to_op_ids():
    # op_ids 100, 200, 300 (not the row numbers): c waits for a and b -> max(4, 2) + 1
    rows = [op(0, "a", op_id=300, deps=[]), op(0, "b", op_id=100, deps=[]), op(0, "c", op_id=200, deps=[300, 100])]
    g = build_graph(_job(rows))
    assert _deps(g) == [[], [], [0, 1]]
    assert replay(g, np.array([4.0, 2.0, 1.0]))[0].tolist() == [4.0, 2.0, 5.0]


def test_explicit_deps_that_cannot_hold_are_dropped():
    # a self-dependency, one on a missing op, one across steps: all dropped, the last two with a warning
    rows = [op(0, "a", deps=[0]), op(0, "b", deps=[7]), op(0, "c", step=1, deps=[0])]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = build_graph(_job(rows))
    assert _deps(g) == [[], [], []]
    messages = " | ".join(str(w.message) for w in caught if issubclass(w.category, LaggardWarning))
    assert "1 dependency reference(s) to ops not in the trace" in messages
    assert "1 dependency(ies) across steps" in messages


@pytest.mark.xfail(strict=True, reason="an op with null deps follows the previous op *with null deps* on its "
                   "stream, skipping ops that have an explicit list; the schema says null deps mean 'the previous "
                   "op on the same stream'")
def test_null_deps_follow_the_previous_op_even_when_it_has_explicit_deps():
    # a(0) b(10, deps [a]) c(20, deps null) on one stream: c's previous op is b -> a 0..1, b 1..6, c 6..7
    rows = [op(0, "a", start_ns=0), op(0, "b", start_ns=10, deps=[0]), op(0, "c", start_ns=20)]
    assert _ends(rows, [1.0, 5.0, 1.0]) == [1.0, 6.0, 7.0]


# --- cycles -----------------------------------------------------------------------------------

def test_dependency_cycle_is_an_error():
    rows = [op(0, "a"), op(0, "b", deps=[2]), op(0, "c", deps=[1])]
    with pytest.raises(GraphCycleError) as e:
        build_graph(_job(rows))
    msg = str(e.value)
    assert isinstance(e.value, LaggardError) and "\n" not in msg
    assert "cycle through 2 op(s)" in msg and "b on rank 0 in step 0" in msg


def test_cycle_through_a_collective_is_an_error():
    # a waits for rank 0's all-reduce, which waits for a; rank 1's member is stuck with them
    rows = [op(0, "a", deps=[1]), op(0, "ar", "collective", group="g", seq=0, deps=[0]),
            op(1, "ar", "collective", group="g", seq=0, deps=[])]
    with pytest.raises(GraphCycleError, match=r"cycle through 4 op\(s\)/collective\(s\), e\.g\. a on rank 0"):
        build_graph(_job(rows))


# --- group sizes ------------------------------------------------------------------------------

def _sized(members_per_step: dict[int, int], group: str = "dp") -> list[dict]:
    return [op(r, "ar", "collective", step=s, group=group, seq=0)
            for s, n in members_per_step.items() for r in range(n)]


def test_group_sizes_check_flags_a_short_collective():
    # group dp has 4 members in steps 0, 1, 3 and 2 in step 2
    job = _job(_sized({0: 4, 1: 4, 2: 2, 3: 4}))
    with pytest.warns(LaggardWarning, match=r"skipped 1 step\(s\) .* group 'dp' seq 0 in step 2: 2 of 4 ranks"):
        bad = group_sizes_check(job, build_graph(job))
    assert bad.tolist() == [2]


def test_group_sizes_are_compared_per_group_label():
    # "tp" always has 2 members, "dp" 3 except step 1: only step 1's dp collective is short
    job = _job(_sized({0: 3, 1: 2, 2: 3}, "dp") + _sized({0: 2, 1: 2, 2: 2}, "tp"))
    with pytest.warns(LaggardWarning, match=r"'dp' seq 0 in step 1: 2 of 3"):
        assert group_sizes_check(job, build_graph(job)).tolist() == [1]


def test_group_sizes_check_passes_full_groups():
    job = _job(_sized({0: 2, 1: 2}) + [op(0, "c")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert group_sizes_check(job, build_graph(job)).tolist() == []
    # a larger group than usual is not missing anyone: only fewer participants are flagged
    job = _job(_sized({0: 2, 1: 2, 2: 3}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert group_sizes_check(job, build_graph(job)).tolist() == []


def test_no_ops_is_an_error():
    empty = Job(table=_job([op(0, "a")]).table.slice(0, 0), meta=JobMeta())
    with pytest.raises(LaggardError, match="the trace has no ops"):
        build_graph(empty)
