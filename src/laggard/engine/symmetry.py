"""Per-DP-rank what-ifs without replaying every DP rank.

In the what-if "DP rank d as measured, every other op ideal", all DP ranks but d carry the same
ideal durations and, when the DP ranks run the same schedule, the same dependency structure:
their replayed timelines are identical. DP ranks only meet at collectives, where the latest
arrival decides, so the whole job behaves exactly like a job of two DP ranks: d and one
representative of the others. This module checks that the DP ranks are structurally identical
and builds that two-rank job once; every DP rank's what-if is then one column of a batched
replay over a graph 2/D the size of the job's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from laggard.engine.graph import Graph, build_graph
from laggard.engine.sorting import lex_order
from laggard.optable.ops import Job, unique_inverse


@dataclass(kw_only=True, slots=True)
class DPReduction:
    graph: Graph  # the two-DP-rank job
    slot: np.ndarray  # per op of the reduced job: 0 = the rank under study, 1 = the representative
    local: np.ndarray  # per op of the reduced job: its index within its DP rank's canonical order
    rank_ops: np.ndarray  # (num_dp, ops per DP rank): op index (full job) in canonical order
    dp_values: np.ndarray  # DP rank of each row of rank_ops


def _dense(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Each value's index among the sorted distinct values, and how many there are (``np.unique``'s
    inverse: ``unique_inverse``, which counts integers of a narrow range instead of sorting)."""
    u, inv = unique_inverse(x)
    return inv, len(u)


def _canonical_order(job: Job, dp: np.ndarray) -> np.ndarray:
    """Ops sorted by (dp, step, stage, tp, cp, chunk, type, microbatch, group seq, start)."""
    name, _ = job.codes("name")
    key = np.zeros(job.num_ops, dtype=np.int64)
    for col in ("step", "pp_rank", "tp_rank", "cp_rank", "vchunk", None, "microbatch"):
        d, k = _dense(name if col is None else job.column(col))
        key = key * k + d  # mixed radix: fits int64 for any realistic layout
    return lex_order(dp, key, job.column("seq"), job.column("start_ns"))


def _interchangeable(job: Job, graph: Graph) -> tuple[np.ndarray, np.ndarray] | None:
    """(DP rank values, ops of each DP rank in canonical order) if the DP ranks are interchangeable."""
    dp = job.column("dp_rank").astype(np.int64)
    dps, counts = np.unique(dp, return_counts=True)
    if len(dps) < 3 or (counts != counts[0]).any():
        return None
    num_dp, m = len(dps), int(counts[0])
    rank_ops = _canonical_order(job, dp).reshape(num_dp, m)
    # same op at the same canonical place on every DP rank
    name, _ = job.codes("name")
    for col in (name, job.column("step"), job.column("pp_rank"), job.column("microbatch"), job.column("seq")):
        c = np.asarray(col)[rank_ops]
        if (c != c[0]).any():
            return None
    local = np.empty(graph.num_ops, dtype=np.int64)
    local[rank_ops] = np.arange(m)[None, :]
    # same dependencies, all within the DP rank
    owner = np.repeat(np.arange(graph.num_ops), np.diff(graph.dep_ptr))
    if (dp[owner] != dp[graph.dep_idx]).any():
        return None
    ndeps = np.diff(graph.dep_ptr)[rank_ops]
    if (ndeps != ndeps[0]).any():
        return None
    dep_sig = np.zeros(graph.num_ops, dtype=np.int64)
    np.add.at(dep_sig, owner, (local[graph.dep_idx] + 1) * 1_000_003 % 2_147_483_647)
    ds = dep_sig[rank_ops]
    if (ds != ds[0]).any():
        return None
    # same communication groups: a group within one DP rank must be the same on every rank;
    # a group across DP ranks must hold the same canonical ops of every rank
    g = graph.op_group
    if graph.num_groups:
        members_dp = dp[graph.group_ops]
        gmin = np.minimum.reduceat(members_dp, graph.group_ptr[:-1])
        gmax = np.maximum.reduceat(members_dp, graph.group_ptr[:-1])
        cross = gmin != gmax
        first_local = np.minimum.reduceat(local[graph.group_ops], graph.group_ptr[:-1])
        sig = np.where(g >= 0, np.where(cross[np.maximum(g, 0)], -2 - g, first_local[np.maximum(g, 0)]), -1)
        sg = sig[rank_ops]
        if (sg != sg[0]).any():
            return None
        if cross.any() and (np.diff(graph.group_ptr)[cross] % num_dp).any():
            return None
    return dps, rank_ops


def reduce_dp(job: Job, graph: Graph) -> DPReduction | None:
    """The two-DP-rank equivalent of ``job``, or None when the DP ranks are not interchangeable."""
    m = graph.ops_per_step
    if m and len(graph.steps) > 1:
        # steps repeat step 0 exactly: check step 0 and repeat its canonical order
        job0 = Job(table=job.table.slice(0, m), meta=job.meta)
        found = _interchangeable(job0, build_graph(job0))
        if found is None:
            return None
        dps, ro0 = found
        k = np.arange(len(graph.steps), dtype=np.int64)
        rank_ops = (ro0[:, None, :] + (k * m)[None, :, None]).reshape(len(dps), -1)
    else:
        found = _interchangeable(job, graph)
        if found is None:
            return None
        dps, rank_ops = found
    local = np.empty(graph.num_ops, dtype=np.int64)
    local[rank_ops] = np.arange(rank_ops.shape[1])[None, :]
    dp = job.column("dp_rank")
    keep = np.isin(dp, dps[:2])
    sub = Job(table=job.table.filter(pa.array(keep)), meta=job.meta)
    sub_graph = build_graph(sub)
    kept = np.flatnonzero(keep)
    return DPReduction(
        graph=sub_graph,
        slot=(dp[kept] == dps[1]).astype(np.int64),
        local=local[kept],
        rank_ops=rank_ops,
        dp_values=dps,
    )


def per_dp_weights(red: DPReduction, measured: np.ndarray, ideal: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Weights (reduced ops x len(rows)): slot 0 = DP rank ``rows[j]`` measured, slot 1 ideal."""
    rep = red.rank_ops[1][red.local]  # the representative's op for every reduced op
    w = np.repeat(ideal[rep][:, None], len(rows), axis=1)
    mine = red.slot == 0
    w[mine] = measured[red.rank_ops[rows][:, red.local[mine]]].T
    return w
