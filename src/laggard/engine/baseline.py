"""The measured job made ready for replays (``prepare``): host ops for untraced gaps, the dependency
graph, measured and ideal durations per op, op labels; and ``replay_mixed``, which replays many
what-if scenarios (weight columns) in batches under a memory bound.

Ideal durations follow Lin et al. (OSDI '25): the mean (compute) or the median (communication
transfer) of an op type, pooled over all workers, steps and microbatches (where a capture splits a
type into several spans a step, each span's own pool: ``engine/sameop.py``); traced GC pauses 0.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laggard.engine.gaps import HOST_KIND, GapConfig, GapSummary, host_attribution_type, insert_host_gaps
from laggard.engine.graph import Graph, build_graph, group_sizes_check
from laggard.engine.kernels import compiled_replay
from laggard.engine.replay import (
    column_wise,
    node_values,
    propagate,
    step_times_from_nodes,
    wall_step_times,
)
from laggard.engine.sameop import same_op_codes
from laggard.errors import GraphCycleError, LaggardError
from laggard.optable.ops import COMM_KINDS, Job, fits_table, is_gc_name

_NS = 1e-9


# Scenarios replayed together in one pass (float64 node values, a gather's rows of them, and
# op-ordered weights where the caller builds them: ``_batch_size``'s ``num_ops`` is 0 without): at
# least _MIN_BATCH, more while a pass stays within _PASS_BYTES, never more than _MAX_BATCH_BYTES.
_MAX_BATCH_BYTES = 1536 * 2**20

# The numpy segment loop (replay._propagate_numpy) costs a Python step per graph segment whatever a
# pass's width, so its passes are wide: at least 16 columns (rows of whole cache lines per node), up to
# 64 MB (small graphs with many what-ifs, e.g. a Kineto job with hundreds of op types, replay them all
# in a few passes). trace-AR's 152k nodes: 0.51 ms a column 8 wide, 0.30 ms 25 wide.
_PASS_BYTES = 64 * 2**20
_MIN_BATCH = 16

# The compiled loop (laggard.engine.kernels) has no per-segment cost: its passes stay within 10 MB, each pass
# reusing the memory the one before freed, so a what-if pass faults in a tenth of the pages. At least 4
# columns (32-byte rows): trace-AR's 152k nodes 0.36 ms a column 4 wide, 0.28 8 wide, 0.24 25 wide,
# against 0.66 one by one; in one analysis, 25 what-ifs in passes of 4: 14.5k -> 8.6k page faults.
_PASS_BYTES_COMPILED = 10 * 2**20
_MIN_BATCH_COMPILED = 4


def _batch_size(num_ops: int, num_nodes: int, num_scenarios: int) -> int:
    per_scenario = max(8 * (num_ops + 2 * num_nodes), 1)
    pass_bytes, least = (_PASS_BYTES_COMPILED, _MIN_BATCH_COMPILED) if compiled_replay() else (_PASS_BYTES, _MIN_BATCH)
    wide = max(least, pass_bytes // per_scenario)
    return max(1, min(num_scenarios, wide, _MAX_BATCH_BYTES // per_scenario))


@dataclass(kw_only=True, slots=True, eq=False)  # numpy arrays: a generated == could only raise (no truth value)
class Baseline:
    """The measured job, ready for replays: graph, measured and ideal weights, op labels."""

    job: Job
    graph: Graph
    start_s: np.ndarray
    end_s: np.ndarray
    measured: np.ndarray  # replay weight per op: duration, or transfer duration for group members
    ideal: np.ndarray
    name_code: np.ndarray
    names: list[str]
    kind_code: np.ndarray
    kinds: list[str]
    attr_code: np.ndarray  # op type for attribution (p2p send/recv pairs merged)
    attr_names: list[str]
    rank: np.ndarray
    dp_rank: np.ndarray
    pp_rank: np.ndarray
    measured_step_s: np.ndarray  # per step: last end - first start, as traced
    wall_step_s: np.ndarray  # per step: last end - the previous step's last end (wall clock)
    gaps: GapSummary  # untraced host time per rank, and what of it became host ops
    # ops of the model that the trace holds: the host ops made of untraced gaps are not counted, so
    # every command counts the same ops of a trace whatever gaps it models
    num_traced_ops: int
    traced: Job | None = None  # the job as loaded, before host ops (a what-if may model gaps anew)
    # what depends only on the job and its graph, computed once (the DP reduction,
    # laggard.engine.symmetry): shared by a copy with other durations (dataclasses.replace keeps it)
    structure: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def is_comm(self) -> np.ndarray:
        comm = np.array([k in COMM_KINDS for k in self.kinds], dtype=bool)
        return comm[self.kind_code] if len(comm) else np.zeros(len(self.kind_code), dtype=bool)

    def is_host(self) -> np.ndarray:
        """Host ops: untraced time modelled as ops of its rank (``laggard.engine.gaps``)."""
        host = np.array([k == HOST_KIND for k in self.kinds], dtype=bool)
        return host[self.kind_code] if len(host) else np.zeros(len(self.kind_code), dtype=bool)


def attribution_type(name: str, kind: str) -> str:
    """The op type an attribution reports: the two ends of a p2p transfer count as one type."""
    if kind == HOST_KIND:
        return host_attribution_type(name)
    if kind in ("p2p_send", "p2p_recv"):
        for suffix in ("-send", "-recv"):
            if name.endswith(suffix):
                return name.removesuffix(suffix) + "-pp-comm"
        return "p2p"
    return name


def transfer_durations(graph: Graph, start_s: np.ndarray, end_s: np.ndarray) -> np.ndarray:
    """Per group member: observed end minus the latest start among the group's participants.

    Negative values (a send that completed before its peer arrived, or clock skew) become 0.
    """
    td = end_s - start_s
    if graph.num_groups:
        members = graph.group_ops
        gmax = np.maximum.reduceat(start_s[members], graph.group_ptr[:-1])
        owner = np.repeat(np.arange(graph.num_groups), np.diff(graph.group_ptr))
        td[members] = np.maximum(end_s[members] - gmax[owner], 0.0)
    return td


def ideal_weights(measured: np.ndarray, name_code: np.ndarray, is_comm_op: np.ndarray, num_names: int,
                  link: np.ndarray | None = None) -> np.ndarray:
    """Mean per op type for compute, median per op type for communication (and ``is_comm_op``'s
    other ops: untraced host time). ``link`` (per op: the pair of ranks a point-to-point transfer
    joins, -1 for none) refines one case: an op type whose transfers all run on two links takes the
    faster link's median. The median of its ops lies between the two links, so a slow link would set
    half its own ideal and leave the healthy one's at half the delay, so that both links' ideal sits
    halfway and a slow link reads as healthy (S near 1); with one link there is no other to compare,
    with three or more the median is a healthy link's."""
    counts = np.bincount(name_code, minlength=num_names)
    mean = np.bincount(name_code, weights=measured, minlength=num_names) / np.maximum(counts, 1)
    comm_name = np.zeros(num_names, dtype=bool)
    comm_name[name_code[is_comm_op]] = True
    if not comm_name.any():
        return mean[name_code]
    rows = np.flatnonzero(comm_name[name_code])
    order = rows[np.argsort(name_code[rows], kind="stable")]  # by op type; np.median needs no order within
    bounds = np.searchsorted(name_code[order], np.arange(num_names + 1))
    median = mean.copy()
    for c in np.flatnonzero(comm_name):
        of_type = order[bounds[c] : bounds[c + 1]]
        two = _two_link_ideal(measured[of_type], link[of_type]) if link is not None else None
        median[c] = np.median(measured[of_type]) if two is None else two
    return np.where(comm_name, median, mean)[name_code]


