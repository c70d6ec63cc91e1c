"""Untraced host time: the gaps on a rank between traced ops become ops of that rank.

A rank is *idle* when none of its traced ops runs, on any of its streams. Idle time that was not
a wait for a dependency is work the trace does not see (a slow data loader, Python overhead,
kernel-launch overhead, a sleep, a noisy neighbour on the CPU) and it is the rank's own: leaving it
out of the replay makes the replay faster than the job and blames the ranks that waited for it.

Each idle interval belongs to the op X that ends it (the next op the rank starts):

* X computes (or is another local op): the whole interval is the rank's host time (an op's
  dependencies are ops of the same rank, and none of them was running).
* X is a participant of a collective or of a p2p transfer: only the part of the interval after
  every other participant had started counts. Before that the rank may have been waiting for its
  peers outside the op (tracers that record a receive when its data starts to arrive do exactly
  that), and a wait for a late peer is never the waiting rank's fault.
* X communicates but has no matched peers (``group`` null): nothing counts; whether the rank
  worked or waited cannot be told.
* The first op of a step: the interval since the rank's last op of the previous step (data
  loading and the optimiser's host work often sit there).

The gaps before ops of the same *position* (the k-th op of one name on a rank in a step) share an
op type ``host:NAME[k]``, so each is idealised against its peers (the median of that type, as for
communication: host stalls are sporadic, and their typical value is what a healthy rank does).
A position gets explicit ``host`` ops, on every rank and in every step, when its largest gap is
a noticeable share of a step (``GapConfig``); smaller gaps stay out of the model, as the published
method leaves launch gaps out, and are only summed up per rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from laggard.engine.graph import dependencies
from laggard.engine.kernels import kernel
from laggard.engine.sameop import nth_in_group
from laggard.engine.sorting import lex_order
from laggard.optable.ops import COMM_KINDS, Job, make_table, unique_inverse

HOST_KIND = "host"
HOST_PREFIX = "host:"


@dataclass(kw_only=True, slots=True)
class GapConfig:
    """When untraced host time becomes part of the job model."""

    # A position whose largest gap is under this share of the median step time cannot move a
    # step by more than that. The published traces' largest positions reach 0.08% (AR) and 0.76%
    # (ST) of a step, and their published analysis leaves gaps out: 2% keeps clear of them and
    # still catches a 1 ms stall in a 50 ms step. Many smaller gaps that add up show as replay
    # fidelity above 1 (and a launch-delay finding of their own).
    min_share_of_step: float = 0.02
    # Off: the job is replayed as traced, gaps left out (the published method).
    enabled: bool = True
    # A host op also waits for the op whose end began its gap (on another stream of the rank, a
    # wait the importer did not see). Off where that contradicts the trace's own dependencies
    # (a cycle: e.g. a send that completed before its receiver arrived).
    wait_for_busy: bool = True


@dataclass(kw_only=True, slots=True)
class GapSummary:
    """How much untraced host time each rank spends, and how much of it the model holds."""

    ranks: np.ndarray
    idle_s: np.ndarray  # per rank: all host gaps (before any op), summed over steps
    modelled_s: np.ndarray  # per rank: the part in positions that became host ops
    num_steps: int
    threshold_s: float
    num_positions: int
    num_ops: int
    positions: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        k = max(self.num_steps, 1)
        return {
            "per_rank_s_per_step": {str(int(r)): float(v) / k for r, v in zip(self.ranks, self.idle_s, strict=True)},
            "modelled_per_rank_s_per_step": {
                str(int(r)): float(v) / k for r, v in zip(self.ranks, self.modelled_s, strict=True)
            },
            "threshold_s": float(self.threshold_s),
            "num_positions": self.num_positions,
            "num_host_ops": self.num_ops,
            "positions": self.positions[:50],
        }


def is_host_name(name: str) -> bool:
    return name.startswith(HOST_PREFIX)


def host_attribution_type(name: str) -> str:
    """``host:NAME[k]`` -> ``host:NAME``: the gaps before every occurrence of an op type."""
    return name.rsplit("[", 1)[0] if name.endswith("]") else name


@dataclass(kw_only=True, slots=True, eq=False)  # numpy arrays: a generated == could only raise (no truth value)
class _Gaps:
    host_ns: np.ndarray  # per op: host time before it (int64)
    step_ns: float  # median measured step
    busy_row: np.ndarray  # per op: the op of its rank whose end began the gap before it (-1: none)
    op_step: np.ndarray
    start_ns: np.ndarray
    pos_code: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # per op: position type
    pos_names: list[str] = field(default_factory=list)


def insert_host_gaps(job: Job, config: GapConfig | None = None) -> tuple[Job, GapSummary]:
    """The job with explicit host ops where untraced gaps matter, and the per-rank summary."""
    cfg = config or GapConfig()
    gaps = _measure(job)
    rank = job.column("rank").astype(np.int64)
    ranks, rank_idx = unique_inverse(rank)
    idle_s = np.bincount(rank_idx, weights=gaps.host_ns * 1e-9, minlength=len(ranks))
    threshold_ns = cfg.min_share_of_step * gaps.step_ns
    if cfg.enabled and bool((gaps.host_ns >= max(threshold_ns, 1.0)).any()):
        # positions matter only when some gap reaches the threshold (a second sort of all ops)
        gaps.pos_code, gaps.pos_names = _positions(job, rank, gaps.op_step, gaps.start_ns)
    else:
        gaps.pos_code, gaps.pos_names = np.zeros(job.num_ops, dtype=np.int64), ["host:any[0]"]
    num_pos = len(gaps.pos_names)
    pos_max = np.zeros(num_pos, dtype=np.int64)
    np.maximum.at(pos_max, gaps.pos_code, gaps.host_ns)
    chosen = (pos_max > 0) & (pos_max >= threshold_ns) if cfg.enabled else np.zeros(num_pos, dtype=bool)
    at = chosen[gaps.pos_code]
    modelled_s = np.bincount(rank_idx, weights=np.where(at, gaps.host_ns, 0) * 1e-9, minlength=len(ranks))
    order = np.argsort(-pos_max[chosen], kind="stable")
    summary = GapSummary(
        ranks=ranks,
        idle_s=idle_s,
        modelled_s=modelled_s,
        num_steps=int(gaps.op_step.max(initial=-1)) + 1,
        threshold_s=threshold_ns * 1e-9,
        num_positions=int(chosen.sum()),
        num_ops=int(at.sum()),
        positions=[gaps.pos_names[i] for i in np.flatnonzero(chosen)[order]],
    )
    if not at.any():
        return job, summary
    return _with_host_ops(job, np.flatnonzero(at), gaps, wait_for_busy=cfg.wait_for_busy), summary


def _measure(job: Job) -> _Gaps:
    """Host time before every op (see the module docstring), and each op's position type."""
    n = job.num_ops
    rank = job.column("rank").astype(np.int64, copy=False)
    steps, op_step = unique_inverse(job.column("step"))
    start = job.column("start_ns").astype(np.int64, copy=False)
    end = start + job.column("dur_ns").astype(np.int64, copy=False)
    step_lo = np.full(len(steps), np.iinfo(np.int64).max)
    np.minimum.at(step_lo, op_step, start)
    step_hi = np.full(len(steps), np.iinfo(np.int64).min)
    np.maximum.at(step_hi, op_step, end)
    step_ns = float(np.median(step_hi - step_lo))
    # the rank's ops in time order, one run per (rank, step); each op-sized temporary is let go
    # as soon as it is used (7.7M ops: 60 MB each, and this is the analysis' memory peak)
    o = lex_order(rank, op_step, start)
    key = rank[o] * (len(steps) + 1) + op_step[o]
    first = np.ones(n, dtype=bool)
    first[1:] = key[1:] != key[:-1]
    del key
    run_start = np.flatnonzero(first)
    del first
    busy_until, busy_pos = _running_max(end[o], run_start)
    del end
    idle_from = np.empty(n, dtype=np.int64)
    idle_from[1:] = busy_until[:-1]
    busy_row = np.full(n, -1, dtype=np.int64)
    busy_row[o[1:]] = o[busy_pos[:-1]]
    del busy_pos
    busy_row[o[run_start]] = -1  # the first op of a step waits for nothing of this step
    # the first op of a run: since the rank's last op of the previous step if that step is
    # traced, else since the step began on the earliest rank
    run_end = np.append(run_start[1:], n) - 1
    prev = np.maximum(np.arange(len(run_start)) - 1, 0)
    run_rank = rank[o[run_start]]
    run_step = steps[op_step[o[run_start]]]
    has_prev = (np.arange(len(run_start)) > 0) & (run_rank == run_rank[prev]) & (run_step - run_step[prev] == 1)
    idle_from[run_start] = np.where(has_prev, busy_until[run_end][prev], step_lo[op_step[o[run_start]]])
    del busy_until
    host = np.empty(n, dtype=np.int64)
    host[o] = np.maximum(start[o] - idle_from, 0)
    del idle_from, o
    host = _exclude_waits(job, op_step, start, host)
    return _Gaps(host_ns=host, step_ns=step_ns, busy_row=busy_row, op_step=op_step, start_ns=start)


