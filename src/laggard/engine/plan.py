"""The replay plan of a dependency graph (``laggard.engine.graph``): its node-level edges, each
node's level by Kahn's algorithm, the nodes ordered into segments of one level and in-degree bucket
with a dense matrix of predecessor positions each, and the ops each step ends with.

A replay (``laggard.engine.replay``) walks the segments in order, one vectorised pass per segment;
these functions only lay the plan out, from CSR arrays, and know nothing of the op table.
"""

from __future__ import annotations

import numpy as np

from laggard.engine.kernels import kernel


def csr_gather(ptr: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate CSR rows ``rows``: returns (values, row-of-each-value as position in ``rows``)."""
    lens = ptr[rows + 1] - ptr[rows]
    total = int(lens.sum())
    if total == 0:
        return idx[:0], np.zeros(0, dtype=np.int64)
    owner = np.repeat(np.arange(len(rows)), lens)
    first = np.repeat(ptr[rows] - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    return idx[first + np.arange(total)], owner


def to_csr(dst: np.ndarray, src: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Edges ``src -> dst`` as CSR rows of ``n`` nodes: row ``d`` lists the sources of ``d``."""
    order = np.argsort(dst, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=ptr[1:])
    return ptr, src[order]


def node_edges(dep_ptr: np.ndarray, dep_idx: np.ndarray, op_group: np.ndarray,
                n: int) -> tuple[np.ndarray, np.ndarray]:
    """Node-level edges (src -> dst): unsynced op <- its deps; group <- deps of all members;
    member <- group (group nodes are n + group index)."""
    synced = op_group >= 0
    dep_owner = np.repeat(np.arange(n), np.diff(dep_ptr))
    from_synced = synced[dep_owner]
    dst = np.concatenate(
        [dep_owner[~from_synced], n + op_group[dep_owner[from_synced]], np.flatnonzero(synced)]
    )
    src = np.concatenate([dep_idx[~from_synced], dep_idx[from_synced], n + op_group[synced]])
    return src, dst


def levels(pptr: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Each node's level by Kahn's algorithm (the longest path to it from a node without
    predecessors); -1 for nodes on or behind a cycle. Compiled where built (``laggard.engine.kernels``:
    one pass over the edges, where the numpy twin makes a few calls per level, hundreds of levels on a
    pipeline's step: trace-AR's 11 ms to 0.3)."""
    num_nodes = len(pptr) - 1
    sptr, sidx = to_csr(src, dst, num_nodes)
    compiled = kernel("levels")
    if compiled is None:
        return levels_numpy(pptr, sptr, sidx)
    level = np.empty(num_nodes, dtype=np.int64)
    compiled(sptr, np.ascontiguousarray(sidx), np.diff(pptr), level)
    return level


def levels_numpy(pptr: np.ndarray, sptr: np.ndarray, sidx: np.ndarray) -> np.ndarray:
    """The compiled ``levels``' twin: one frontier (a level) at a time; -1 for nodes on or behind a cycle."""
    level = np.full(len(pptr) - 1, -1, dtype=np.int64)
    frontier = np.flatnonzero(np.diff(pptr) == 0)
    remaining = np.diff(pptr)
    lv = 0
    while len(frontier):
        level[frontier] = lv
        succ, _ = csr_gather(sptr, sidx, frontier)
        if len(succ) == 0:
            break
        u, c = np.unique(succ, return_counts=True)
        remaining[u] -= c
        frontier = u[remaining[u] == 0]
        lv += 1
    return level


def segments(level: np.ndarray, deg: np.ndarray, pptr: np.ndarray, pidx: np.ndarray) -> tuple[np.ndarray, ...]:
    """Nodes ordered by (level, in-degree bucket); per segment of equal (level, bucket) a dense
    (rows x bucket) matrix of predecessor positions, padded with num_nodes. Returns (pos,
    seg_start, seg_end, seg_k, seg_off, seg_pred)."""
    num_nodes = len(level)
    bucket = np.where(deg <= 4, deg, 1 << np.ceil(np.log2(np.maximum(deg, 1))).astype(np.int64))
    order = np.lexsort((bucket, level))
    pos = np.empty(num_nodes, dtype=np.int64)
    pos[order] = np.arange(num_nodes)
    lv_o, bk_o = level[order], bucket[order]
    new_seg = np.ones(num_nodes, dtype=bool)
    new_seg[1:] = (lv_o[1:] != lv_o[:-1]) | (bk_o[1:] != bk_o[:-1])
    seg_start = np.flatnonzero(new_seg)
    seg_end = np.append(seg_start[1:], num_nodes)
    keep = lv_o[seg_start] > 0  # level 0 has no predecessors: nothing to replay
    seg_start, seg_end = seg_start[keep], seg_end[keep]
    seg_k = bk_o[seg_start]
    sizes = (seg_end - seg_start) * seg_k
    seg_off = (np.cumsum(sizes) - sizes).astype(np.int64)
    seg_pred = np.full(int(sizes.sum()), num_nodes, dtype=np.int64)
    # scatter every node's predecessors into its row of its segment's matrix
    seg_of = np.full(num_nodes, -1, dtype=np.int64)
    seg_id = np.repeat(np.arange(len(seg_start)), seg_end - seg_start)
    seg_of[np.concatenate([np.arange(a, b) for a, b in zip(seg_start, seg_end, strict=True)])
           if len(seg_start) else []] = seg_id
    vals, owner = csr_gather(pptr, pidx, order)  # owner: position of the node
    if len(vals):
        first = np.concatenate([[0], np.cumsum(deg[order])[:-1]])
        slot = np.arange(len(vals)) - first[owner]
        sg = seg_of[owner]
        row = owner - seg_start[sg]
        seg_pred[seg_off[sg] + row * seg_k[sg] + slot] = pos[vals]
    return pos, seg_start, seg_end, seg_k, seg_off, seg_pred


def sinks(src: np.ndarray, op_step: np.ndarray, n: int, num_nodes: int,
           num_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Ops no node waits for, sorted by step, and each step's bounds among them (members of a
    group feed only their group's successors through the group node, so they count as sinks only
    if the group has none)."""
    has_succ = np.zeros(num_nodes, dtype=bool)
    has_succ[src] = True
    sinks = np.flatnonzero(~has_succ[:n])
    sinks = sinks[np.argsort(op_step[sinks], kind="stable")]
    return sinks, np.searchsorted(op_step[sinks], np.arange(num_steps + 1)).astype(np.int64)