def _two_link_ideal(measured: np.ndarray, link: np.ndarray) -> float | None:
    """The faster link's median transfer where every op of ``measured`` is on one of two links; None
    otherwise."""
    if not len(link):
        return None
    lo, hi = int(link.min()), int(link.max())  # two links: every op on the lowest or the highest (no sort)
    on_lo = link == lo
    if lo < 0 or lo == hi or not (on_lo | (link == hi)).all():
        return None
    return min(float(np.median(measured[on_lo])), float(np.median(measured[~on_lo])))


def p2p_links(job: Job, kind_code: np.ndarray, kinds: list[str]) -> np.ndarray:
    """Per op: the unordered pair of ranks its point-to-point transfer joins (a code), -1 for other
    ops and transfers with no known peer."""
    p2p = np.isin(kind_code, [i for i, k in enumerate(kinds) if k in ("p2p_send", "p2p_recv")])
    if not p2p.any():
        return np.full(len(kind_code), -1, dtype=np.int64)
    rank, peer = job.column("rank").astype(np.int64), job.column("peer").astype(np.int64)
    n = int(max(rank.max(), peer.max())) + 1
    code = np.minimum(rank, peer) * n + np.maximum(rank, peer)
    return np.where(p2p & (peer >= 0), code, -1)


def _attribution_types(names: list[str], kinds: list[str], name_code: np.ndarray,
                       kind_code: np.ndarray) -> tuple[list[str], np.ndarray]:
    """(the attribution types, each op's code into them): each name's type from its first kind code
    (the kinds it occurs with, from one count of the (name, kind) pairs; slot 0 is a null kind, code
    -1, read as kinds[-1])."""
    nk = len(kinds) + 1
    named = name_code >= 0
    pairs = np.bincount(name_code[named].astype(np.int64) * nk + kind_code[named] + 1,
                        minlength=len(names) * nk).reshape(len(names), nk)
    pair_kind = {}
    for c, nm in enumerate(names):
        ks = np.flatnonzero(pairs[c]) - 1
        pair_kind[c] = attribution_type(nm, kinds[int(ks[0])]) if len(ks) else nm
    attr_names = sorted(set(pair_kind.values()))
    lut = np.array([attr_names.index(pair_kind[c]) for c in range(len(names))], dtype=np.int64)
    return attr_names, lut[name_code]


