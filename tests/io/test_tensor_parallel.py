"""Tensor parallelism from the process groups collectives ran on (``laggard.io.tensor_parallel``): the
groups that reduce inside the forward are TP, the orthogonal ones DP. The real tp 2 x dp 2 job is in
tests/tracer/test_autotrace.py."""

from __future__ import annotations

from laggard.io.tensor_parallel import GroupUse, infer_tp, reduces


def _use(ranks: tuple[int, ...], fwd: int, n: int = 8) -> GroupUse:
    return GroupUse(ranks=ranks, collectives=n, reduce_in_forward=fwd)


def test_reducing_names() -> None:
    assert all(reduces(n)
               for n in ("all-reduce", "gloo:all_reduce", "ncclDevKernel_ReduceScatter_Sum", "_reduce_scatter_base"))
    assert not any(reduces(n) for n in ("all-gather", "broadcast", "gloo:send", "barrier"))


def test_tp2_dp2() -> None:
    tp = infer_tp([_use((0, 1), 2), _use((2, 3), 2), _use((0, 2), 0, 12), _use((1, 3), 0, 12)], [0, 1, 2, 3])
    assert tp is not None and (tp.tp_size, tp.dp_size) == (2, 2)
    assert tp.coords == {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}
    assert tp.tp_groups == [[0, 1], [2, 3]] and tp.dp_groups == [[0, 2], [1, 3]]
    assert "reduce activations inside the forward" in tp.how


def test_tp_groups_across_rank_numbers() -> None:
    """TP over {0, 2} and {1, 3} (ranks numbered DP-first): each TP group is one DP replica."""
    tp = infer_tp([_use((0, 2), 2), _use((1, 3), 2), _use((0, 1), 0), _use((2, 3), 0)], [0, 1, 2, 3])
    assert tp is not None and tp.coords == {0: (0, 0), 2: (0, 1), 1: (1, 0), 3: (1, 1)}


def test_with_a_pipeline() -> None:
    """tp 2 x pp 2 (dp 1): TP groups inside each stage, no DP group needed."""
    stage = {0: 0, 1: 0, 2: 1, 3: 1}
    tp = infer_tp([_use((0, 1), 2), _use((2, 3), 2)], [0, 1, 2, 3], stage)
    assert tp is not None and (tp.tp_size, tp.dp_size) == (2, 1)
    assert infer_tp([_use((0, 2), 2), _use((1, 3), 2)], [0, 1, 2, 3], stage) is None  # a TP group across stages


def test_not_tensor_parallel() -> None:
    ranks = [0, 1, 2, 3]
    # HSDP: the shard groups only gather in the forward (FSDP's parameters), no reduction there
    assert infer_tp([_use((0, 1), 0), _use((2, 3), 0), _use((0, 2), 0), _use((1, 3), 0)], ranks) is None
    # plain DDP on the world group
    assert infer_tp([_use((0, 1, 2, 3), 0)], ranks) is None
    # forward reductions on groups of different sizes, or overlapping
    assert infer_tp([_use((0, 1), 2), _use((1, 2, 3), 2)], ranks) is None
    assert infer_tp([_use((0, 1), 2), _use((1, 2), 2), _use((2, 3), 2)], ranks) is None
    # two TP groups, but no gradient group across them: no evidence they are replicas of one job
    assert infer_tp([_use((0, 1), 2), _use((2, 3), 2)], ranks) is None
    # a "DP" group holding both ranks of a TP group: not orthogonal, left out, so none is left
    assert infer_tp([_use((0, 1), 2), _use((2, 3), 2), _use((0, 1, 2), 0)], ranks) is None
