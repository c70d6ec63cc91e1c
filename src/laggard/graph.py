"""The job's dependency graph, built once from the op table and reused by every replay.

An op starts when all its dependencies have ended. Ops that share ``(step, group, seq)`` are the
participants of one collective (or the two ends of one p2p transfer): each ends at the latest
start among them plus its own transfer duration. For the replay the graph becomes a DAG over
*nodes*: one node per op and one per communication group. A group node waits for the
dependencies of all its members; a member waits only for its group node. Nodes are numbered in
topological level order so a replay is one vectorised pass per level.

Steps are replayed independently, each from its own t=0: dependencies across steps are dropped.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from laggard.ops import Job, LaggardError, LaggardWarning, valid_mask


@dataclass(kw_only=True, slots=True)
class Graph:
    num_ops: int
    num_groups: int
    steps: np.ndarray  # distinct step numbers, sorted
    op_step: np.ndarray  # index into ``steps`` per op
    # op -> its dependencies (op indices), CSR
    dep_ptr: np.ndarray
    dep_idx: np.ndarray
    # communication groups: group id per op (-1: none) and members per group (CSR)
    op_group: np.ndarray
    group_ptr: np.ndarray
    group_ops: np.ndarray
    # replay plan: nodes numbered by (level, in-degree bucket); position num_nodes is a sentinel
    # that always holds 0. Segment i covers positions seg_start[i]:seg_end[i], all of one level
    # with in-degree <= seg_k[i]; their predecessors form a dense (m, k) matrix at
    # seg_pred[seg_off[i] : seg_off[i] + m * k] (padded with the sentinel).
    op_pos: np.ndarray
    num_levels: int
    seg_start: np.ndarray
    seg_end: np.ndarray
    seg_k: np.ndarray
    seg_off: np.ndarray
    seg_pred: np.ndarray
    # ops sorted by step, with step boundaries (for per-step reductions)
    step_order: np.ndarray
    step_bounds: np.ndarray
    # the sinks (ops nothing waits for) of each step, by replay position: a step ends with them
    sink_pos: np.ndarray
    sink_bounds: np.ndarray

    @property
    def num_nodes(self) -> int:
        return self.num_ops + self.num_groups



def csr_gather(ptr: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate CSR rows ``rows``: returns (values, row-of-each-value as position in ``rows``)."""
    lens = ptr[rows + 1] - ptr[rows]
    total = int(lens.sum())
    if total == 0:
        return idx[:0], np.zeros(0, dtype=np.int64)
    owner = np.repeat(np.arange(len(rows)), lens)
    first = np.repeat(ptr[rows] - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    return idx[first + np.arange(total)], owner


def _to_csr(dst: np.ndarray, src: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(dst, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=ptr[1:])
    return ptr, src[order]


def _dependencies(job: Job, op_step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Explicit ``deps`` where given; otherwise the previous op on the same (rank, step, stream)."""
    n = job.num_ops
    t = job.table
    deps_col = t.column("deps").combine_chunks()
    op_id = job.column("op_id")
    has_list = valid_mask(deps_col)
    dst_parts, src_parts = [], []
    if has_list.any():
        offsets = deps_col.offsets.to_numpy()
        values = deps_col.values.to_numpy()
        lens = np.diff(offsets)
        lens = np.where(has_list, lens, 0)
        owner = np.repeat(np.arange(n), np.diff(offsets))
        keep_v = np.repeat(has_list, np.diff(offsets))
        vals, owner = values[keep_v], owner[keep_v]
        if np.array_equal(op_id, np.arange(n)):
            src = vals
            found = (src >= 0) & (src < n)
        else:
            order = np.argsort(op_id)
            pos = np.searchsorted(op_id, vals, sorter=order)
            pos = np.minimum(pos, n - 1)
            src = order[pos]
            found = op_id[src] == vals
        if not found.all():
            warnings.warn(
                f"ignored {int((~found).sum())} dependency reference(s) to ops not in the trace",
                LaggardWarning,
                stacklevel=3,
            )
        src, owner = src[found], owner[found]
        dst_parts.append(owner)
        src_parts.append(src)
    if (~has_list).any():
        rows = np.flatnonzero(~has_list)
        rank = job.column("rank")[rows]
        stream, _ = job.codes("stream")
        key_order = np.lexsort((job.column("start_ns")[rows], stream[rows], op_step[rows], rank[rows]))
        r = rows[key_order]
        same = (rank[key_order][1:] == rank[key_order][:-1]) & (stream[r][1:] == stream[r][:-1]) & (
            op_step[r][1:] == op_step[r][:-1]
        )
        dst_parts.append(r[1:][same])
        src_parts.append(r[:-1][same])
    dst = np.concatenate(dst_parts) if dst_parts else np.zeros(0, dtype=np.int64)
    src = np.concatenate(src_parts) if src_parts else np.zeros(0, dtype=np.int64)
    cross = op_step[dst] != op_step[src]
    self_dep = dst == src
    if cross.any():
        warnings.warn(
            f"ignored {int(cross.sum())} dependency(ies) across steps (steps are replayed independently)",
            LaggardWarning,
            stacklevel=3,
        )
    ok = ~cross & ~self_dep
    return _to_csr(dst[ok].astype(np.int64), src[ok].astype(np.int64), n)


def _groups(job: Job, op_step: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = job.num_ops
    gcode, _ = job.codes("group")
    rows = np.flatnonzero(gcode >= 0)
    op_group = np.full(n, -1, dtype=np.int64)
    if len(rows) == 0:
        return op_group, np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    seq = job.column("seq")[rows]
    order = np.lexsort((seq, gcode[rows], op_step[rows]))
    r = rows[order]
    new = np.ones(len(r), dtype=bool)
    new[1:] = (op_step[r][1:] != op_step[r][:-1]) | (gcode[r][1:] != gcode[r][:-1]) | (seq[order][1:] != seq[order][:-1])
    gid = np.cumsum(new) - 1
    op_group[r] = gid
    group_ptr = np.concatenate([np.flatnonzero(new), [len(r)]]).astype(np.int64)
    return op_group, group_ptr, r.astype(np.int64)


def group_sizes_check(job: Job, graph: Graph) -> np.ndarray:
    """Steps that hold a collective with fewer participants than the same group has elsewhere."""
    if graph.num_groups == 0:
        return np.zeros(0, dtype=np.int64)
    gcode, labels = job.codes("group")
    sizes = np.diff(graph.group_ptr)
    first = graph.group_ops[graph.group_ptr[:-1]]
    glabel = gcode[first]
    # modal size per label: the (label, size) pair seen most often for each label
    pairs, pair_count = np.unique(np.stack([glabel, sizes], axis=1), axis=0, return_counts=True)
    best = np.lexsort((-pair_count, pairs[:, 0]))
    first_of_label = np.ones(len(best), dtype=bool)
    first_of_label[1:] = pairs[best[1:], 0] != pairs[best[:-1], 0]
    expected = np.zeros(len(labels), dtype=np.int64)
    expected[pairs[best[first_of_label], 0]] = pairs[best[first_of_label], 1]
    short = sizes < expected[glabel]
    if not short.any():
        return np.zeros(0, dtype=np.int64)
    bad_steps = np.unique(graph.op_step[first[short]])
    g = int(np.flatnonzero(short)[0])
    warnings.warn(
        f"skipped {len(bad_steps)} step(s) with collectives missing participants (e.g. group "
        f"{labels[glabel[g]]!r} seq {int(job.column('seq')[first[g]])} in step "
        f"{int(graph.steps[graph.op_step[first[g]]])}: {int(sizes[g])} of {int(expected[glabel[g]])} ranks)",
        LaggardWarning,
        stacklevel=2,
    )
    return graph.steps[bad_steps]


def build_graph(job: Job) -> Graph:
    n = job.num_ops
    if n == 0:
        raise LaggardError("the trace has no ops")
    steps, op_step = np.unique(job.column("step"), return_inverse=True)
    op_step = op_step.astype(np.int64)
    dep_ptr, dep_idx = _dependencies(job, op_step)
    op_group, group_ptr, group_ops = _groups(job, op_step)
    num_groups = len(group_ptr) - 1

    # Node-level predecessors: unsynced op <- its deps; group <- deps of all members; member <- group.
    synced = op_group >= 0
    dep_owner = np.repeat(np.arange(n), np.diff(dep_ptr))
    from_synced = synced[dep_owner]
    dst = np.concatenate(
        [dep_owner[~from_synced], n + op_group[dep_owner[from_synced]], np.flatnonzero(synced)]
    )
    src = np.concatenate([dep_idx[~from_synced], dep_idx[from_synced], n + op_group[synced]])
    num_nodes = n + num_groups
    pptr, pidx = _to_csr(dst, src, num_nodes)

    # Kahn's algorithm, one frontier (level) at a time.
    indeg = np.diff(pptr)
    sptr, sidx = _to_csr(src, dst, num_nodes)
    level = np.full(num_nodes, -1, dtype=np.int64)
    frontier = np.flatnonzero(indeg == 0)
    remaining = indeg.copy()
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
    if (level < 0).any():
        stuck = np.flatnonzero(level[:n] < 0)
        ex = int(stuck[0]) if len(stuck) else 0
        names, labels = job.codes("name")
        raise LaggardError(
            f"the dependency graph has a cycle through {int((level < 0).sum())} op(s)/collective(s), "
            f"e.g. {labels[names[ex]]} on rank {int(job.column('rank')[ex])} in step {int(steps[op_step[ex]])}"
        )
    deg = np.diff(pptr)
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
    seg_off = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    seg_pred = np.full(int(sizes.sum()), num_nodes, dtype=np.int64)
    # scatter every node's predecessors into its row of its segment's matrix
    seg_of = np.full(num_nodes, -1, dtype=np.int64)
    seg_id = np.repeat(np.arange(len(seg_start)), seg_end - seg_start)
    seg_of[np.concatenate([np.arange(a, b) for a, b in zip(seg_start, seg_end, strict=True)]) if len(seg_start) else []] = seg_id
    vals, owner = csr_gather(pptr, pidx, order)  # owner: position of the node
    if len(vals):
        first = np.concatenate([[0], np.cumsum(deg[order])[:-1]])
        slot = np.arange(len(vals)) - first[owner]
        sg = seg_of[owner]
        row = owner - seg_start[sg]
        seg_pred[seg_off[sg] + row * seg_k[sg] + slot] = pos[vals]
    step_order = np.argsort(op_step, kind="stable")
    step_bounds = np.searchsorted(op_step[step_order], np.arange(len(steps) + 1)).astype(np.int64)
    # an op is a sink when no node waits for it (members of a group feed only their group's
    # successors through the group node, so they count as sinks only if the group has none)
    has_succ = np.zeros(num_nodes, dtype=bool)
    has_succ[src] = True
    sinks = np.flatnonzero(~has_succ[:n])
    sinks = sinks[np.argsort(op_step[sinks], kind="stable")]
    sink_bounds = np.searchsorted(op_step[sinks], np.arange(len(steps) + 1)).astype(np.int64)
    # int32 indices halve the memory and the bytes every replay gathers
    idx_t = np.int32 if num_nodes < 2**31 - 1 else np.int64
    del sptr, sidx, pptr, pidx, vals, owner, seg_of, seg_id
    return Graph(
        num_ops=n,
        num_groups=num_groups,
        steps=steps,
        op_step=op_step,
        dep_ptr=dep_ptr,
        dep_idx=dep_idx,
        op_group=op_group,
        group_ptr=group_ptr,
        group_ops=group_ops,
        op_pos=pos[:n].astype(idx_t),
        num_levels=int(level.max()) + 1,
        seg_start=seg_start,
        seg_end=seg_end,
        seg_k=seg_k,
        seg_off=seg_off,
        seg_pred=seg_pred.astype(idx_t),
        step_order=step_order,
        step_bounds=step_bounds,
        sink_pos=pos[sinks].astype(idx_t),
        sink_bounds=sink_bounds,
    )
