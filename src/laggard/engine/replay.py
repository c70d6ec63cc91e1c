"""Replay op durations over the dependency graph: op end times and step times.

``weights`` holds, per op, its compute duration (ops without a communication group) or its
*transfer duration* (members of a group: observed end minus the latest participant start).
A 2-D ``weights`` of shape (num_ops, S) replays S scenarios in one pass.
"""

from __future__ import annotations

import numpy as np

from laggard.engine.graph import Graph

# a node with up to this many predecessors takes their max one predecessor slot at a time
_COLUMNS_UP_TO = 8


def node_values(graph: Graph, weights: np.ndarray) -> np.ndarray:
    """The node values a replay starts from (by replay position): each op's weight, 0 for group
    nodes and the sentinel (the last row)."""
    w = np.asarray(weights, dtype=np.float64)
    vals = np.zeros((graph.num_nodes + 1,) + w.shape[1:], dtype=np.float64)
    vals[graph.op_pos] = w
    return vals


def replay_nodes(graph: Graph, weights: np.ndarray,
                 floor: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """End time of every node (by replay position; the last row is the sentinel 0). ``floor``
    (1-D weights only): (sorted replay positions, times), the earliest those nodes may start."""
    return propagate(graph, node_values(graph, weights), floor)


def propagate(graph: Graph, vals: np.ndarray, floor: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """``replay_nodes`` on node values already in place (``vals``, by replay position: each op's
    weight, 0 for group nodes and the sentinel), in place; returns ``vals``."""
    pred = graph.seg_pred
    seg = (graph.seg_start.tolist(), graph.seg_end.tolist(), graph.seg_k.tolist(), graph.seg_off.tolist())
    if floor is None:
        lo = hi = [0] * len(seg[0])
    else:
        fpos, fval = floor
        held = vals[fpos] + fval  # a held-back node ends its weight after its floor
        first = int(graph.seg_start[0]) if len(graph.seg_start) else graph.num_nodes
        top = int(np.searchsorted(fpos, first))
        vals[fpos[:top]] = held[:top]  # level 0: nothing to wait for but the floor
        lo = np.searchsorted(fpos, graph.seg_start).tolist()
        hi = np.searchsorted(fpos, graph.seg_end).tolist()
    for a, b, k, off, fa, fb in zip(*seg, lo, hi, strict=True):
        if k == 1:
            vals[a:b] += vals[pred[off : off + b - a]]
        elif k <= _COLUMNS_UP_TO:  # slot by slot: no (rows, k, S) gather, no max over its middle axis
            p = pred[off : off + (b - a) * k]
            m = vals[p[0::k]]
            for j in range(1, k):
                np.maximum(m, vals[p[j::k]], out=m)
            vals[a:b] += m
        else:
            vals[a:b] += vals[pred[off : off + (b - a) * k].reshape(b - a, k)].max(axis=1)
        if fa < fb:
            at = fpos[fa:fb]
            vals[at] = np.maximum(vals[at], held[fa:fb])
    return vals


def op_ends(graph: Graph, node_vals: np.ndarray) -> np.ndarray:
    return node_vals[graph.op_pos]


def step_times_from_nodes(graph: Graph, node_vals: np.ndarray) -> np.ndarray:
    """Per-step time (each step starts at 0): the latest end among the step's sink ops."""
    return np.maximum.reduceat(node_vals[graph.sink_pos], graph.sink_bounds[:-1], axis=0)


def step_times(graph: Graph, ends: np.ndarray) -> np.ndarray:
    """Per-step time from op end times: shape (num_steps,) or (num_steps, S)."""
    return np.maximum.reduceat(ends[graph.step_order], graph.step_bounds[:-1], axis=0)


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
