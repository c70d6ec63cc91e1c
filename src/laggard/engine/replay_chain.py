"""Steps back to back: the job replayed as one run, to check the replay against the wall clock.

The analysis replays every step from its own t=0 with all ranks starting together (the published
method: per-step times, what-ifs, S). On a real run a rank starts the next step as soon as it is
done with its part of the previous one, so ranks enter a step at different times and a wall-clock
step (last end to last end) overlaps the one before. Comparing the two counts that overlap as replay
error. The chained replay carries it over instead:

* the first op of a step on a (rank, stream) waits for that stream's last op in the previous step
  (a stream, like a host thread, runs its ops in order);
* a host op that opens a step (untraced time since the rank's last op, ``laggard.engine.gaps``) waits for
  the rank's last op of the previous step, where its gap began;
* a collective starts when its last member may, as in every replay.

A step that does not follow the previous step number (the first one, or one after skipped steps)
starts a new chain, exactly like the per-step replay.

How: each step is replayed in its own frame, its first ops held back by *floors* (their start
relative to the earliest of them), with the per-step replay of ``laggard.engine.replay``. A step's floors
come from the previous step's replay, so every step is replayed with the floors of the last pass
until they stop changing: pass p is exact for the first p steps, and a step that ends in a
collective of every rank hands the same floors on whatever it was given, so two or three passes
are the rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from laggard.engine.graph import Graph
from laggard.engine.replay import node_values, propagate, step_times_from_nodes, wall_step_times
from laggard.optable.ops import unique_inverse

# Floors that moved by less than this between passes have converged: 1 ns is below the clock
# resolution of every trace format laggard reads, and float rounding of second-scale sums is ~1e-15 s.
CONVERGED_S = 1e-9


@dataclass(kw_only=True, slots=True, eq=False)  # numpy arrays: a generated == could only raise (no truth value)
class ChainPlan:
    """Who waits for whom across step boundaries, computed once per job."""

    num_steps: int
    follows: np.ndarray  # per step: its number follows the previous step's
    num_ranks: int
    num_rs: int
    # ops grouped by (step, rank, stream), as replay positions (node values are read in this order
    # without first gathering the op ends), less those another op of their group waits for
    # (``_tails``), and the group boundaries; groups grouped by (step, rank)
    node_order: np.ndarray
    bounds: np.ndarray
    grp_step: np.ndarray
    grp_rs: np.ndarray
    rank_bounds: np.ndarray
    rank_cell: np.ndarray  # per (step, rank) run of groups: its cell in a (steps x ranks) table
    # the groups whose first op waits across a step boundary: where it looks in the previous step's
    # (steps x ranks) and (steps x (rank, stream)) tables, and whether it waits for the whole rank
    wait_rank_cell: np.ndarray
    wait_rs_cell: np.ndarray
    wait_host: np.ndarray
    wait_step: np.ndarray
    # the nodes those first ops hold back (a collective member: its group node), sorted, and which
    wait_pos: np.ndarray
    wait_node: np.ndarray  # per waiting group: index into wait_pos


def plan_chain(graph: Graph, rank: np.ndarray, stream: np.ndarray, is_host: np.ndarray,
               start_s: np.ndarray) -> ChainPlan:
    """``rank`` and ``stream`` are per-op integer codes; ``start_s`` finds each stream's
    first op in a step."""
    rank_idx, rs_idx = _rank_codes(graph, rank, stream)
    num_rs = int(rs_idx.max(initial=-1)) + 1
    num_ranks = int(rank_idx.max(initial=-1)) + 1
    step = graph.op_step
    order, bounds = _groups(graph, step, rs_idx, num_rs)
    firsts = _first_ops(order, bounds, start_s)
    grp_step, grp_rank, grp_rs = step[firsts], rank_idx[firsts], rs_idx[firsts]
    new_rank = np.ones(len(firsts), dtype=bool)
    new_rank[1:] = (grp_step[1:] != grp_step[:-1]) | (grp_rank[1:] != grp_rank[:-1])
    rank_bounds = np.append(np.flatnonzero(new_rank), len(firsts))
    follows = np.zeros(len(graph.steps), dtype=bool)
    follows[1:] = np.diff(graph.steps) == 1
    wait = np.flatnonzero(follows[grp_step])
    ops = firsts[wait]
    grp = graph.op_group[ops]
    node = np.where(grp < 0, graph.op_pos[ops], graph.group_pos[np.maximum(grp, 0)] if graph.num_groups else 0)
    wait_pos, wait_node = np.unique(node.astype(np.int64), return_inverse=True)
    prev = grp_step[wait] - 1
    rb = rank_bounds[:-1]
    tail_order, tail_bounds = _tails(graph, order, bounds)
    return ChainPlan(
        num_steps=len(graph.steps),
        follows=follows,
        num_ranks=num_ranks,
        num_rs=num_rs,
        node_order=graph.op_pos[tail_order],
        bounds=tail_bounds,
        grp_step=grp_step,
        grp_rs=grp_rs,
        rank_bounds=rank_bounds,
        rank_cell=grp_step[rb] * num_ranks + grp_rank[rb],
        wait_rank_cell=prev * num_ranks + grp_rank[wait],
        wait_rs_cell=prev * num_rs + grp_rs[wait],
        wait_host=np.asarray(is_host, dtype=bool)[ops],
        wait_step=grp_step[wait],
        wait_pos=wait_pos,
        wait_node=wait_node.ravel(),
    )


def _rank_codes(graph: Graph, rank: np.ndarray, stream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per op: its rank's index among the job's ranks and its (rank, stream)'s, rank-major. Where
    every step has the same rows in the same order (``Graph.ops_per_step``), the first step's codes
    repeated: the same codes, without sorting every op (7.7M at 4,096 workers: 0.06 s)."""
    m = graph.ops_per_step
    reps = len(rank) // m if m else 1
    if m:
        rank, stream = rank[:m], stream[:m]
    rank_idx = unique_inverse(rank)[1]
    rs_idx = unique_inverse(rank_idx * (int(stream.max(initial=0)) + 1) + stream)[1]
    return (np.tile(rank_idx, reps), np.tile(rs_idx, reps)) if reps > 1 else (rank_idx, rs_idx)