def prepare(job: Job, gaps: GapConfig | None = None) -> Baseline:
    """Add host ops for untraced gaps, build the graph, drop steps the replay cannot model,
    compute measured and ideal weights."""
    gap_cfg = gaps or GapConfig()
    traced = job
    with_gaps, gap_summary = insert_host_gaps(job, gap_cfg)
    try:
        graph = build_graph(with_gaps)
    except GraphCycleError:
        if with_gaps is job or not gap_cfg.wait_for_busy:
            raise
        gap_cfg = dataclasses.replace(gap_cfg, wait_for_busy=False)
        with_gaps, gap_summary = insert_host_gaps(job, gap_cfg)
        graph = build_graph(with_gaps)
    job = with_gaps
    bad = group_sizes_check(job, graph)
    if len(bad):
        import pyarrow as pa

        if len(bad) == len(graph.steps):
            raise LaggardError("every step has a collective with missing participants; nothing to analyze")
        keep = pa.array(~np.isin(job.column("step"), bad))
        job = Job(table=job.table.filter(keep), meta=job.meta, warnings=job.warnings, load_args=job.load_args)
        graph = build_graph(job)
    num_traced = int(np.isin(traced.column("step"), bad, invert=True).sum()) if len(bad) else traced.num_ops
    start_ns = job.column("start_ns")
    dur_ns = job.column("dur_ns")
    if (dur_ns < 0).any():
        raise LaggardError(f"{int((dur_ns < 0).sum())} op(s) have negative durations")
    start_s = (start_ns - start_ns.min()) * _NS
    end_s = start_s + dur_ns * _NS
    name_code, names = job.codes("name")
    kind_code, kinds = job.codes("kind")
    comm_kind = np.array([k in COMM_KINDS for k in kinds], dtype=bool)
    td = transfer_durations(graph, start_s, end_s)
    measured = np.where(graph.op_group >= 0, td, dur_ns * _NS)
    # untraced host time is idealised to its peers' median, like communication (sporadic stalls)
    median_kind = comm_kind | np.array([k == HOST_KIND for k in kinds], dtype=bool)
    same, num_same = same_op_codes(name_code.astype(np.int64), job.column("rank"), job.column("step"),
                                   job.column("microbatch"), job.column("vchunk"), start_ns)
    ideal = ideal_weights(measured, same, median_kind[kind_code], num_same, p2p_links(job, kind_code, kinds))
    # GC pauses traced as their own ops occur on some workers in some steps; at their mean they
    # would stay in the ideal run exactly where they stalled the job. The ideal job does not stop
    # the world mid-step (planned GC moves collections out of the step): they are idealised to 0.
    gc_name = np.array([is_gc_name(n) for n in names], dtype=bool)
    if gc_name.any():
        ideal = np.where(gc_name[name_code], 0.0, ideal)
    attr_names, attr_code = _attribution_types(names, kinds, name_code, kind_code)
    so = graph.step_order
    sb = graph.step_bounds[:-1]
    step_end = np.maximum.reduceat(end_s[so], sb)
    measured_step = step_end - np.minimum.reduceat(start_s[so], sb)
    return Baseline(
        job=job,
        graph=graph,
        start_s=start_s,
        end_s=end_s,
        measured=measured,
        ideal=ideal,
        name_code=name_code.astype(np.int64),
        names=names,
        kind_code=kind_code.astype(np.int64),
        kinds=kinds,
        attr_code=attr_code,
        attr_names=attr_names,
        rank=job.column("rank").astype(np.int64),
        dp_rank=job.column("dp_rank").astype(np.int64),
        pp_rank=job.column("pp_rank").astype(np.int64),
        measured_step_s=measured_step,
        wall_step_s=wall_step_times(graph.steps, step_end, measured_step),
        gaps=gap_summary,
        num_traced_ops=num_traced,
        traced=traced,
    )