def _running_max(values: np.ndarray, run_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Running max of ``values`` restarting with every run (``run_start``: where each begins), and the
    latest position that holds it. Compiled where built (``laggard.engine.kernels``: one pass, where the
    numpy twin makes a dozen over every op: 4,096 workers' 7.7M ops ~100 -> ~15 ms)."""
    compiled = kernel("running_max")
    if compiled is None:
        return _running_max_numpy(values, run_start)
    running, pos = np.empty(len(values), dtype=np.int64), np.empty(len(values), dtype=np.int64)
    compiled(np.ascontiguousarray(values, dtype=np.int64), np.ascontiguousarray(run_start, dtype=np.int64),
             running, pos)
    return running, pos


def _running_max_numpy(values: np.ndarray, run_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The compiled ``running_max``'s twin: the runs shifted apart so that one running max serves all."""
    n = len(values)
    if n == 0:
        return values.copy(), np.zeros(0, dtype=np.int64)
    run = np.repeat(np.arange(len(run_start)), np.diff(np.append(run_start, n)))
    lo = values[run_start][run]
    rel = values - lo
    rel_min = int(rel.min())
    rel -= rel_min
    span = int(rel.max()) + 1
    if len(run_start) * span < 2**62:
        off = run * span
        shifted = rel
        shifted += off
        best = np.maximum.accumulate(shifted)
        at_max = shifted == best
        del shifted, rel
        running = best
        running -= off
        running += rel_min
        running += lo
        del off, lo
    else:  # astronomically long runs: one running max per run
        bounds = np.append(run_start, n)
        running = np.concatenate([np.maximum.accumulate(values[a:b])
                                  for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
        at_max = values == running
    pos = np.arange(n)
    pos[~at_max] = 0
    np.maximum.accumulate(pos, out=pos)
    return running, pos


def _exclude_waits(job: Job, op_step: np.ndarray, start: np.ndarray, host: np.ndarray) -> np.ndarray:
    """Communication ops: only idle time after every other participant had started counts."""
    kind_code, kinds = job.codes("kind")
    comm = np.array([k in COMM_KINDS for k in kinds] + [False], dtype=bool)[kind_code]
    if not comm.any():
        return host
    gcode, _ = job.codes("group")
    grouped = comm & (gcode >= 0)
    out = np.where(comm & ~grouped, 0, host)
    rows = np.flatnonzero(grouped)
    if len(rows) == 0:
        return out
    seq_all = job.column("seq")
    key, num_keys = _instance_keys(op_step[rows], gcode[rows], seq_all[rows])
    keep = _groups_with_gaps(out[rows] > 0, key, num_keys)
    if keep is not None:
        rows = rows[keep]
        key = key[keep] if key is not None else None
    if len(rows) == 0:
        return out
    if key is not None:  # one packed key for (step, group, seq): sorted with the start times
        order = lex_order(key, start[rows])
        k = key[order]
        new = np.ones(len(rows), dtype=bool)
        new[1:] = k[1:] != k[:-1]
        del k
    else:
        new, order = _instance_starts(rows, op_step, gcode, seq_all[rows], start)
    r = rows[order]
    gid = np.cumsum(new) - 1
    bounds = np.append(np.flatnonzero(new), len(r))
    size = np.diff(bounds)[gid]
    last = bounds[1:][gid] - 1  # the latest starter of each group (sorted by start)
    pos = np.arange(len(r))
    # the others' latest start: the group's last start, or the one before it for the last starter
    sr = start[r]
    others = np.where(pos == last, sr[np.maximum(last - 1, 0)], sr[last])
    allowed = np.where(size >= 2, np.maximum(sr - others, 0), 0)
    out[r] = np.minimum(out[r], allowed)
    return out


def _instance_keys(st: np.ndarray, gc: np.ndarray, sq: np.ndarray) -> tuple[np.ndarray | None, int]:
    """Each row's instance (step, group, seq) packed into one int64 in the same order, and the number
    of possible keys; (None, 0) where they do not fit one."""
    sq_lo = int(sq.min())
    widths = (int(st.max()) + 1, int(gc.max()) + 1, int(sq.max()) - sq_lo + 1)
    num_keys = widths[0] * widths[1] * widths[2]
    if num_keys >= 2**62:
        return None, 0
    key = st.astype(np.int64)
    key *= widths[1]
    key += gc
    key *= widths[2]
    key += sq
    key -= sq_lo
    return key, num_keys


def _instance_starts(rows: np.ndarray, op_step: np.ndarray, gcode: np.ndarray, seq: np.ndarray,
                     start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where the (step, group, seq) keys do not pack into one int64: ``rows`` sorted by them and by
    start (``order``), and where each instance begins in that order."""
    order = lex_order(op_step[rows], gcode[rows], seq, start[rows])
    r = rows[order]
    new = np.zeros(len(r), dtype=bool)
    new[0] = True  # (rows is not empty)
    for col, at in ((op_step, r), (gcode, r), (seq, order)):  # each gathered once, one at a time
        c = col[at]
        new[1:] |= c[1:] != c[:-1]
    return new, order


def _groups_with_gaps(gap: np.ndarray, key: np.ndarray | None, num_keys: int) -> np.ndarray | None:
    """Which grouped communication rows (``gap``: each has host time before it) are in an instance
    (step, group, seq: ``key``) that has a participant with host time: the others keep 0, whatever the
    rule says; None for all of them. One mark per instance in a table over the packed key where it is
    no larger than the rows' index, instead of sorting every instance: at 4,096 workers 8% of 4.9M
    transfers and collectives have a gap before them."""
    if gap.all():
        return None
    if not gap.any():
        return gap
    if key is None or num_keys > 8 * len(gap) + 1024:  # a byte per key: no more memory than the rows' int64 index
        return None
    mark = np.zeros(num_keys, dtype=bool)
    mark[key[gap]] = True
    return mark[key]


def _positions(job: Job, rank: np.ndarray, op_step: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Each op's position: its name and how many ops of that name the rank ran before it in the step."""
    name_code, names = job.codes("name")
    k = nth_in_group(rank, op_step, name_code, start=start)
    width = int(k.max()) + 1 if len(k) else 1
    pair = name_code.astype(np.int64) * width + k
    # dense codes of the (name, k) pairs that occur, in pair order (np.unique without its sort)
    seen = np.zeros(len(names) * width, dtype=bool)
    seen[pair] = True
    uniq = np.flatnonzero(seen)
    pos_code = (np.cumsum(seen) - 1)[pair]
    pos_names = [f"{HOST_PREFIX}{names[int(u // width)]}[{int(u % width)}]" for u in uniq]
    return pos_code.astype(np.int64), pos_names


def _with_host_ops(job: Job, at: np.ndarray, gaps: _Gaps, *, wait_for_busy: bool) -> Job:
    """Insert one host op right before each op in ``at`` (rows renumbered, dependencies rewired)."""
    t = job.table
    n, m = job.num_ops, len(at)
    # new row of every old row, and of the host op placed right before it
    shift = np.zeros(n, dtype=np.int64)
    shift[at] = 1
    new_row = np.arange(n) + np.cumsum(shift)
    host_row = new_row[at] - 1
    # every op's dependencies made explicit (an implicit "previous op on the stream" chain would
    # otherwise run through the host ops), then: a host op waits for what the op it precedes
    # waited for and for the op whose end began its gap; the op waits for its host op
    dep_ptr, dep_idx = dependencies(job, gaps.op_step)
    owner = np.repeat(np.arange(n), np.diff(dep_ptr))
    is_at = np.zeros(n, dtype=bool)
    is_at[at] = True
    host_of = np.full(n, -1, dtype=np.int64)
    host_of[at] = host_row
    moved = is_at[owner]
    busy = gaps.busy_row[at]
    with_busy = (busy >= 0) & (gaps.host_ns[at] > 0) & wait_for_busy
    new_n = n + m
    vals_owner = np.concatenate(
        [new_row[owner[~moved]], host_of[owner[moved]], host_row[with_busy], new_row[at]]
    )
    vals = np.concatenate([new_row[dep_idx[~moved]], new_row[dep_idx[moved]], new_row[busy[with_busy]], host_row])
    vorder = np.argsort(vals_owner, kind="stable")
    new_offsets = np.zeros(new_n + 1, dtype=np.int64)
    np.cumsum(np.bincount(vals_owner, minlength=new_n), out=new_offsets[1:])
    new_deps = pa.LargeListArray.from_arrays(pa.array(new_offsets), pa.array(vals[vorder].astype(np.int64)))
    new_deps = new_deps.cast(pa.list_(pa.int64()))
    # the host ops' own rows: the position of the op they precede, on its rank and stream
    host_ns = gaps.host_ns[at]
    host_start = job.column("start_ns")[at] - host_ns
    host_cols: dict[str, Any] = {
        "rank": job.column("rank")[at],
        "dp_rank": job.column("dp_rank")[at],
        "pp_rank": job.column("pp_rank")[at],
        "tp_rank": job.column("tp_rank")[at],
        "cp_rank": job.column("cp_rank")[at],
        "vchunk": job.column("vchunk")[at],
        "step": job.column("step")[at],
        "microbatch": job.column("microbatch")[at],
        "name": np.array(gaps.pos_names, dtype=object)[gaps.pos_code[at]],
        "kind": [HOST_KIND] * m,
        "stream": np.array(job.codes("stream")[1], dtype=object)[job.codes("stream")[0][at]],
        "start_ns": host_start,
        "dur_ns": host_ns,
    }
    host_table = make_table(host_cols, num_rows=m).drop_columns(["deps"])
    base = t.drop_columns(["deps"])
    # tables written with not-null fields (laggard synth) and the host ops' (nullable) must agree
    loose = pa.schema([f.with_nullable(True) for f in base.schema])
    base, host_table = base.cast(loose), host_table.cast(loose)
    both = pa.concat_tables([base, host_table]).unify_dictionaries().combine_chunks()
    perm = np.empty(new_n, dtype=np.int64)
    perm[new_row] = np.arange(n)
    perm[host_row] = n + np.arange(m)
    out = both.take(pa.array(perm))
    out = out.set_column(out.schema.get_field_index("op_id"), "op_id", pa.array(np.arange(new_n, dtype=np.int64)))
    out = out.append_column(t.schema.field("deps"), new_deps)
    out = out.select(t.column_names)
    return Job(table=out, meta=job.meta, warnings=job.warnings, load_args=job.load_args)


__all__ = ["GapConfig", "GapSummary", "HOST_KIND", "host_attribution_type", "insert_host_gaps", "is_host_name"]
