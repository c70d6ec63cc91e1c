"""Replay op durations over the dependency graph: op end times and step times.

``weights`` holds, per op, its compute duration (ops without a communication group) or its
*transfer duration* (members of a group: observed end minus the latest participant start).
A 2-D ``weights`` of shape (num_ops, S) replays S scenarios in one pass.
"""

from __future__ import annotations

import numpy as np

from laggard.graph import Graph


def replay_nodes(graph: Graph, weights: np.ndarray) -> np.ndarray:
    """End time of every node (in level order), from t=0 at each step's start."""
    w = np.asarray(weights, dtype=np.float64)
    shape = (graph.num_nodes,) + w.shape[1:]
    vals = np.zeros(shape, dtype=np.float64)
    vals[graph.op_pos] = w
    lp, pp, pi = graph.level_ptr, graph.pred_ptr, graph.pred_idx
    for lv in range(1, len(lp) - 1):
        a, b = lp[lv], lp[lv + 1]
        ea, eb = pp[a], pp[b]
        gathered = vals[pi[ea:eb]]
        if eb - ea == b - a:  # every node of the level has exactly one predecessor
            vals[a:b] += gathered
        else:
            vals[a:b] += np.maximum.reduceat(gathered, pp[a:b] - ea, axis=0)
    return vals


def op_ends(graph: Graph, node_vals: np.ndarray) -> np.ndarray:
    return node_vals[graph.op_pos]


def step_times(graph: Graph, ends: np.ndarray) -> np.ndarray:
    """Per-step time (max op end; each step starts at 0): shape (num_steps,) or (num_steps, S)."""
    return np.maximum.reduceat(ends[graph.step_order], graph.step_bounds[:-1], axis=0)


def replay(graph: Graph, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Replay ``weights``: returns (op end times, step times)."""
    ends = op_ends(graph, replay_nodes(graph, weights))
    return ends, step_times(graph, ends)


def op_starts(graph: Graph, ends: np.ndarray) -> np.ndarray:
    """Start of each op in a replay: when its last dependency ended (0 if none)."""
    n = graph.num_ops
    owner = np.repeat(np.arange(n), np.diff(graph.dep_ptr))
    starts = np.zeros(ends.shape, dtype=np.float64)
    if len(owner):
        np.maximum.at(starts, owner, ends[graph.dep_idx])
    return starts