def replay_mixed(
    base: Baseline, *blocks: tuple[np.ndarray, np.ndarray], keep_measured: bool = True
) -> list[np.ndarray]:
    """Replay scenarios in as few passes as memory allows.

    Each block ``(labels, values)`` asks for one scenario per value v: ops with ``labels == v``
    measured and the rest ideal (``keep_measured=False``: the reverse). A block's ``labels`` may
    also be None for the all-measured (v=1) / all-ideal (v=0) runs. Returns, per block, the step
    times of shape (num_steps, len(values)).
    """
    scen = [(bi, labels, v) for bi, (labels, values) in enumerate(blocks) for v in np.asarray(values).tolist()]
    cols = np.empty((len(base.graph.steps), len(scen)), dtype=np.float64)
    a_w, b_w = (base.measured, base.ideal) if keep_measured else (base.ideal, base.measured)
    if column_wise(base.graph):
        _replay_columns(base.graph, scen, a_w, b_w, cols)
    else:
        _replay_batches(base.graph, scen, a_w, b_w, cols)
    out, k = [], 0
    for _, values in blocks:
        m = len(np.asarray(values))
        out.append(cols[:, k : k + m])
        k += m
    return out


def _replay_columns(g: Graph, scen: list, a_w: np.ndarray, b_w: np.ndarray, cols: np.ndarray) -> None:
    """Each scenario on its own (large graphs, ``laggard.engine.replay.column_wise``): the node values
    start from the all-``b_w`` ones with the scenario's ``a_w`` ops written over them, no weight
    matrix (7.7M ops x a batch of scenarios: 430 MB at 4,096 workers, and as long to fill as to replay)."""
    a_node, b_node = node_values(g, a_w), node_values(g, b_w)
    vals = np.empty(g.num_nodes + 1, dtype=np.float64)
    placed: dict[int, np.ndarray | None] = {}
    for c, (bi, labels, v) in enumerate(scen):
        if labels is None:
            np.copyto(vals, a_node if v != 0 else b_node)
        else:
            np.copyto(vals, b_node)
            if bi not in placed:
                placed = {bi: _labels_by_node(g, labels)}  # one block's at a time
            lab_node = placed[bi]
            if lab_node is not None:  # node-ordered labels: two streaming passes, no scatter
                np.copyto(vals, a_node, where=lab_node == v)
            else:
                at = g.op_pos[np.flatnonzero(labels == v)]
                vals[at] = a_node[at]
        cols[:, c] = step_times_from_nodes(g, propagate(g, vals))


