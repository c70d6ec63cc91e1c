"""The selector grammar of custom what-ifs (laggard.whatif.custom): which ops each selector names
on a small hand-built job, and the one-line errors of malformed selectors and changes."""

from __future__ import annotations

import numpy as np
import pytest

from laggard.engine.baseline import Baseline, prepare
from laggard.engine.gaps import GapConfig
from laggard.errors import LaggardError
from laggard.optable.ops import Job, JobMeta, make_table
from laggard.whatif.custom import ACTIONS, Change, apply_changes, parse_changes, select_ops

# The job: dp=2, pp=2, rank = 2 * pp + dp, steps 0 and 1. Per step:
#   rank 0 (dp0:pp0), rank 1 (dp1:pp0): forward-compute, forward-send (to rank + 2), grads-reduce
#   rank 2 (dp0:pp1), rank 3 (dp1:pp1): forward-recv (from rank - 2), forward-compute, grads-reduce
# and in step 1 only, a gc pause (kind other) on rank 3 after its grads-reduce.
FC, SEND, RECV, AR, GC = "forward-compute", "forward-send", "forward-recv", "grads-reduce", "gc"


def _rows() -> list[dict]:
    rows = []
    for step in (0, 1):
        t0 = step * 1000
        for rank in range(4):
            dp, pp = rank % 2, rank // 2
            ar = dict(name=AR, kind="collective", group=f"dp-pp{pp}", seq=0, peer=-1)
            if pp == 0:
                ops = [dict(name=FC, kind="compute", group=None, seq=-1, peer=-1),
                       dict(name=SEND, kind="p2p_send", group=f"pp-dp{dp}", seq=0, peer=rank + 2), ar]
            else:
                ops = [dict(name=RECV, kind="p2p_recv", group=f"pp-dp{dp}", seq=0, peer=rank - 2),
                       dict(name=FC, kind="compute", group=None, seq=-1, peer=-1), ar]
                if step == 1 and rank == 3:
                    ops.append(dict(name=GC, kind="other", group=None, seq=-1, peer=-1))
            for i, o in enumerate(ops):
                rows.append(dict(rank=rank, dp_rank=dp, pp_rank=pp, step=step, start_ns=t0 + 10 * i,
                                 dur_ns=10 * (rank + 1), **o))
    return rows


ROWS = _rows()


@pytest.fixture(scope="module")
def base() -> Baseline:
    cols = {k: [r[k] for r in ROWS] for k in ROWS[0]}
    job = Job(table=make_table(cols), meta=JobMeta(dp_size=2, pp_size=2))
    b = prepare(job, GapConfig(enabled=False))
    assert b.graph.num_ops == len(ROWS)  # no op added or dropped: masks index ROWS
    return b


def picked(base: Baseline, sel: str) -> set[tuple[int, int, str]]:
    """(step, rank, name) of every op ``sel`` names."""
    mask = select_ops(base, sel)
    return {(r["step"], r["rank"], r["name"]) for r, m in zip(ROWS, mask, strict=True) if m}


def both(*pairs: tuple[int, str]) -> set[tuple[int, int, str]]:
    """(rank, name) pairs in both steps."""
    return {(s, r, n) for s in (0, 1) for r, n in pairs}


EVERY = {(r["step"], r["rank"], r["name"]) for r in ROWS}
FORWARD = both((0, FC), (1, FC), (2, FC), (3, FC))
COMM = both((0, SEND), (1, SEND), (2, RECV), (3, RECV), *((r, AR) for r in range(4)))


def one_line_error(fn, *args, **kwargs) -> str:
    with pytest.raises(LaggardError) as e:
        fn(*args, **kwargs)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


# --- which ops a selector names ---------------------------------------------------------------------

