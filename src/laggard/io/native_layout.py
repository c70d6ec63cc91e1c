"""The pipeline layout of a zero-code trace, read from its point-to-point transfers.

A trace recorded by ``laggard run`` / ``laggard.autotrace`` knows no layout: the tracer starts before
the program builds its pipeline, so every rank is its own DP replica in ``job.json``. Its transfers
say more: ranks joined by sends and receives form one pipeline, a chain of stages, and stage 0 is
the end whose first transfer of a step is a send (the forward's activations leave it before any
gradient comes back). When every rank lies on such a chain and all chains have the same length, the
trace is read as ``dp`` chains of ``pp`` stages (chains numbered by their lowest rank); anything
else (a rank with no transfer, a rank with three neighbours, chains of different lengths) keeps the
layout the trace says.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np
import pyarrow as pa

from laggard.optable.ops import Job

INFERRED_KEY = "layout_inferred"  # meta.extra: how the layout was inferred


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