def _labels_by_node(g: Graph, labels: np.ndarray) -> np.ndarray | None:
    """Integer (or bool, as 0/1) labels at their ops' replay positions (int32 where they fit); None
    for other labels (compared op by op). The group nodes and the sentinel get 0: they hold 0 in
    both node value arrays, so whether a scenario's value matches there does not matter."""
    lab = labels.astype(np.int8) if labels.dtype.kind == "b" else labels
    if lab.dtype.kind not in "iu" or not len(lab):
        return None
    fits = int(lab.min()) >= -(2**31) and int(lab.max()) < 2**31
    out = np.zeros(g.num_nodes + 1, dtype=np.int32 if fits else np.int64)
    out[g.op_pos] = lab
    return out


def _replay_batches(g: Graph, scen: list, a_w: np.ndarray, b_w: np.ndarray, cols: np.ndarray) -> None:
    """Scenarios in batches of weight columns, each batch one 2-D replay (under the memory bound). The
    columns are filled in replay order (node values: each op's weight at its replay position, 0 at the
    group nodes and the sentinel), so no op-ordered weight matrix is built and scattered: every column
    starts as ``b_w``'s in one broadcast (a block of columns at a time writes short strided rows: on
    trace-AR, 23 columns in 5 blocks, 22 ms against 3) and each block's ``a_w`` ops are written in one
    scatter into the flat array (a 2-D fancy index per block was ~1.4x slower)."""
    # no op-ordered weights here, only node values: sized by the nodes (trace-AR's 25 what-ifs in one
    # pass instead of 19 + 6: 39 -> 32 ms)
    batch = _batch_size(0, g.num_nodes, len(scen))
    a_node, b_node = node_values(g, a_w), node_values(g, b_w)
    for i in range(0, len(scen), batch):
        part = scen[i : i + batch]
        width = len(part)
        vals = np.empty((g.num_nodes + 1, width), dtype=np.float64)
        vals[:] = b_node[:, None]
        flat = vals.reshape(-1)
        j = 0
        while j < width:  # runs of scenarios from one block are placed in one vectorised call
            bi, labels = part[j][0], part[j][1]
            e = j
            while e < width and part[e][0] == bi:
                e += 1
            vs = np.array([p[2] for p in part[j:e]])
            if labels is None:
                for c, v in enumerate(vs.tolist(), start=j):
                    if v != 0:
                        vals[:, c] = a_node
            else:
                for rows, col in _block_cells(labels, vs):
                    flat[g.op_pos[rows].astype(np.int64) * width + (j + col)] = a_w[rows]
            j = e
        cols[:, i : i + width] = step_times_from_nodes(g, propagate(g, vals))


def _block_cells(labels: np.ndarray, vs: np.ndarray) -> list[tuple[np.ndarray, np.ndarray | int]]:
    """The (op, column) cells of a block of scenarios, as (ops, their columns) parts: each op i with
    ``labels[i] == vs[c]``, found once per op (an op has one label) instead of comparing every op with
    every scenario; for a few values (or a value asked twice) compared, a part per value."""
    order = np.argsort(vs, kind="stable")
    sv = vs[order]
    if len(sv) <= 8 or (sv[1:] == sv[:-1]).any():
        return [(np.flatnonzero(labels == v), c) for c, v in enumerate(vs.tolist())]
    if (labels.dtype.kind in "iu" and sv.dtype.kind in "iu" and len(labels)
            and fits_table(int(sv[-1]) - int(sv[0]) + 1, len(labels))):
        # integer labels (op types, stages, ranks): each op's column from a table over the asked values
        lo, hi = int(sv[0]), int(sv[-1])
        lut = np.full(hi - lo + 2, -1, dtype=np.int64)  # the last slot: labels outside the values
        lut[sv.astype(np.int64) - lo] = order
        rel = labels.astype(np.int64) - lo
        col = lut[np.where((rel >= 0) & (rel <= hi - lo), rel, hi - lo + 1)]
        rows = np.flatnonzero(col >= 0)
        return [(rows, col[rows])]
    pos = np.minimum(np.searchsorted(sv, labels), len(sv) - 1)
    rows = np.flatnonzero(sv[pos] == labels)
    return [(rows, order[pos[rows]])]


__all__ = ["Baseline", "prepare", "replay_mixed"]
