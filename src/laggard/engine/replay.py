"""Replay op durations over the dependency graph: op end times and step times.

``weights`` holds, per op, its compute duration (ops without a communication group) or its
*transfer duration* (members of a group: observed end minus the latest participant start).
A 2-D ``weights`` of shape (num_ops, S) replays S scenarios in one pass.

Rows of a 2-D array are gathered with ``take(rows, axis=0)`` and scattered with ``put_rows``: numpy's
fancy index ``a[rows]`` on a (n, S) array goes element by element (measured with numpy 2.4 on
trace-AR's 152k nodes: a gather of 60k rows 0.9 ms for S=2 and 4.9 ms for S=25, against 0.1 and
1.6 ms by ``take``; a scatter of 140k rows 2.1 and 12.5 ms against 0.3 and 6.3). The values are the
same elements either way.
"""

from __future__ import annotations

import numpy as np

from laggard.engine.graph import Graph
from laggard.engine.kernels import kernel

# a node with up to this many predecessors takes their max one predecessor slot at a time
_COLUMNS_UP_TO = 8


def put_rows(dst: np.ndarray, rows: np.ndarray, src: np.ndarray) -> None:
    """``dst[rows] = src`` for a C-ordered ``dst`` (1-D, or 2-D written a whole row at a time, each
    row moved as one item of its bytes: module doc)."""
    if dst.ndim == 1 or not dst.flags.c_contiguous:
        dst[rows] = src
        return
    row = np.dtype((np.void, dst.itemsize * dst.shape[1]))
    src = np.ascontiguousarray(np.broadcast_to(src, (len(rows),) + dst.shape[1:]), dtype=dst.dtype)
    dst.view(row).reshape(dst.shape[0])[rows] = src.view(row).reshape(len(rows))


def node_values(graph: Graph, weights: np.ndarray) -> np.ndarray:
    """The node values a replay starts from (by replay position): each op's weight, 0 for group
    nodes and the sentinel (the last row)."""
    w = np.asarray(weights, dtype=np.float64)
    vals = np.zeros((graph.num_nodes + 1,) + w.shape[1:], dtype=np.float64)
    put_rows(vals, graph.op_pos, w)
    return vals