def _groups(graph: Graph, step: np.ndarray, rs_idx: np.ndarray, num_rs: int) -> tuple[np.ndarray, np.ndarray]:
    """Ops ordered by (step, rank-stream), and the group boundaries."""
    m = graph.ops_per_step
    num_steps = len(graph.steps)
    if m:  # every step has the same rows in the same order: group one step's and repeat
        o0 = np.argsort(rs_idx[:m], kind="stable")
        k0 = rs_idx[:m][o0]
        b0 = np.flatnonzero(np.r_[True, k0[1:] != k0[:-1]])
        order = (o0[None, :] + (m * np.arange(num_steps))[:, None]).ravel()
        bounds = np.append((b0[None, :] + (m * np.arange(num_steps))[:, None]).ravel(), len(order))
        return order, bounds
    order = np.argsort(step * num_rs + rs_idx, kind="stable")
    key = step[order] * num_rs + rs_idx[order]
    return order, np.append(np.flatnonzero(np.r_[True, key[1:] != key[:-1]]), len(order))


def _tails(graph: Graph, order: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``order`` and ``bounds`` less the ops another op of the same group depends on: that op starts
    after they end and its duration is not negative, so the group's last end is among the rest (the
    4,096-worker job: 0.7M of 7.7M ops, read once per pass). Only where every step has the same rows
    (``Graph.ops_per_step``): found on the first step's ops and repeated; elsewhere all ops."""
    m = graph.ops_per_step
    if not m or not len(order):
        return order, bounds
    b0 = bounds[bounds < m]
    sizes0 = np.diff(np.append(b0, m))
    grp0 = np.empty(m, dtype=np.int64)
    grp0[order[:m]] = np.repeat(np.arange(len(b0)), sizes0)
    ptr = graph.dep_ptr[: m + 1]
    dep = graph.dep_idx[: int(ptr[-1])]
    owner = np.repeat(np.arange(m), np.diff(ptr))
    waited_on = np.zeros(m, dtype=bool)
    waited_on[dep[grp0[dep] == grp0[owner]]] = True
    keep0 = ~waited_on[order[:m]]
    kept0 = np.add.reduceat(keep0.astype(np.int64), b0)
    num_steps = len(order) // m
    starts0 = np.append(0, np.cumsum(kept0))[:-1]
    k0 = int(kept0.sum())
    new_bounds = np.append((starts0[None, :] + k0 * np.arange(num_steps)[:, None]).ravel(), k0 * num_steps)
    return order[np.tile(keep0, num_steps)], new_bounds


