"""The parallel layout of a zero-code trace: its pipelines read from its point-to-point transfers,
its tensor parallelism from its collectives' process groups.

A trace recorded by ``laggard run`` / ``laggard.autotrace`` knows no layout: the tracer starts before
the program builds its pipeline, so every rank is its own DP replica in ``job.json``. Its transfers
say more: ranks joined by sends and receives form one pipeline, a chain of stages, and stage 0 is
the end whose first transfer of a step is a send (the forward's activations leave it before any
gradient comes back). When every rank lies on such a chain and all chains have the same length, the
trace is read as ``dp`` chains of ``pp`` stages (chains numbered by their lowest rank); anything
else (a rank with no transfer, a rank with three neighbours, chains of different lengths) keeps the
layout the trace says.

Tensor parallelism (``infer_tensor_parallel``) comes from the groups every collective records
(``pg:0,1``): the groups that reduce inside a forward pass are TP groups, the groups orthogonal to
them DP groups (``laggard.io.tensor_parallel``); the TP rank is then a column of its own, and the
ranks of one TP group share their DP rank and stage.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np
import pyarrow as pa

from laggard.io.tensor_parallel import GroupUse, infer_tp, reduces
from laggard.optable.ops import Job

INFERRED_KEY = "layout_inferred"  # meta.extra: how the layout was inferred


def infer_layout(job: Job) -> Job:
    """``job`` with the pipelines and the tensor parallelism its capture did not record."""
    return infer_tensor_parallel(infer_pipeline(job))


def infer_pipeline(job: Job) -> Job:
    """``job`` with its pipeline layout where its capture left none (see the module docstring)."""
    meta = job.meta
    if meta.extra.get("capture") != "autotrace" or meta.pp_size != 1 or job.table.num_rows == 0:
        return job
    t = job.table
    kind = t.column("kind").to_numpy(zero_copy_only=False)
    p2p = np.isin(kind, ["p2p_send", "p2p_recv"])
    if not p2p.any():
        return job
    rank = t.column("rank").to_numpy()
    groups = t.column("group").to_numpy(zero_copy_only=False)
    neighbours: dict[int, set[int]] = defaultdict(set)
    for g in set(groups[p2p]):
        try:
            a, b = (int(x) for x in str(g).removeprefix("p2p:").split(">"))
        except ValueError:
            return job
        if a != b:
            neighbours[a].add(b)
            neighbours[b].add(a)
    ranks = sorted(set(rank.tolist()))
    chains = _chains(ranks, neighbours)
    if chains is None:
        return job
    step = t.column("step").to_numpy()
    start = t.column("start_ns").to_numpy()
    first_kind = _first_transfer(rank, step, start, kind, p2p)
    stage_of, dp_of = {}, {}
    for d, chain in enumerate(sorted(chains, key=min)):
        if first_kind.get(chain[-1]) == "p2p_send" and first_kind.get(chain[0]) != "p2p_send":
            chain = chain[::-1]
        for s, r in enumerate(chain):
            stage_of[r], dp_of[r] = s, d
    pp = np.array([stage_of[int(r)] for r in rank], dtype=np.int32)
    dp = np.array([dp_of[int(r)] for r in rank], dtype=np.int32)
    table = t.set_column(t.schema.get_field_index("dp_rank"), t.schema.field("dp_rank"), pa.array(dp))
    table = table.set_column(table.schema.get_field_index("pp_rank"), table.schema.field("pp_rank"), pa.array(pp))
    extra = dict(meta.extra)
    if isinstance(extra.get("ranks"), list):
        extra["ranks"] = [{**row, "dp": dp_of.get(row.get("rank"), row.get("dp")),
                           "pp": stage_of.get(row.get("rank"), row.get("pp"))} for row in extra["ranks"]]
    extra[INFERRED_KEY] = f"{len(chains)} pipeline(s) of {len(chains[0])} stages from point-to-point transfers"
    return Job(table=table, meta=replace(meta, dp_size=len(chains), pp_size=len(chains[0]), extra=extra))


def _chains(ranks: list[int], neighbours: dict[int, set[int]]) -> list[list[int]] | None:
    """Every rank's chain (a path through the transfer graph), or None where the graph is not chains of
    one length, each of at least two ranks."""
    if any(r not in neighbours or len(neighbours[r]) > 2 for r in ranks) or set(neighbours) - set(ranks):
        return None
    seen: set[int] = set()
    chains = []
    for r in ranks:
        if r in seen:
            continue
        ends = [x for x in _component(r, neighbours) if len(neighbours[x]) == 1]
        if len(ends) != 2:  # a ring, not a chain
            return None
        chain, prev = [min(ends)], None
        while True:
            nxt = [x for x in neighbours[chain[-1]] if x != prev]
            if not nxt:
                break
            prev = chain[-1]
            chain.append(nxt[0])
        seen.update(chain)
        chains.append(chain)
    return chains if len({len(c) for c in chains}) == 1 else None


def _component(r: int, neighbours: dict[int, set[int]]) -> set[int]:
    out, todo = {r}, [r]
    while todo:
        for x in neighbours[todo.pop()]:
            if x not in out:
                out.add(x)
                todo.append(x)
    return out


def _first_transfer(rank: np.ndarray, step: np.ndarray, start: np.ndarray, kind: np.ndarray,
                    p2p: np.ndarray) -> dict[int, str]:
    """Each rank's first transfer's kind in the first step after the first (step 0 holds the set-up)."""
    steps = np.unique(step[p2p])
    at = steps[1] if len(steps) > 1 else steps[0]
    out: dict[int, str] = {}
    sel = np.flatnonzero(p2p & (step == at))
    for i in sel[np.argsort(start[sel], kind="stable")]:
        out.setdefault(int(rank[i]), str(kind[i]))
    return out


def infer_tensor_parallel(job: Job) -> Job:
    """``job`` with TP ranks where its collectives' groups show tensor parallelism (see the module
    docstring); the DP ranks are then the TP groups' places within their stage."""
    meta = job.meta
    if meta.extra.get("capture") != "autotrace" or meta.tp_size != 1 or job.table.num_rows == 0:
        return job
    kind_code, kinds = job.codes("kind")
    group_code, labels = job.codes("group")
    name_code, names = job.codes("name")
    coll = (kind_code == kinds.index("collective")) if "collective" in kinds else np.zeros(len(kind_code), bool)
    if not coll.any():
        return job
    members: dict[int, tuple[int, ...]] = {}
    for i, label in enumerate(labels):
        if label.startswith("pg:"):
            try:
                members[i] = tuple(int(x) for x in label.removeprefix("pg:").split(","))
            except ValueError:
                continue
    if len(members) < 2:
        return job
    rank, step = job.column("rank").astype(np.int64), job.column("step").astype(np.int64)
    is_compute = np.isin(kind_code, [kinds.index(k) for k in ("compute",) if k in kinds])
    fwd_name = np.array(["forward" in n.lower() for n in names] + [False], dtype=bool)
    inside = _inside_forward(rank, step, job.column("start_ns"), is_compute, fwd_name[name_code], coll)
    red_name = np.array([reduces(n) for n in names] + [False], dtype=bool)
    red = red_name[name_code] & inside
    g = np.where(coll, group_code, -1)
    count = np.bincount(g[g >= 0], minlength=len(labels))
    red_count = np.bincount(g[(g >= 0) & red], minlength=len(labels))
    uses = [GroupUse(ranks=m, collectives=int(count[i]), reduce_in_forward=int(red_count[i]))
            for i, m in members.items()]
    dp_col, pp_col = job.column("dp_rank"), job.column("pp_rank")
    ranks, first = np.unique(rank, return_index=True)
    stage_of = {int(r): int(pp_col[i]) for r, i in zip(ranks, first, strict=True)}
    chain_of = {int(r): int(dp_col[i]) for r, i in zip(ranks, first, strict=True)}  # pipeline (infer_pipeline)
    tp = infer_tp(uses, [int(r) for r in ranks], stage_of)
    if tp is None:
        return job
    if meta.pp_size > 1 and any(len({tp.coords[r] for r in ranks_of}) > 1 for ranks_of in _by(chain_of).values()):
        return job  # a pipeline's stages hold different TP ranks: the groups and the transfers disagree
    lut_dp = np.zeros(int(ranks.max()) + 1, np.int32)
    lut_tp = np.zeros(int(ranks.max()) + 1, np.int32)
    for r, (d, t) in tp.coords.items():
        lut_dp[r], lut_tp[r] = d, t
    table = job.table
    for col, lut in (("dp_rank", lut_dp), ("tp_rank", lut_tp)):
        i = table.schema.get_field_index(col)
        table = table.set_column(i, table.schema.field(col), pa.array(lut[rank]))
    extra = dict(meta.extra)
    if isinstance(extra.get("ranks"), list):
        extra["ranks"] = [{**row, "dp": tp.coords[row["rank"]][0], "tp": tp.coords[row["rank"]][1]}
                          if row.get("rank") in tp.coords else row for row in extra["ranks"]]
    extra[INFERRED_KEY] = "; ".join(x for x in (extra.get(INFERRED_KEY), tp.how) if x)
    return Job(table=table, meta=replace(meta, dp_size=tp.dp_size, tp_size=tp.tp_size, extra=extra),
               warnings=job.warnings, load_args=job.load_args)


def _by(of: dict[int, int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for r, k in of.items():
        out[k].append(r)
    return out


def _inside_forward(rank: np.ndarray, step: np.ndarray, start: np.ndarray, compute: np.ndarray, forward: np.ndarray,
                    coll: np.ndarray) -> np.ndarray:
    """Collectives whose rank's compute just before and just after them (same step, by start time)
    are both forward passes: a collective inside the forward."""
    order = np.lexsort((start, step, rank))
    c, f = compute[order], forward[order]
    idx = np.arange(len(order))
    prev = np.maximum.accumulate(np.where(c, idx, -1))
    nxt = np.minimum.accumulate(np.where(c, idx, len(order))[::-1])[::-1]
    cell = rank[order] * (int(step.max()) + 2) + step[order]
    ok_prev = (prev >= 0) & (cell[np.maximum(prev, 0)] == cell)
    ok_next = (nxt < len(order)) & (cell[np.minimum(nxt, len(order) - 1)] == cell)
    inside = ok_prev & ok_next & f[np.maximum(prev, 0)] & f[np.minimum(nxt, len(order) - 1)]
    out = np.zeros(len(order), bool)
    out[order] = inside & coll[order]
    return out
