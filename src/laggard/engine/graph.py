"""The job's dependency graph, built once from the op table and reused by every replay.

An op starts when all its dependencies have ended. Ops that share ``(step, group, seq)`` are the
participants of one collective (or the two ends of one p2p transfer): each ends at the latest
start among them plus its own transfer duration. For the replay the graph becomes a DAG over
*nodes*: one node per op and one per communication group. A group node waits for the
dependencies of all its members; a member waits only for its group node. Nodes are numbered in
topological level order so a replay is one vectorised pass per level.

Steps are replayed independently, each from its own t=0: dependencies across steps are dropped
(``laggard.engine.replay_chain`` carries each rank from one step into the next for the fidelity check).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from laggard.engine.plan import levels, node_edges, segments, sinks, to_csr
from laggard.engine.sorting import lex_order
from laggard.errors import GraphCycleError, LaggardError, LaggardWarning
from laggard.optable.ops import (
    Job,
    fits_table,
    to_numpy,
    unique_inverse,
    valid_mask,
)


@dataclass(kw_only=True, slots=True, eq=False)  # numpy arrays: a generated == could only raise (no truth value)
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
    group_pos: np.ndarray  # replay position of each group node
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
    # when every step has the same ops in the same row order: ops per step (else 0)
    ops_per_step: int = 0

    @property
    def num_nodes(self) -> int:
        return self.num_ops + self.num_groups



def dependencies(job: Job, op_step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Explicit ``deps`` where given; otherwise the previous op on the same (rank, step, stream)."""
    n = job.num_ops
    t = job.table
    deps_col = t.column("deps").combine_chunks()
    op_id = job.column("op_id")
    has_list = valid_mask(deps_col)
    dst_parts, src_parts = [], []
    if has_list.any():
        offsets = to_numpy(deps_col.offsets)
        values = to_numpy(deps_col.values)
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
        key_order = lex_order(rank, op_step[rows], stream[rows], job.column("start_ns")[rows])
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
    return to_csr(dst[ok].astype(np.int64), src[ok].astype(np.int64), n)


