"""Tensor parallelism read from the process groups a trace's collectives ran on.

A trace that records each collective's group ranks (the zero-code capture, a profiler trace whose
``record_param_comms`` carry "Process Group Ranks") shows the job's parallel dimensions as
partitions of the ranks into equal groups. Tensor parallelism and data parallelism both make one,
and they are orthogonal (a TP group and a DP group share at most one rank); what tells them apart is
what their collectives carry: a TP group reduces activations *inside the forward pass* (Megatron's
all-reduce of the row-parallel output, or sequence parallelism's reduce-scatter), while a DP group
reduces gradients after or during the backward, never in the forward. An all-gather in the forward
is not enough: FSDP gathers parameters there, in what is a DP (sharding) group. So:

* the **TP groups** are the groups that issue a reducing collective (all-reduce, reduce-scatter)
  inside a forward pass: disjoint, all of one size of at least 2, covering every rank;
* the **DP groups** are the other groups orthogonal to them: disjoint, of one size, covering every
  rank (required unless the TP groups and the pipeline stages account for every rank: dp 1).

Each rank's TP rank is its place in its TP group (members sorted); within a pipeline stage the TP
groups are the stage's DP replicas, ordered by their lowest rank. Anything else (overlapping groups,
sizes that differ, a DP group holding two ranks of one TP group) reads no tensor parallelism: the
layout stays as it was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_REDUCING = re.compile(r"allreduce|reducescatter")


def reduces(name: str) -> bool:
    """Whether a collective's name is a reducing one ('all-reduce', 'gloo:all_reduce',
    'ncclDevKernel_ReduceScatter', '_reduce_scatter_base')."""
    return bool(_REDUCING.search(re.sub(r"[^a-z]", "", name.lower())))


@dataclass(kw_only=True, slots=True)
class GroupUse:
    """What one process group's collectives did: its ranks, how many collectives it ran (summed over
    its ranks' traces) and how many of them were reducing ones issued inside a forward pass."""

    ranks: tuple[int, ...]
    collectives: int = 0
    reduce_in_forward: int = 0


@dataclass(kw_only=True, slots=True)
class TensorParallel:
    """Each rank's (dp, tp) coordinates within its stage, and how they were read."""

    tp_size: int
    dp_size: int
    coords: dict[int, tuple[int, int]]  # rank -> (dp, tp)
    tp_groups: list[list[int]]
    dp_groups: list[list[int]]
    how: str


def infer_tp(uses: list[GroupUse], ranks: list[int], stage_of: dict[int, int] | None = None
             ) -> TensorParallel | None:
    """The TP and DP groups among ``uses`` (see the module docstring), or None where they do not make
    a tensor-parallel layout. ``stage_of``: each rank's pipeline stage (all 0 without a pipeline)."""
    traced = set(ranks)
    stage_of = stage_of or dict.fromkeys(ranks, 0)
    groups: dict[tuple[int, ...], GroupUse] = {}
    for u in uses:
        key = tuple(sorted(set(u.ranks)))
        if not 1 < len(key) < len(traced) or not set(key) <= traced:
            continue  # the world group, a group of one, a group with untraced ranks
        old = groups.setdefault(key, GroupUse(ranks=key))
        old.collectives += u.collectives
        old.reduce_in_forward += u.reduce_in_forward
    tp = sorted((g for g, u in groups.items() if u.reduce_in_forward > 0), key=min)
    if not tp or not _partition(tp, traced):
        return None
    t = len(tp[0])
    if any(len({stage_of[r] for r in g}) > 1 for g in tp):
        return None  # the ranks of one TP group run one stage
    dp = sorted((g for g in groups if g not in set(tp) and len({stage_of[r] for r in g}) == 1
                 and all(len(set(g) & set(x)) <= 1 for x in tp)), key=min)  # (not a group across stages)
    per_stage = len(traced) // max(len(set(stage_of.values())), 1)
    if dp and not _partition(dp, traced):
        return None
    if not dp and per_stage != t:
        return None  # several TP groups on a stage but no gradient group across them
    coords: dict[int, tuple[int, int]] = {}
    replica: dict[int, int] = {}
    for g in tp:  # (sorted by their lowest rank)
        s = stage_of[g[0]]
        d = replica[s] = replica.get(s, -1) + 1
        for i, r in enumerate(g):
            coords[r] = (d, i)
    for g in dp:  # a DP group: one TP rank, every DP replica of its stage once
        if len({coords[r][1] for r in g}) > 1 or len({coords[r][0] for r in g}) != len(g):
            return None
    dp_size = per_stage // t
    if dp and len(dp[0]) != dp_size:
        return None
    how = (f"tensor parallel {t} from the process groups: {_few(tp)} reduce activations inside the forward pass"
           + (f"; data parallel {dp_size} over {_few(dp)} (gradients)" if dp else ""))
    return TensorParallel(tp_size=t, dp_size=dp_size, coords=coords, tp_groups=[list(g) for g in tp],
                          dp_groups=[list(g) for g in dp], how=how)


def _partition(groups: list[tuple[int, ...]], ranks: set[int]) -> bool:
    """Whether ``groups`` split ``ranks`` into disjoint parts of one size."""
    return len({len(g) for g in groups}) == 1 and sum(len(g) for g in groups) == len(ranks) and \
        set().union(*map(set, groups)) == ranks


def _few(groups: list[tuple[int, ...]]) -> str:
    shown = ", ".join("{" + ",".join(map(str, g)) + "}" for g in groups[:4])
    return shown + (f" and {len(groups) - 4} more" if len(groups) > 4 else "")


__all__ = ["GroupUse", "TensorParallel", "infer_tp", "reduces"]