def _first_ops(order: np.ndarray, bounds: np.ndarray, start_s: np.ndarray) -> np.ndarray:
    """Each group's op with the earliest start (the first such row where several tie)."""
    st = start_s[order]
    lens = np.diff(bounds)
    earliest = np.repeat(np.minimum.reduceat(st, bounds[:-1]), lens)
    cand = np.flatnonzero(st == earliest)
    cand_grp = np.searchsorted(bounds, cand, side="right") - 1
    keep = np.r_[True, cand_grp[1:] != cand_grp[:-1]]
    return order[cand[keep]]


def _floors(plan: ChainPlan, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """From the per-step replay's node values (end times by replay position): the floor of each
    held-back node (``plan.wait_pos``) and each step's shift (where its frame starts in the previous
    step's frame; 0 where a chain starts)."""
    S = plan.num_steps
    group_end = np.maximum.reduceat(vals[plan.node_order], plan.bounds[:-1])
    rs_end = np.full(S * plan.num_rs, np.nan)
    rs_end[plan.grp_step * plan.num_rs + plan.grp_rs] = group_end
    rank_end = np.full((S, plan.num_ranks), np.nan)
    rank_end.ravel()[plan.rank_cell] = np.maximum.reduceat(group_end, plan.rank_bounds[:-1])
    # a rank absent from the previous step joins when the earliest rank is done with it
    with np.errstate(invalid="ignore"):
        earliest = np.fmin.reduce(rank_end, axis=1)
    rank_end = np.where(np.isnan(rank_end), earliest[:, None], rank_end).ravel()
    by_rank = rank_end[plan.wait_rank_cell]
    by_stream = rs_end[plan.wait_rs_cell]
    # a stream without ops in the previous step waits for its rank
    at = np.where(plan.wait_host | np.isnan(by_stream), by_rank, by_stream)
    shift = np.full(S, np.inf)
    np.minimum.at(shift, plan.wait_step, at)
    shift[~plan.follows] = 0.0
    floor = np.full(len(plan.wait_pos), -np.inf)
    np.maximum.at(floor, plan.wait_node, at - shift[plan.wait_step])
    return floor, shift


def chained_wall_step_times(graph: Graph, plan: ChainPlan, weights: np.ndarray) -> tuple[np.ndarray, int]:
    """Replayed wall-clock time of each step (from the previous step's last end to its own; from
    t=0 where a chain starts), the replay's counterpart of ``replay.wall_step_times``; and the
    number of passes it took."""
    floor = None
    passes = 0
    start = node_values(graph, weights)  # each pass starts from these
    vals = np.empty_like(start)
    while True:
        np.copyto(vals, start)
        propagate(graph, vals, None if floor is None else (plan.wait_pos, floor))
        passes += 1
        new, shift = _floors(plan, vals)
        done = not len(new) or (floor is not None and float(np.max(np.abs(new - floor))) <= CONVERGED_S)
        floor = new
        if done or passes > plan.num_steps:  # pass p is exact for the first p steps
            break
    # each step's frame starts ``shift`` into the previous one's (0 where a chain starts); a step's
    # last end is one of its sinks' (durations are not negative)
    step_end = step_times_from_nodes(graph, vals)
    return wall_step_times(graph.steps, step_end, step_end) + shift, passes