def _groups(job: Job, op_step: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = job.num_ops
    gcode, _ = job.codes("group")
    rows = np.flatnonzero(gcode >= 0)
    op_group = np.full(n, -1, dtype=np.int64)
    if len(rows) == 0:
        return op_group, np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    seq = job.column("seq")[rows]
    order = lex_order(op_step[rows], gcode[rows], seq)
    r = rows[order]
    new = np.ones(len(r), dtype=bool)
    new[1:] = ((op_step[r][1:] != op_step[r][:-1]) | (gcode[r][1:] != gcode[r][:-1])
               | (seq[order][1:] != seq[order][:-1]))
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
    expected = modal_size(glabel.astype(np.int64), sizes, len(labels))
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


def modal_size(label: np.ndarray, size: np.ndarray, num_labels: int) -> np.ndarray:
    """Per label, the size seen most often with it (the smallest of those tied; 0 if never seen)."""
    width = int(size.max(initial=0)) + 1
    key = label * width + size
    if fits_table(num_labels * width, len(key)):  # a table of counts, no sort
        counts = np.bincount(key, minlength=num_labels * width).reshape(num_labels, width)
        return np.where(counts.any(axis=1), counts.argmax(axis=1), 0)
    pairs, pair_count = np.unique(key, return_counts=True)
    best = np.lexsort((-pair_count, pairs // width))
    first_of_label = np.r_[True, (pairs[best[1:]] // width) != (pairs[best[:-1]] // width)]
    out = np.zeros(num_labels, dtype=np.int64)
    out[pairs[best[first_of_label]] // width] = pairs[best[first_of_label]] % width
    return out


def build_graph(job: Job) -> Graph:
    n = job.num_ops
    if n == 0:
        raise LaggardError("the trace has no ops")
    steps, op_step = unique_inverse(job.column("step"))
    op_step = op_step.astype(np.int64)
    if len(steps) > 1:
        tiled = _build_tiled(job, steps, op_step)
        if tiled is not None:
            return tiled
    return _build(job, steps, op_step)


def _repeated_steps(job: Job, op_step: np.ndarray, num_steps: int) -> int:
    """Ops per step when every step repeats step 0 exactly (same rows in the same order, same
    explicit dependencies or none at all, same communication groups); 0 otherwise. (Without
    explicit dependencies each op follows the one before it on its (rank, stream) by start time:
    ``_build_tiled`` checks that the order step 0 gives holds in every step.)"""
    n = job.num_ops
    if n % num_steps or (np.diff(op_step) < 0).any():
        return 0
    m = n // num_steps
    deps = job.table.column("deps")
    if deps.null_count not in (0, n):
        return 0
    if not _same_rows(job, num_steps, m):
        return 0
    if deps.null_count == n:
        return m
    if not np.array_equal(job.column("op_id"), np.arange(n)):
        return 0
    # (combine_chunks copies even one chunk: 6 ms on trace-AR)
    d = deps.chunk(0) if deps.num_chunks == 1 else deps.combine_chunks()
    offsets = to_numpy(d.offsets)
    lens = np.diff(offsets).reshape(num_steps, m)
    if (lens != lens[0]).any():
        return 0
    e = int(lens[0].sum())
    rel = to_numpy(d.values)[offsets[0] : offsets[-1]].reshape(num_steps, e) - (np.arange(num_steps) * m)[:, None]
    if (rel != rel[0]).any():
        return 0
    return m


def _same_rows(job: Job, num_steps: int, m: int) -> bool:
    """Whether every step's ``m`` rows hold the same ranks, stages, microbatches, collective
    sequence numbers, names, groups and streams as step 0's, row by row."""
    for name in ("rank", "pp_rank", "microbatch", "seq"):
        c = job.column(name).reshape(num_steps, m)
        if (c != c[0]).any():
            return False
    for name in ("name", "group", "stream"):
        c = job.codes(name)[0].reshape(num_steps, m)
        if (c != c[0]).any():
            return False
    return True


def _same_chains(job: Job, g0: Graph, num_steps: int, m: int) -> bool:
    """Without explicit dependencies: whether every step orders each (rank, stream)'s ops as step 0
    does (``dependencies``: by start time, then row), so that step 0's edges are every step's. Each
    of step 0's edges joins two neighbours of its chain; a chain in order pair by pair is in order."""
    if job.table.column("deps").null_count == 0:
        return True
    dst = np.repeat(np.arange(m), np.diff(g0.dep_ptr))
    src = g0.dep_idx
    start = job.column("start_ns").reshape(num_steps, m)
    a, b = start[:, src], start[:, dst]
    return bool(((a < b) | ((a == b) & (src < dst))).all())


def _build_tiled(job: Job, steps: np.ndarray, op_step: np.ndarray) -> Graph | None:
    """Build the graph of step 0 and repeat it for every step (exact when steps repeat)."""
    k_steps = len(steps)
    m = _repeated_steps(job, op_step, k_steps)
    if not m:
        return None
    g0 = _build(Job(table=job.table.slice(0, m), meta=job.meta), steps[:1], op_step[:m])
    if not _same_chains(job, g0, k_steps, m):
        return None
    full_start, base, stride = _tiled_positions(g0, k_steps)
    idx_t = np.int32 if k_steps * g0.num_nodes < 2**31 - 1 else np.int64

    def at(p0: np.ndarray) -> np.ndarray:
        return _map_all(p0, base, stride, k_steps).astype(idx_t)

    ks = np.arange(k_steps, dtype=np.int64)
    n0, gr0 = g0.num_ops, g0.num_groups
    op_group = np.tile(g0.op_group, k_steps)
    size = g0.seg_end - g0.seg_start
    num_sinks = len(g0.sink_pos)
    return Graph(
        num_ops=k_steps * n0,
        num_groups=k_steps * gr0,
        steps=steps,
        op_step=op_step,
        dep_ptr=_tiled_ptr(g0.dep_ptr, k_steps),
        dep_idx=np.tile(g0.dep_idx, k_steps) + np.repeat(ks * n0, len(g0.dep_idx)),
        op_group=np.where(op_group >= 0, op_group + np.repeat(ks, n0) * gr0, -1),
        group_ptr=_tiled_ptr(g0.group_ptr, k_steps),
        group_ops=np.tile(g0.group_ops, k_steps) + np.repeat(ks, len(g0.group_ops)) * n0,
        op_pos=at(g0.op_pos),
        group_pos=at(g0.group_pos),
        num_levels=g0.num_levels,
        seg_start=full_start,
        seg_end=full_start + size * k_steps,
        seg_k=g0.seg_k,
        seg_off=np.array(k_steps * g0.seg_off, dtype=np.int64),
        seg_pred=_tiled_preds(g0, k_steps, base, stride, idx_t),
        step_order=np.arange(k_steps * n0),
        step_bounds=np.arange(k_steps + 1, dtype=np.int64) * n0,
        sink_pos=at(g0.sink_pos),
        sink_bounds=np.arange(k_steps + 1, dtype=np.int64) * num_sinks,
        ops_per_step=n0,
    )


def _tiled_positions(g0: Graph, k_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The repeated graph's segment starts, and where a position p0 of step 0 lies in step k:
    ``base[p0] + k * stride[p0]``. A segment's rows are laid out step after step, so the map is
    affine in k for each p0 (level 0: k * lvl0 + p0; the sentinel: num_nodes)."""
    nn0 = g0.num_nodes
    lvl0 = int(g0.seg_start[0]) if len(g0.seg_start) else nn0
    size = g0.seg_end - g0.seg_start
    full_start = k_steps * lvl0 + np.concatenate([[0], np.cumsum(size * k_steps)[:-1]]).astype(np.int64)
    # the segments cover positions lvl0..nn0-1 one after another (``laggard.engine.plan.segments``:
    # nodes sorted by level, level 0 first and in no segment)
    base = np.arange(nn0 + 1, dtype=np.int64)
    stride = np.full(nn0 + 1, lvl0, dtype=np.int64)
    base[lvl0:nn0] += np.repeat(full_start - g0.seg_start, size)
    stride[lvl0:nn0] = np.repeat(size, size)
    base[nn0], stride[nn0] = k_steps * nn0, 0
    return full_start, base, stride


def _map_all(p0: np.ndarray, base: np.ndarray, stride: np.ndarray, k_steps: int) -> np.ndarray:
    """Positions of ``p0`` in every step, step after step (``p0`` in step 0, then in step 1, ...)."""
    p0 = p0.astype(np.int64)
    ks = np.arange(k_steps, dtype=np.int64)
    return (base[p0][None, :] + ks[:, None] * stride[p0][None, :]).ravel()


def _tiled_ptr(ptr: np.ndarray, k_steps: int) -> np.ndarray:
    """CSR row pointers of step 0 repeated: each step's rows after the previous step's values."""
    rows, num_values = len(ptr) - 1, ptr[-1]
    return np.concatenate([np.tile(ptr[:-1], k_steps) + np.repeat(np.arange(k_steps) * num_values, rows),
                           [k_steps * num_values]])


def _tiled_preds(g0: Graph, k_steps: int, base: np.ndarray, stride: np.ndarray, idx_t: type) -> np.ndarray:
    """Each segment's predecessor matrix, step after step: segment i's (rows x k) slots of step 0
    are followed by the same slots in step 1, ... (one scatter for all segments, not a call per
    segment)."""
    size = g0.seg_end - g0.seg_start
    pred_len = size * g0.seg_k  # per segment: its slots in one step
    offs = k_steps * g0.seg_off
    seg_of = np.repeat(np.arange(len(size)), pred_len)
    p0 = g0.seg_pred[: int(pred_len.sum())].astype(np.int64)
    first = offs[seg_of] + (np.arange(len(p0)) - g0.seg_off[seg_of])  # each slot's place in step 0
    seg_pred = np.empty(len(p0) * k_steps, dtype=idx_t)
    base_p, stride_p, inc = base[p0], stride[p0], pred_len[seg_of]
    for k in range(k_steps):  # a step at a time: no (steps x slots) temporaries (4,096 workers: ~0.2 GB)
        seg_pred[first + k * inc] = base_p + k * stride_p
    return seg_pred


def _build(job: Job, steps: np.ndarray, op_step: np.ndarray) -> Graph:
    n = job.num_ops
    dep_ptr, dep_idx = dependencies(job, op_step)
    op_group, group_ptr, group_ops = _groups(job, op_step)
    num_groups = len(group_ptr) - 1
    num_nodes = n + num_groups
    src, dst = node_edges(dep_ptr, dep_idx, op_group, n)
    pptr, pidx = to_csr(dst, src, num_nodes)
    level = levels(pptr, src, dst)
    _check_acyclic(job, steps, op_step, level)
    deg = np.diff(pptr)
    pos, seg_start, seg_end, seg_k, seg_off, seg_pred = segments(level, deg, pptr, pidx)
    step_order = np.argsort(op_step, kind="stable")
    step_bounds = np.searchsorted(op_step[step_order], np.arange(len(steps) + 1)).astype(np.int64)
    sink_ops, sink_bounds = sinks(src, op_step, n, num_nodes, len(steps))
    # int32 indices halve the memory and the bytes every replay gathers
    idx_t = np.int32 if num_nodes < 2**31 - 1 else np.int64
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
        group_pos=pos[n:].astype(idx_t),
        num_levels=int(level.max()) + 1,
        seg_start=seg_start,
        seg_end=seg_end,
        seg_k=seg_k,
        seg_off=seg_off,
        seg_pred=seg_pred.astype(idx_t),
        step_order=step_order,
        step_bounds=step_bounds,
        sink_pos=pos[sink_ops].astype(idx_t),
        sink_bounds=sink_bounds,
    )


def _check_acyclic(job: Job, steps: np.ndarray, op_step: np.ndarray, level: np.ndarray) -> None:
    """GraphCycleError naming an op on a cycle, when ``levels`` left nodes unlevelled."""
    if not (level < 0).any():
        return
    stuck = np.flatnonzero(level[: job.num_ops] < 0)
    ex = int(stuck[0]) if len(stuck) else 0
    names, labels = job.codes("name")
    raise GraphCycleError(
        f"the dependency graph has a cycle through {int((level < 0).sum())} op(s)/collective(s), "
        f"e.g. {labels[names[ex]]} on rank {int(job.column('rank')[ex])} in step {int(steps[op_step[ex]])}"
    )
