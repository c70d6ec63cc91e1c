"""One rank's Kineto events -> that rank's ops (compute segments and collectives), vectorised.

The model (see ``laggard.io.kineto.load`` for how ranks are joined):

* **Steps** are the ``ProfilerStep#N`` annotations. CPU events belong to the step whose window
  holds their start; GPU events to the step of the CPU call that launched them (``correlation``),
  else to the GPU-side ``ProfilerStep#N`` window, else to the CPU window holding their start.
* **Collectives** (``kineto_comm``): which events they are and their metadata.
* **Compute** (``kineto_segments``): work units per stream, cut into segments at collectives.

``build_rank`` runs these steps in order (the step windows: ``laggard.io.kineto.windows``, over the
lookup tables of ``laggard.io.kineto.labels``); this module keeps the assembly of the rank's op
columns and dependency lists.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laggard.io.kineto.comm import (
    KIND_RECV,
    KIND_SEND,
    Collectives,
    coll_type,
    read_collectives,
    select_collectives,
)
from laggard.io.kineto.devices import rank_identity
from laggard.io.kineto.events import RankEvents
from laggard.io.kineto.hostops import HostOps, host_ops
from laggard.io.kineto.labels import Labels, labels
from laggard.io.kineto.segments import (
    Segments,
    Streams,
    cut_segments,
    microbatches,
    stream_label,
    streams,
    top_level,
    unit_phases,
    work_units,
)
from laggard.io.kineto.sequences import segment_sequences
from laggard.io.kineto.windows import EventSteps, containing, event_steps, in_window, preceding

KIND_LABELS = ("compute", "collective", "p2p_send", "p2p_recv", "other")
KIND_OTHER = 4  # a garbage collection or a DataLoader fetch (laggard.io.kineto.hostops)
# a transfer launched this soon after its c10d call ended still counts as launched by it (us)
_ISSUE_SLACK_US = 50.0


@dataclass(kw_only=True, slots=True)
class RankOps:
    """The ops of one rank (times in ns on the rank's own clock: base + ts)."""

    path: str
    rank: int | None
    world_size: int | None
    backend: str | None
    pg_config: list[dict[str, Any]]
    host: str | None
    base_ns: int | None
    device: str  # "gpu" or "cpu"
    num_bytes: int
    num_events: int
    step: np.ndarray  # int64
    stream: np.ndarray  # int32 codes into streams
    streams: list[str]
    name: np.ndarray  # int32 codes into names
    names: list[str]
    kind: np.ndarray  # int8 codes into KIND_LABELS
    start_ns: np.ndarray  # int64
    dur_ns: np.ndarray  # int64
    issue_ns: np.ndarray  # int64: when the op was issued (a transfer's c10d call start), else start_ns
    group: np.ndarray  # int32 codes into groups, -1 none
    groups: list[str]
    meta_seq: np.ndarray  # int64, -1 when the trace has no sequence number
    size_bytes: np.ndarray  # int64, -1 unknown
    peer: np.ndarray  # int32, -1
    dep_ptr: np.ndarray  # CSR of explicit dependencies (local op indices); rows empty = default
    dep_idx: np.ndarray
    has_deps: np.ndarray  # bool
    phase: np.ndarray  # int8 code into kineto_segments.PHASES (compute ops; 0 for collectives)
    microbatch: np.ndarray  # int32: a CPU rank's forward/backward segment's microbatch (segments.microbatches), else -1
    # int32: the sequences a CPU rank's forward/backward segment attends over (sequences.segment_sequences),
    # how many and their length in tokens; -1 unknown
    seq_count: np.ndarray
    seq_tokens: np.ndarray
    group_info: dict[str, dict[str, Any]] = field(default_factory=dict)
    coll_source: str = ""
    warnings: list[str] = field(default_factory=list)
    identity: dict[str, str] = field(default_factory=dict)  # host, GPU (laggard.io.kineto.devices)
    cpu_s: float = 0.0  # CPU time spent decoding this rank and building its ops
    worker_cpu_s: float = 0.0  # the part of it spent in a decode worker process


def decode_rank(path: str) -> RankOps:
    """Decode one trace file into its rank's ops, in this process."""
    from laggard.io.kineto.decode import decode_file

    return rank_ops(decode_file(path), in_worker=False)


def rank_ops(ev: RankEvents, *, in_worker: bool) -> RankOps:
    """``build_rank`` with the CPU time of the decode (``ev.cpu_s``) and of the build."""
    t0 = time.process_time()
    ops = build_rank(ev)
    ops.cpu_s = ev.cpu_s + time.process_time() - t0
    ops.worker_cpu_s = ev.cpu_s if in_worker else 0.0
    return ops


def _collectives(ev: RankEvents, lb: Labels, es: EventSteps, *, device: str, cpu: np.ndarray, gpu: np.ndarray,
                 pg_config: list[dict[str, Any]], rank: int | None, warns: list[str]) -> Collectives:
    coll, backend, source = select_collectives(ev, device=device, cpu=cpu, gpu=gpu, is_name=lb.is_name)
    rpc = np.flatnonzero(lb.is_name["rpc"][ev.name] & cpu)
    if device == "gpu":
        gi = np.searchsorted(np.flatnonzero(gpu), coll)
        q_tid, q_ts = es.launch_tid[gi], es.launch_ts[gi]
    else:
        q_tid, q_ts = ev.tid[coll], ev.ts_us[coll]
    # metadata: the event's own, else the record_param_comms call holding its launch
    holder = containing(q_tid, np.nan_to_num(q_ts, nan=-np.inf), ev.tid[rpc], ev.ts_us[rpc],
                         ev.ts_us[rpc] + ev.dur_us[rpc])
    # gloo p2p: the c10d::send / c10d::recv_ call just before the transfer on its thread names the peer
    c10d = np.flatnonzero(lb.is_name["c10d_p2p"][ev.name] & cpu)
    c10d_holder = preceding(q_tid, np.nan_to_num(q_ts, nan=-np.inf), ev.tid[c10d], ev.ts_us[c10d])
    co = read_collectives(ev, coll, backend=backend, source=source, device=device, holder=holder, rpc=rpc,
                          pg_config=pg_config, warns=warns, c10d=c10d, c10d_holder=c10d_holder, rank=rank)
    co.issue_us = _issued(ev, co, q_ts, c10d, c10d_holder)
    return co


def _issued(ev: RankEvents, co: Collectives, q_ts: np.ndarray, c10d: np.ndarray, c10d_holder: np.ndarray) -> np.ndarray:
    """When each collective was issued: a transfer's ``c10d::send`` / ``c10d::recv_`` call start
    when that call holds its launch, else the event's own start. On a busy host ``gloo:send``
    begins milliseconds into its call, after the data has gone (a receive seen to complete before
    its send began); the call is the transfer."""
    ts = ev.ts_us[co.idx]
    if not len(c10d) or not len(ts):
        return ts.copy()
    call = c10d[np.maximum(c10d_holder, 0)]
    names = np.array(co.name)
    p2p = np.char.endswith(names, ":send") | np.char.endswith(names, ":recv")
    # (the call's end may trail the launch a little)
    inside = p2p & (c10d_holder >= 0) & (q_ts <= ev.ts_us[call] + ev.dur_us[call] + _ISSUE_SLACK_US)
    return np.where(inside, np.minimum(ev.ts_us[call], ts), ts)


def build_rank(ev: RankEvents) -> RankOps:
    """See the module docstring."""
    warns: list[str] = []
    if ev.repaired_names:
        warns.append(f"{ev.path}: {ev.repaired_names} event name(s) had unescaped quotes (torch.profiler's export of "
                     "Python frames, with_stack=True): read with them escaped")
    info = ev.header.get("distributedInfo") or {}
    lb = labels(ev)
    cpu, gpu = lb.cat_cpu[ev.cat], lb.cat_gpu[ev.cat]
    device = "gpu" if gpu.any() else "cpu"
    es = event_steps(ev, lb, cpu, gpu, warns)
    pg_config = [p for p in (info.get("pg_config") or []) if isinstance(p, dict)]
    rank = info.get("rank") if isinstance(info.get("rank"), int) else None
    co = _collectives(ev, lb, es, device=device, cpu=cpu, gpu=gpu, pg_config=pg_config, rank=rank, warns=warns)
    unit, u_key, c_key = work_units(ev, device=device, cpu=cpu, gpu=gpu, is_wrapper=lb.is_name["wrapper"],
                                    is_nccl_kernel=lb.is_name["nccl_kernel"], is_loader=lb.is_name["loader"],
                                    coll=co.idx)
    # only what lies in a step window
    u_step, c_step = es.step[unit], es.step[co.idx]
    dropped = int((u_step < 0).sum()) + int((c_step < 0).sum())
    if dropped:
        warns.append(f"{ev.path}: skipped {dropped} op(s) outside every ProfilerStep#N window")
    keep_c, keep_u = c_step >= 0, u_step >= 0
    co, c_step, c_key = co.subset(keep_c), c_step[keep_c], c_key[keep_c]
    unit, u_step, u_key = unit[keep_u], u_step[keep_u], u_key[keep_u]
    main_tid = None
    if device == "cpu" and not es.whole:
        st_ev = np.flatnonzero(cpu & (lb.step_of_name[ev.name] >= 0))
        main_tid = int(np.bincount(ev.tid[st_ev]).argmax()) if len(st_ev) else None
    st = streams(ev, unit, u_key, c_key, device=device, main_tid=main_tid)
    # a rank with point-to-point transfers is a pipeline stage: its segments are cut where the phase
    # changes and named by it, so its GPU kernels take their phase from their launchers (other ranks'
    # segments are named by position: their phases are not worth the launchers' lookup)
    stage = bool(np.isin(co.kind, (KIND_SEND, KIND_RECV)).any()) or any(
        n.rsplit(":", 1)[-1] in ("send", "recv") for n in set(co.name))  # transfers without peer ranks too
    # a CPU rank's ops carry their phase in their names (``autograd::engine::...`` in backward), so
    # every CPU rank is cut by phase too: a DDP rank's forward and backward passes of each microbatch
    # become segments of their own (else one segment held a step's every microbatch)
    u_phase = _unit_phases(ev, lb, es, unit, cpu=cpu, gpu=gpu, from_launchers=stage and device == "gpu")
    seg = cut_segments(ev, st, u_step, co.idx, c_step, device=device, u_phase=u_phase,
                       split_phases=stage or device == "cpu")
    seg_mb = microbatches(seg, merge_runs=not stage) if device == "cpu" else np.full(seg.num, -1)
    hops = host_ops(ev, st, seg, lambda t: in_window(t, es.cpu_windows), device=device, loader=lb.is_name["loader"])
    seqs = segment_sequences(ev, st, seg, seg_mb, device=device)
    ops = _assemble(ev, info, device, pg_config, co, c_step, st, seg, seg_mb, hops, warns, seqs)
    ops.identity = rank_identity(ev, gpu)
    return ops


def _unit_phases(ev: RankEvents, lb: Labels, es: EventSteps, unit: np.ndarray, *, cpu: np.ndarray, gpu: np.ndarray,
                 from_launchers: bool) -> np.ndarray:
    """Each work unit's training phase (a code into ``kineto_segments.PHASES``): a CPU op's from its
    own name; a GPU kernel's from the top-level CPU op that launched it (``autograd::engine::...``
    in backward, ``Optimizer.step#...``), as kernel names rarely say (a GEMM is a GEMM in forward
    and in backward), else from the kernel's own name (``from_launchers``: GPU units)."""
    by_name = unit_phases(ev.names)
    phase = by_name[ev.name[unit]]
    if not from_launchers:
        return phase
    c = np.flatnonzero(cpu & ~lb.cat_rt[ev.cat] & ~lb.is_name["wrapper"][ev.name])
    top = top_level(c, ev.tid[c], ev.ts_us[c], ev.dur_us[c])
    gi = np.searchsorted(np.flatnonzero(gpu), unit)
    holder = containing(es.launch_tid[gi], np.nan_to_num(es.launch_ts[gi], nan=-np.inf), ev.tid[top], ev.ts_us[top],
                         ev.ts_us[top] + ev.dur_us[top])
    ok = holder >= 0
    phase[ok] = by_name[ev.name[top[holder[ok]]]]
    return phase


def _assemble(ev: RankEvents, info: dict[str, Any], device: str, pg_config: list[dict[str, Any]], co: Collectives,
              c_step: np.ndarray, st: Streams, seg: Segments, seg_mb: np.ndarray, hops: HostOps,
              warns: list[str], seqs: tuple[np.ndarray, np.ndarray]) -> RankOps:
    """The rank's ops: segments first, then collectives, then host work (garbage collections ``gc``
    and DataLoader fetches ``data-wait``, kind ``other``), with explicit dependency lists; ``seg_mb``:
    each segment's microbatch (-1: none); ``seqs``: each segment's sequences (count, tokens each; -1:
    unknown)."""
    ts, dur = ev.ts_us, ev.dur_us
    ns = _to_ns(ts, ev.header.get("baseTimeNanoseconds"))
    num_seg, coll, n_host = seg.num, co.idx, hops.num
    n_ops = num_seg + len(coll) + n_host
    none, not_seg = np.full(n_host, -1), np.full(len(coll) + n_host, -1)
    labelled = _op_labels(ev, device, co, st, seg, hops, n_ops)
    issue = ts[coll] if co.issue_us is None else co.issue_us
    # a CPU rank's transfer is its whole c10d call (see _issued); a kernel starts when the GPU runs it
    c_start = issue if device == "cpu" else ts[coll]
    start_ns = np.concatenate([ns(seg.start_us), ns(c_start), ns(hops.start_us)]) if n_ops else np.zeros(0, np.int64)
    dur_ns = np.round(np.concatenate([seg.dur_us, dur[coll] + (ts[coll] - c_start), hops.dur_us])
                      * 1000.0).astype(np.int64)
    steps_all = np.concatenate([seg.step, c_step, hops.step]).astype(np.int64)
    # (by the call's type: a transfer without its peers in the trace is paired later, kineto/p2p.py)
    p2p_call = np.array([x.rsplit(":", 1)[-1] in ("send", "recv") for x in co.name], dtype=bool)
    posted = np.concatenate([np.zeros(num_seg, bool), p2p_call, np.zeros(n_host, bool)]) if device == "cpu" else \
        np.zeros(n_ops, bool)
    dep_ptr, dep_idx = _dependencies(seg, num_seg, n_ops, steps_all, labelled["stream"], start_ns, posted)
    return RankOps(
        **_rank_fields(ev, info),
        pg_config=pg_config,
        device=device,
        step=steps_all,
        **labelled,
        kind=np.concatenate([np.zeros(num_seg, np.int8), co.kind, np.full(n_host, KIND_OTHER, np.int8)]),
        start_ns=start_ns.astype(np.int64),
        dur_ns=dur_ns,
        issue_ns=np.concatenate([ns(seg.start_us), ns(issue), ns(hops.start_us)]).astype(np.int64),
        meta_seq=np.concatenate([np.full(num_seg, -1), co.seq, none]).astype(np.int64),
        size_bytes=np.concatenate([np.full(num_seg, -1), co.size_bytes, none]).astype(np.int64),
        peer=np.concatenate([np.full(num_seg, -1), co.peer, none]).astype(np.int32),
        dep_ptr=dep_ptr,
        dep_idx=dep_idx,
        has_deps=np.ones(n_ops, bool),
        phase=np.concatenate([seg.phase, np.zeros(len(coll) + n_host, np.int8)]).astype(np.int8),
        microbatch=np.concatenate([seg_mb, not_seg]).astype(np.int32),
        seq_count=np.concatenate([seqs[0], not_seg]).astype(np.int32),
        seq_tokens=np.concatenate([seqs[1], not_seg]).astype(np.int32),
        group_info=co.group_info,
        coll_source=co.source,
        warnings=warns,
    )


def _to_ns(ts: np.ndarray, base_ns: Any) -> Any:
    """Trace times (µs, floats) to integer ns on the rank's clock (``baseTimeNanoseconds`` + ts),
    rounded relative to the earliest event so that large timestamps keep their ns."""
    base = int(base_ns) if isinstance(base_ns, int) else 0
    t0 = float(ts.min()) if len(ts) else 0.0

    def ns(t_us: np.ndarray) -> np.ndarray:
        return np.round((t_us - t0) * 1000.0).astype(np.int64) + (base + int(round(t0 * 1000.0)))

    return ns


def _op_labels(ev: RankEvents, device: str, co: Collectives, st: Streams, seg: Segments, hops: HostOps,
               n_ops: int) -> dict[str, Any]:
    """The ops' streams, names and process groups, as codes into labels (``RankOps`` fields)."""
    c_keys, c_sid = np.unique(st.c_key, return_inverse=True)
    streams = [stream_label(ev, int(k), device) for k in st.keys] + [stream_label(ev, int(k), device) for k in c_keys]
    num_seg, n_host = seg.num, hops.num
    op_names = (seg.names(st.lane) if num_seg else []) + co.name + hops.names
    name_labels, name_codes = (np.unique(np.array(op_names, dtype=object).astype(str), return_inverse=True) if n_ops
                               else (np.array([]), np.zeros(0, np.int64)))
    grp_labels = sorted({g for g in co.group if g})
    gl = {g: i for i, g in enumerate(grp_labels)}
    return {
        "stream": np.concatenate([seg.sid, len(st.keys) + c_sid, hops.sid]).astype(np.int32),
        "streams": streams,
        "name": name_codes.astype(np.int32),
        "names": [str(x) for x in name_labels],
        "group": np.concatenate([np.full(num_seg, -1), np.array([gl.get(g, -1) for g in co.group], dtype=np.int64),
                                 np.full(n_host, -1)]).astype(np.int32),
        "groups": grp_labels,
    }


def _rank_fields(ev: RankEvents, info: dict[str, Any]) -> dict[str, Any]:
    """What the trace says about its rank and file (``RankOps`` fields)."""
    base_ns = ev.header.get("baseTimeNanoseconds")

    def of_type(key: str, kind: type) -> Any:
        return info.get(key) if isinstance(info.get(key), kind) else None

    return {
        "path": ev.path,
        "rank": of_type("rank", int),
        "world_size": of_type("world_size", int),
        "backend": of_type("backend", str),
        "host": ev.header.get("host_name"),
        "base_ns": int(base_ns) if isinstance(base_ns, int) else None,
        "num_bytes": ev.num_bytes,
        "num_events": len(ev.ts_us),
    }


def _dependencies(seg: Segments, num_seg: int, n_ops: int, steps_all: np.ndarray, stream_codes: np.ndarray,
                  start_ns: np.ndarray, posted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR of each op's dependencies: the previous op on its stream and its launch / wait links
    (same step only). Every op gets an explicit list, so the graph never has to infer stream order
    for part of the table. A ``posted`` transfer (a CPU rank's point-to-point send or receive) does not
    wait for the transfer before it on its stream when that is one too: gloo runs posted isend/irecv
    at once, and a 1F1B stage posts its next forward's send before the previous backward's receive
    while its neighbour posts them the other way round, which chained in posting order is a cycle.
    Each still waits for the op it was posted after (the previous op of its thread), which orders
    blocking transfers."""
    dst = np.concatenate([num_seg + seg.launch_dst, seg.wait_dst]).astype(np.int64)
    src = np.concatenate([seg.launch_src, num_seg + seg.wait_src]).astype(np.int64)
    same = steps_all[dst] == steps_all[src] if len(dst) else np.zeros(0, bool)
    dst, src = dst[same], src[same]
    order_ops = np.lexsort((start_ns, steps_all, stream_codes))
    prev = np.full(n_ops, -1, np.int64)
    if n_ops > 1:
        sm = ((stream_codes[order_ops][1:] == stream_codes[order_ops][:-1])
              & (steps_all[order_ops][1:] == steps_all[order_ops][:-1]))
        prev[order_ops[1:][sm]] = order_ops[:-1][sm]
    prev[posted & (prev >= 0) & posted[np.maximum(prev, 0)]] = -1
    pd = np.flatnonzero(prev >= 0)
    all_dst = np.concatenate([dst, pd])
    all_src = np.concatenate([src, prev[pd]])
    # unique (dst, src) pairs in (dst, src) order, as one int64 key each
    key = np.unique(all_dst.astype(np.int64) * max(n_ops, 1) + all_src)
    pair = np.stack([key // max(n_ops, 1), key % max(n_ops, 1)], axis=1)
    dep_ptr = np.zeros(n_ops + 1, np.int64)
    np.cumsum(np.bincount(pair[:, 0], minlength=n_ops), out=dep_ptr[1:])
    return dep_ptr, pair[:, 1].astype(np.int64)


__all__ = ["KIND_LABELS", "RankOps", "build_rank", "coll_type", "decode_rank", "rank_ops"]