@pytest.mark.parametrize("sel, expected", [
    ("all", EVERY),
    ("compute", FORWARD | {(1, 3, GC)}),  # every op that does not communicate: the gc pause too
    ("comm", COMM),
    ("stage=1", both((2, RECV), (2, FC), (2, AR), (3, RECV), (3, FC), (3, AR)) | {(1, 3, GC)}),
    ("pp=0", both((0, FC), (0, SEND), (0, AR), (1, FC), (1, SEND), (1, AR))),
    ("dp=1", both((1, FC), (1, SEND), (1, AR), (3, RECV), (3, FC), (3, AR)) | {(1, 3, GC)}),
    ("rank=2", both((2, RECV), (2, FC), (2, AR))),
    ("worker=dp1:pp0", both((1, FC), (1, SEND), (1, AR))),
    ("worker=dp1:pp1", both((3, RECV), (3, FC), (3, AR)) | {(1, 3, GC)}),
    ("peer=3", both((1, SEND))),  # the op whose peer is rank 3: rank 1's send
    ("peer=0", both((2, RECV))),
    ("step=1", {e for e in EVERY if e[0] == 1}),
    ("step=0-1", EVERY),  # a range, both ends included
    ("step=1-5", {e for e in EVERY if e[0] == 1}),
    ("step=1,rank=2", {(1, 2, n) for n in (RECV, FC, AR)}),
    ("optype=forward-compute", FORWARD),
    ("name=forward-send", both((0, SEND), (1, SEND))),
    ("optype=forward-pp-comm", both((0, SEND), (1, SEND), (2, RECV), (3, RECV))),  # both ends of the transfers
    ("optype=gc", {(1, 3, GC)}),
    ("kind=collective", both(*((r, AR) for r in range(4)))),
    ("kind=p2p_recv", both((2, RECV), (3, RECV))),
    ("kind=other", {(1, 3, GC)}),
])
def test_selector_names_these_ops(base, sel, expected):
    assert picked(base, sel) == expected


def test_compute_and_comm_split_the_ops(base):
    compute, comm = picked(base, "compute"), picked(base, "comm")
    assert compute | comm == EVERY and not compute & comm


@pytest.mark.parametrize("sel, positive", [("rank!=2", "rank=2"), ("kind!=collective", "kind=collective"),
                                           ("worker!=dp0:pp1", "worker=dp0:pp1"), ("step!=0", "step=0")])
def test_negation_names_the_other_ops(base, sel, positive):
    assert picked(base, sel) == EVERY - picked(base, positive)
    assert picked(base, sel) and picked(base, positive)


@pytest.mark.parametrize("sel, expected", [
    ("stage=1,optype=forward-compute", both((2, FC), (3, FC))),
    ("kind=collective,rank!=0", both((1, AR), (2, AR), (3, AR))),
    ("dp=0,comm,step=1", {(1, 0, SEND), (1, 0, AR), (1, 2, RECV), (1, 2, AR)}),
    ("rank=3,step=1,kind=other", {(1, 3, GC)}),
    ("all,rank=0", both((0, FC), (0, SEND), (0, AR))),
])
def test_comma_intersects(base, sel, expected):
    assert picked(base, sel) == expected


# --- selectors that name nothing, or cannot be read against the trace ---------------------------------

@pytest.mark.parametrize("sel, bad", [
    ("rank=0-3", "'0-3' is not an integer"),  # no ranges: one value per selector
    ("stage=x", "'x' is not an integer"),
    ("step=1.0", "'1.0' is not an integer"),
    ("rank==1", "'=1' is not an integer"),
    ("worker=dp0", "expected worker=dpD:ppP"),
    ("worker=pp0:dp1", "expected worker=dpD:ppP"),
    ("kind=host", "no op of kind 'host' (the trace has "),
    ("kind=Compute", "no op of kind 'Compute'"),
    ("optype=backward-compute", "no op type 'backward-compute' in the trace (it has "),
])
def test_bad_value_names_it(base, sel, bad):
    msg = one_line_error(select_ops, base, sel)
    assert msg.startswith(f"selector {sel!r}") and bad in msg


@pytest.mark.parametrize("sel", ["rank=4", "worker=dp5:pp0", "worker=dp0:pp2", "peer=7", "step=2", "rank=-1",
                                 "rank=0,rank=1", "stage=0,kind=p2p_recv", "kind=other,step=0"])
def test_selector_that_names_no_op(base, sel):
    assert one_line_error(select_ops, base, sel) == f"selector {sel!r} matches no op in the trace"


def test_optype_error_lists_the_op_types(base):
    msg = one_line_error(select_ops, base, "optype=nope")
    assert all(t in msg for t in (FC, SEND, RECV, AR, GC, "forward-pp-comm"))


# --- parse_changes: the command-line forms ---------------------------------------------------------