def replay_nodes(graph: Graph, weights: np.ndarray,
                 floor: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """End time of every node (by replay position; the last row is the sentinel 0). ``floor``
    (1-D weights only): (sorted replay positions, times), the earliest those nodes may start."""
    return propagate(graph, node_values(graph, weights), floor)


def propagate(graph: Graph, vals: np.ndarray, floor: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """``replay_nodes`` on node values already in place (``vals``, by replay position: each op's
    weight, 0 for group nodes and the sentinel), in place; returns ``vals``. The segment loop is
    compiled where it was built (``laggard.engine.kernels``); ``_propagate_numpy`` is its twin."""
    held = lo = hi = None
    if floor is not None:
        fpos, fval = floor
        held = vals[fpos] + fval  # a held-back node ends its weight after its floor
        first = int(graph.seg_start[0]) if len(graph.seg_start) else graph.num_nodes
        top = int(np.searchsorted(fpos, first))
        vals[fpos[:top]] = held[:top]  # level 0: nothing to wait for but the floor
        lo = np.searchsorted(fpos, graph.seg_start)
        hi = np.searchsorted(fpos, graph.seg_end)
    compiled = kernel("propagate")
    if compiled is not None and vals.dtype == np.float64 and vals.flags.c_contiguous and vals.flags.writeable:
        seg = [np.ascontiguousarray(a, dtype=np.int64)
               for a in (graph.seg_start, graph.seg_end, graph.seg_k, graph.seg_off)]
        extra = () if floor is None else (np.ascontiguousarray(floor[0], dtype=np.int64), np.ascontiguousarray(held),
                                          lo.astype(np.int64), hi.astype(np.int64))
        compiled(vals, *seg, np.ascontiguousarray(graph.seg_pred), *extra)
        return vals
    return _propagate_numpy(graph, vals, None if floor is None else (floor[0], held, lo, hi))


def _propagate_numpy(graph: Graph, vals: np.ndarray,
                     floor: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None) -> np.ndarray:
    """The segment loop in numpy (the compiled loop's twin): ``floor`` is (positions, held times, and
    per segment the range of positions in it)."""
    pred = graph.seg_pred
    seg = (graph.seg_start.tolist(), graph.seg_end.tolist(), graph.seg_k.tolist(), graph.seg_off.tolist())
    if floor is None:
        lo = hi = [0] * len(seg[0])
    else:
        fpos, held = floor[0], floor[1]
        lo, hi = floor[2].tolist(), floor[3].tolist()
    take = vals.take  # rows gathered by take(axis=0): on a 2-D array 3-9x faster than vals[rows] (module doc)
    for a, b, k, off, fa, fb in zip(*seg, lo, hi, strict=True):
        if k == 1:
            vals[a:b] += take(pred[off : off + b - a], axis=0)
        elif k <= _COLUMNS_UP_TO:  # slot by slot: no (rows, k, S) gather, no max over its middle axis
            p = pred[off : off + (b - a) * k]
            m = take(p[0::k], axis=0)
            for j in range(1, k):
                np.maximum(m, take(p[j::k], axis=0), out=m)
            vals[a:b] += m
        else:
            vals[a:b] += take(pred[off : off + (b - a) * k].reshape(b - a, k), axis=0).max(axis=1)
        if fa < fb:
            at = fpos[fa:fb]
            vals[at] = np.maximum(vals[at], held[fa:fb])
    return vals


def op_ends(graph: Graph, node_vals: np.ndarray) -> np.ndarray:
    return node_vals.take(graph.op_pos, axis=0)


def step_times_from_nodes(graph: Graph, node_vals: np.ndarray) -> np.ndarray:
    """Per-step time (each step starts at 0): the latest end among the step's sink ops."""
    return np.maximum.reduceat(node_vals.take(graph.sink_pos, axis=0), graph.sink_bounds[:-1], axis=0)


def step_times(graph: Graph, ends: np.ndarray) -> np.ndarray:
    """Per-step time from op end times: shape (num_steps,) or (num_steps, S)."""
    return np.maximum.reduceat(ends.take(graph.step_order, axis=0), graph.step_bounds[:-1], axis=0)


# from this many nodes on, scenarios are replayed one column at a time (``column_wise``): a
# (nodes, S) gather moves a cache line per node and scenario batch (4,096 workers, 10M nodes: 8
# columns together 1.0-2.0 s, one by one 8 x 0.1 s), and only one column's node values are held (80
# MB instead of 640). Below it, the node values of a batch stay in cache and a column each would
# pay the Python loop over the segments per column (trace-AR, 152k nodes, 32 columns: 0.02 s
# together, 0.2 s one by one). Every element is the same sums and maxima either way.
COLUMN_WISE_NODES = 2**20


def column_wise(graph: Graph) -> bool:
    return graph.num_nodes >= COLUMN_WISE_NODES


def replay_steps(graph: Graph, weights: np.ndarray) -> np.ndarray:
    """Replay ``weights`` and return only the step times."""
    if weights.ndim == 2 and weights.shape[1] > 1 and column_wise(graph):
        out = np.empty((len(graph.sink_bounds) - 1, weights.shape[1]), dtype=np.float64)
        vals = np.empty(graph.num_nodes + 1, dtype=np.float64)  # reused: a fresh one faults its pages in
        for c in range(weights.shape[1]):
            vals.fill(0.0)
            vals[graph.op_pos] = weights[:, c]
            out[:, c] = step_times_from_nodes(graph, propagate(graph, vals))
        return out
    return step_times_from_nodes(graph, replay_nodes(graph, weights))


def replay(graph: Graph, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Replay ``weights``: returns (op end times, step times)."""
    vals = replay_nodes(graph, weights)
    return op_ends(graph, vals), step_times_from_nodes(graph, vals)


def op_starts(graph: Graph, ends: np.ndarray) -> np.ndarray:
    """Start of each op in a replay: when its last dependency ended (0 if none)."""
    n = graph.num_ops
    owner = np.repeat(np.arange(n), np.diff(graph.dep_ptr))
    starts = np.zeros(ends.shape, dtype=np.float64)
    if len(owner):
        np.maximum.at(starts, owner, ends[graph.dep_idx])
    return starts


def wall_step_times(steps: np.ndarray, step_end_s: np.ndarray, span_s: np.ndarray) -> np.ndarray:
    """Wall-clock time of each step: from the previous step's last end to its own (they sum to the
    job's time). A rank that finishes a step late starts the next late, so first-start-to-last-end
    spans overlap and count that lateness twice; the first step (or one after a gap in the step
    numbers) keeps its span."""
    wall = span_s.copy()
    follows = np.flatnonzero(np.diff(steps) == 1) + 1
    wall[follows] = step_end_s[follows] - step_end_s[follows - 1]
    return wall