def test_each_flag_makes_its_change():
    changes = parse_changes(["rank=1"], ["comm"], ["stage=1:0.5"], peer=["worker=dp0:pp1"], even=["stage=0"],
                            despike=["all"])
    assert [(c.action, c.selector, c.factor) for c in changes] == [
        ("fix", "rank=1", 1.0), ("zero", "comm", 1.0), ("peer", "worker=dp0:pp1", 1.0), ("even", "stage=0", 1.0),
        ("despike", "all", 1.0), ("scale", "stage=1", 0.5)]
    assert {c.action for c in changes} == set(ACTIONS)


@pytest.mark.parametrize("arg, selector, factor", [
    ("stage=1,optype=forward-compute:0.8", "stage=1,optype=forward-compute", 0.8),
    ("worker=dp0:pp1:0.25", "worker=dp0:pp1", 0.25),  # the factor is after the last ':'
    ("all:2", "all", 2.0),
    ("rank!=3:1e-1", "rank!=3", 0.1),
    ("comm:0", "comm", 0.0),  # scaling to nothing is allowed (as --zero)
])
def test_scale_selector_and_factor(arg, selector, factor):
    (c,) = parse_changes([], [], [arg])
    assert (c.action, c.selector, c.factor) == ("scale", selector, factor)
    assert parse_changes([], [], [c.args()[1]]) == [c]  # args() gives the flag back
    assert c.args()[0] == "--scale"


@pytest.mark.parametrize("arg, bad", [
    ("stage=1", "expected SELECTOR:FACTOR"),
    ("stage=1:x", "factor 'x' is not a number"),
    ("stage=1:", "factor '' is not a number"),
    ("worker=dp0:pp1", "factor 'pp1' is not a number"),  # a worker selector needs its factor too
    ("stage=1:-0.5", "factor must be a finite number >= 0"),
    ("stage=1:nan", "factor must be a finite number >= 0"),
    ("stage=1:inf", "factor must be a finite number >= 0"),
])
def test_scale_bad_factor(arg, bad):
    msg = one_line_error(parse_changes, [], [], [arg])
    assert msg.startswith(f"--scale {arg!r}: ") and bad in msg


@pytest.mark.parametrize("sel, part", [
    ("rank=", "rank="),  # no value
    ("stage", "stage"),
    ("foo=1", "foo=1"),  # unknown key
    ("Rank=1", "Rank=1"),
    ("everything", "everything"),
    ("optype!", "optype!"),
    ("", ""),
    ("rank=1,", ""),  # an empty part of an intersection
    (",rank=1", ""),
    ("rank=1,,kind=x", ""),
    ("rank=1,bogus=2", "bogus=2"),  # the bad part, not the whole selector
])
def test_malformed_selector(sel, part):
    for args in (([sel], [], []), ([], [sel], []), ([], [], [f"{sel}:2"])):
        msg = one_line_error(parse_changes, *args)
        assert msg.startswith(f"selector {part!r} not understood (use all, comm, compute, or one of stage=..."), msg


@pytest.mark.parametrize("flag", ["peer", "even", "despike"])
def test_malformed_selector_in_the_other_flags(flag):
    msg = one_line_error(parse_changes, [], [], [], **{flag: ["dp=0,stage1"]})
    assert "selector 'stage1' not understood" in msg and "stage=..." in msg


def test_nothing_to_change():
    msg = one_line_error(parse_changes, [], [], [], peer=[], even=[], despike=[])
    assert msg.startswith("nothing to change")


def test_change_args():
    assert Change(action="fix", selector="rank=1").args() == ["--fix", "rank=1"]
    assert Change(action="scale", selector="stage=0", factor=1 / 3).args() == ["--scale", "stage=0:0.333333"]


# --- a change acts on the ops its selector names --------------------------------------------------

def test_changes_act_on_the_selected_ops(base):
    # zero rank 1, halve stage 1: the other ops (ranks 0 of stage 0) keep their measured weight
    w, changed = apply_changes(base, parse_changes([], ["rank=1"], ["stage=1:0.5"]))
    rank = np.array([r["rank"] for r in ROWS])
    assert np.array_equal(changed, rank != 0)
    assert (w[rank == 1] == 0).all()
    assert np.allclose(w[rank >= 2], 0.5 * base.measured[rank >= 2])
    assert np.array_equal(w[rank == 0], base.measured[rank == 0])
    # the selectors' order: zero before scale, so scaling a zeroed op leaves it 0
    w2, _ = apply_changes(base, parse_changes([], ["stage=1"], ["rank=3:2"]))
    assert (w2[rank == 3] == 0).all()
