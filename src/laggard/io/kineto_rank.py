"""One rank's Kineto events -> that rank's ops (compute segments and collectives), vectorised.

The model (see ``laggard.io.kineto`` for how ranks are joined):

* **Steps** are the ``ProfilerStep#N`` annotations. CPU events belong to the step whose window
  holds their start; GPU events to the step of the CPU call that launched them (``correlation``),
  else to the GPU-side ``ProfilerStep#N`` window, else to the CPU window holding their start.
* **Collectives**: on GPU ranks the NCCL kernels (``ncclKernel_*``, ``ncclDevKernel_*``); on
  CPU-only ranks the gloo events (``gloo:*``), else the CPU side of NCCL calls (``nccl:*``, then
  ``record_param_comms``). Their metadata (collective name, process group name and ranks, message
  size, sequence number) comes from the event itself (newer traces) or from the
  ``record_param_comms`` call that launched it.
* **Compute**: the GPU kernels, copies and memsets of each stream (GPU ranks), or the top-level
  CPU ops of each thread (CPU-only ranks), cut into segments at every collective: before its
  launch (the collective depends on the segment that ended last before it started) and after
  its end (the first segment after it depends on it when the stream sat idle until the
  collective ended, i.e. was waiting for it). Segments are named by how many collectives of the
  step were launched and finished before them, so the same work has the same name on every rank.
  A GPU segment lasts the sum of its kernels (launch gaps removed); a CPU segment its span.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laggard.io.kineto_events import RankEvents

_GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
_CPU_CATS = frozenset({"cpu_op", "operator", "user_annotation", "cuda_runtime", "runtime", "cuda_driver", "overhead"})
_RUNTIME_CATS = frozenset({"cuda_runtime", "runtime", "cuda_driver"})
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_NCCL_KERNEL = re.compile(r"^(ncclKernel|ncclDevKernel)_?([A-Za-z]*)")
# a stream "waited" for a collective when it sat idle until shortly after the collective ended
_WAIT_TOL_NS = 100_000
_WAIT_SHARE = 0.25
KIND_LABELS = ("compute", "collective", "p2p_send", "p2p_recv")
_NO_META: dict[str, Any] = {}


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
    group: np.ndarray  # int32 codes into groups, -1 none
    groups: list[str]
    meta_seq: np.ndarray  # int64, -1 when the trace has no sequence number
    size_bytes: np.ndarray  # int64, -1 unknown
    peer: np.ndarray  # int32, -1
    dep_ptr: np.ndarray  # CSR of explicit dependencies (local op indices); rows empty = default
    dep_idx: np.ndarray
    has_deps: np.ndarray  # bool
    group_info: dict[str, dict[str, Any]] = field(default_factory=dict)
    coll_source: str = ""
    warnings: list[str] = field(default_factory=list)
    cpu_s: float = 0.0  # CPU time spent decoding this rank and building its ops
    worker_cpu_s: float = 0.0  # the part of it spent in a decode worker process


@functools.lru_cache(maxsize=4096)
def coll_type(name: str) -> str:
    """'allreduce', '_allgather_base', 'AllReduce', 'all_to_allv' -> all_reduce, all_gather, ..."""
    k = re.sub(r"[^a-z]", "", name.lower())
    for key, out in (
        ("allreduce", "all_reduce"), ("reducescatter", "reduce_scatter"), ("allgather", "all_gather"),
        ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("barrier", "barrier"), ("sendrecv", "send_recv"),
        ("send", "send"), ("recv", "recv"), ("reduce", "reduce"), ("gather", "gather"), ("scatter", "scatter"),
    ):
        if key in k:
            return out
    return k or "collective"


def _windows(ev: RankEvents, sel: np.ndarray, step_of_name: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step, start, end) of the ProfilerStep windows among ``sel``, sorted by start, one per step."""
    idx = np.flatnonzero(sel & (step_of_name[ev.name] >= 0))
    if len(idx) == 0:
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
    st = step_of_name[ev.name[idx]]
    steps, inv = np.unique(st, return_inverse=True)
    lo = np.full(len(steps), np.inf)
    hi = np.full(len(steps), -np.inf)
    np.minimum.at(lo, inv, ev.ts_us[idx])
    np.maximum.at(hi, inv, ev.ts_us[idx] + ev.dur_us[idx])
    o = np.argsort(lo, kind="stable")
    return steps[o], lo[o], hi[o]


def _in_window(t: np.ndarray, w: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    steps, lo, hi = w
    if len(steps) == 0:
        return np.full(len(t), -1, np.int64)
    i = np.searchsorted(lo, t, side="right") - 1
    ok = (i >= 0) & (t < hi[np.maximum(i, 0)])
    return np.where(ok, steps[np.maximum(i, 0)], -1)


def _containing(tid_q: np.ndarray, t_q: np.ndarray, tid_c: np.ndarray, lo_c: np.ndarray, hi_c: np.ndarray) -> np.ndarray:
    """For each query (thread, time): the index of the latest-starting candidate on that thread
    whose [lo, hi] holds the time; -1 if none."""
    out = np.full(len(t_q), -1, np.int64)
    if len(lo_c) == 0 or len(t_q) == 0:
        return out
    for tid in np.unique(tid_q):
        cand = np.flatnonzero(tid_c == tid)
        if len(cand) == 0:
            continue
        cand = cand[np.argsort(lo_c[cand], kind="stable")]
        q = np.flatnonzero(tid_q == tid)
        j = np.searchsorted(lo_c[cand], t_q[q], side="right") - 1
        ok = j >= 0
        c = cand[np.maximum(j, 0)]
        ok &= hi_c[c] >= t_q[q]
        out[q[ok]] = c[ok]
    return out


def decode_rank(path: str) -> RankOps:
    """Decode one trace file into its rank's ops, in this process."""
    from laggard.io.kineto_events import decode_file

    return rank_ops(decode_file(path), in_worker=False)


def rank_ops(ev: RankEvents, *, in_worker: bool) -> RankOps:
    """``build_rank`` with the CPU time of the decode (``ev.cpu_s``) and of the build."""
    t0 = time.process_time()
    ops = build_rank(ev)
    ops.cpu_s = ev.cpu_s + time.process_time() - t0
    ops.worker_cpu_s = ev.cpu_s if in_worker else 0.0
    return ops


def build_rank(ev: RankEvents) -> RankOps:
    """See the module docstring."""
    warns: list[str] = []
    where = ev.path
    info = ev.header.get("distributedInfo") or {}
    rank = info.get("rank") if isinstance(info.get("rank"), int) else None
    cats_l = np.array([c.lower() for c in ev.cats] + [""], dtype=object)
    cat_gpu = np.array([c in _GPU_CATS for c in cats_l], dtype=bool)
    cat_cpu = np.array([c in _CPU_CATS for c in cats_l], dtype=bool)
    cat_rt = np.array([c in _RUNTIME_CATS for c in cats_l], dtype=bool)
    cat_gpu_ann = np.array([c == "gpu_user_annotation" for c in cats_l], dtype=bool)
    names = ev.names
    step_of_name = np.array([int(m.group(1)) if (m := _STEP.match(s)) else -1 for s in names] + [-1], dtype=np.int64)
    is_nccl_k = np.array([bool(_NCCL_KERNEL.match(s)) for s in names] + [False], dtype=bool)
    is_gloo = np.array([s.startswith("gloo:") for s in names] + [False], dtype=bool)
    is_nccl_cpu = np.array([s.startswith("nccl:") for s in names] + [False], dtype=bool)
    is_rpc = np.array([s == "record_param_comms" for s in names] + [False], dtype=bool)
    # events that are neither work nor a collective on a thread (they wrap the real ops)
    is_wrapper = np.array(
        [bool(_STEP.match(s)) or s.startswith(("PyTorch Profiler", "c10d::", "nccl:", "gloo:")) or s == "record_param_comms"
         for s in names] + [False],
        dtype=bool,
    )

    cat, nm = ev.cat, ev.name
    ts, dur = ev.ts_us, ev.dur_us
    gpu = cat_gpu[cat]
    cpu = cat_cpu[cat]
    device = "gpu" if gpu.any() else "cpu"
    cpu_w = _windows(ev, cpu, step_of_name)
    gpu_w = _windows(ev, cat_gpu_ann[cat], step_of_name)
    whole = len(cpu_w[0]) == 0
    if whole:
        lo_all = float(ts.min()) if len(ts) else 0.0
        hi_all = float((ts + dur).max()) + 1.0 if len(ts) else 1.0
        cpu_w = (np.array([0]), np.array([lo_all]), np.array([hi_all]))
        warns.append(f"{where}: no ProfilerStep#N annotations; the whole trace is analysed as one step (0)")

    # -- step of every event we may use
    step = np.full(len(ts), -1, np.int64)
    step[cpu] = _in_window(ts[cpu], cpu_w)
    if gpu.any():
        g = np.flatnonzero(gpu)
        rt = np.flatnonzero(cat_rt[cat] & (ev.corr >= 0))
        gstep = np.full(len(g), -1, np.int64)
        if len(rt):
            o = rt[np.argsort(ev.corr[rt], kind="stable")]
            j = np.minimum(np.searchsorted(ev.corr[o], ev.corr[g]), len(o) - 1)
            hit = (ev.corr[o][j] == ev.corr[g]) & (ev.corr[g] >= 0)
            gstep[hit] = step[o[j[hit]]]
            launch_tid = np.where(hit, ev.tid[o[j]], -1)
            launch_ts = np.where(hit, ts[o[j]], np.nan)
        else:
            launch_tid = np.full(len(g), -1)
            launch_ts = np.full(len(g), np.nan)
        miss = gstep < 0
        if miss.any() and len(gpu_w[0]):
            gstep[miss] = _in_window(ts[g[miss]], gpu_w)
            miss = gstep < 0
        if miss.any() and not whole:
            gstep[miss] = _in_window(ts[g[miss]], cpu_w)
        if whole:
            gstep[:] = 0
        step[g] = gstep
    # -- collectives
    rpc = np.flatnonzero(is_rpc[nm] & cpu)
    if device == "gpu":
        coll = np.flatnonzero(gpu & is_nccl_k[nm])
        backend_of = "nccl"
        source = "NCCL kernels"
        gi = np.searchsorted(np.flatnonzero(gpu), coll)
        q_tid, q_ts = launch_tid[gi], launch_ts[gi]
    else:
        coll = np.flatnonzero(cpu & is_gloo[nm])
        backend_of, source = "gloo", "gloo events"
        if len(coll) == 0:
            coll = np.flatnonzero(cpu & is_nccl_cpu[nm])
            backend_of, source = "nccl", "CPU-side NCCL calls (nccl:*; no GPU activity in the trace)"
        if len(coll) == 0:
            coll = rpc
            backend_of, source = "comm", "record_param_comms calls (no GPU activity in the trace)"
        q_tid, q_ts = ev.tid[coll], ts[coll]
    # metadata: the event's own, else the record_param_comms call holding its launch
    holder = _containing(q_tid, np.nan_to_num(q_ts, nan=-np.inf), ev.tid[rpc], ts[rpc], ts[rpc] + dur[rpc])
    pg_config = [p for p in (info.get("pg_config") or []) if isinstance(p, dict)]
    default_pg = str(pg_config[0].get("pg_name")) if len(pg_config) == 1 else None
    c_name: list[str] = []
    c_group: list[str] = []
    num_coll = len(coll)
    c_seq, c_size, c_peer, c_kind = [-1] * num_coll, [-1] * num_coll, [-1] * num_coll, [1] * num_coll
    group_info: dict[str, dict[str, Any]] = {}
    no_pg = 0
    unpaired_p2p = 0
    meta, rpc_l = ev.meta, rpc.tolist()
    type_of_name: dict[int, str] = {}  # name code -> collective type read from the name
    for i, (e, h, code) in enumerate(zip(coll.tolist(), holder.tolist(), nm[coll].tolist(), strict=True)):
        # one iteration per collective, not per event: its metadata, else its launcher's
        own = meta.get(e)
        launcher = meta.get(rpc_l[h]) if h >= 0 else None
        m = ({**launcher, **own} if own else launcher) if launcher else (own or _NO_META)
        if "coll" in m:
            ctype = coll_type(m["coll"])
        else:
            ctype = type_of_name.get(code, "")
            if not ctype:
                raw = names[code]
                if device == "gpu":
                    km = _NCCL_KERNEL.match(raw)
                    ctype = coll_type(km.group(2) if km and km.group(2) else "collective")
                else:
                    ctype = coll_type(raw.split(":", 1)[-1])
                type_of_name[code] = ctype
        c_name.append(f"{backend_of}:{ctype}")
        pg = m.get("pg_name", default_pg)
        if pg is None:
            no_pg += 1
            pg = "?"
        if pg not in group_info:
            ranks = m.get("pg_ranks")
            if ranks is None:
                ranks = next((p.get("ranks") for p in pg_config if str(p.get("pg_name")) == pg), None)
            desc = m.get("pg_desc") or next((p.get("pg_desc") for p in pg_config if str(p.get("pg_name")) == pg), None)
            group_info[pg] = {"desc": desc, "ranks": ranks}
        grp = pg
        if ctype in ("send", "recv"):
            src, dst = m.get("src"), m.get("dst")
            if isinstance(src, int) and isinstance(dst, int) and src >= 0 and dst >= 0:
                grp = f"p2p:{src}>{dst}"
                c_kind[i] = 2 if ctype == "send" else 3
                c_peer[i] = dst if ctype == "send" else src
            else:
                unpaired_p2p += 1
                grp = ""
        elif ctype == "send_recv":
            unpaired_p2p += 1
            grp = ""
        c_group.append(grp)
        if "seq" in m:
            c_seq[i] = m["seq"]
        if "size_bytes" in m:
            c_size[i] = m["size_bytes"]
    c_seq, c_size, c_peer = (np.array(x, np.int64) for x in (c_seq, c_size, c_peer))
    c_kind = np.array(c_kind, np.int8)
    if no_pg and len(coll):
        warns.append(
            f"{where}: {no_pg} of {len(coll)} collective(s) carry no process-group name; they are matched across "
            "ranks by their order among the rank's collectives"
        )
    if unpaired_p2p:
        warns.append(f"{where}: {unpaired_p2p} point-to-point transfer(s) without source/destination ranks are not matched across ranks")

    # -- compute units
    if device == "gpu":
        unit = np.flatnonzero(gpu & ~is_nccl_k[nm])
        u_stream_key = ev.pid[unit].astype(np.int64) * 1_000_003 + ev.tid[unit]
        c_stream_key = ev.pid[coll].astype(np.int64) * 1_000_003 + ev.tid[coll]
    else:
        cand = np.flatnonzero(cpu & ~is_wrapper[nm] & ~np.isin(np.arange(len(ts)), coll))
        unit = _top_level(cand, ev.tid[cand], ts[cand], dur[cand])
        u_stream_key = ev.tid[unit].astype(np.int64)
        c_stream_key = ev.tid[coll].astype(np.int64)
        # a collective on a thread that also runs compute gets its own stream beside it
        c_stream_key = np.where(np.isin(c_stream_key, u_stream_key), c_stream_key + 2**40, c_stream_key)
    u_step = step[unit]
    c_step = step[coll]
    dropped = int((u_step < 0).sum()) + int((c_step < 0).sum())
    if dropped:
        warns.append(f"{where}: skipped {dropped} op(s) outside every ProfilerStep#N window")
    keep_c = c_step >= 0
    coll, c_step, c_stream_key = coll[keep_c], c_step[keep_c], c_stream_key[keep_c]
    c_name = [c for c, k in zip(c_name, keep_c.tolist(), strict=True) if k]
    c_group = [c for c, k in zip(c_group, keep_c.tolist(), strict=True) if k]
    c_seq, c_size, c_peer, c_kind = c_seq[keep_c], c_size[keep_c], c_peer[keep_c], c_kind[keep_c]
    keep_u = u_step >= 0
    unit, u_step, u_stream_key = unit[keep_u], u_step[keep_u], u_stream_key[keep_u]

    # stream labels and lanes (lane: what a segment's name starts with, equal across ranks)
    base_ns = ev.header.get("baseTimeNanoseconds")
    base = int(base_ns) if isinstance(base_ns, int) else 0
    t0 = float(ts.min()) if len(ts) else 0.0

    def ns(t_us: np.ndarray) -> np.ndarray:
        return np.round((t_us - t0) * 1000.0).astype(np.int64) + (base + int(round(t0 * 1000.0)))

    u_keys, u_sid = np.unique(u_stream_key, return_inverse=True)
    busy = np.bincount(u_sid, weights=dur[unit], minlength=len(u_keys))
    main_tid = None
    if device == "cpu" and not whole:
        st_ev = np.flatnonzero(cpu & (step_of_name[nm] >= 0))
        main_tid = int(np.bincount(ev.tid[st_ev]).argmax()) if len(st_ev) else None
    order = np.argsort(-busy, kind="stable")
    if main_tid is not None and main_tid in u_keys:
        order = np.concatenate([[int(np.flatnonzero(u_keys == main_tid)[0])], order[order != np.flatnonzero(u_keys == main_tid)[0]]])
    lane = [""] * len(u_keys)
    for pos, s in enumerate(order.tolist()):
        lane[s] = ("gpu" if device == "gpu" else "cpu") + (f"-{pos}" if pos else "")

    def stream_label(key: int) -> str:
        if device == "gpu":
            pid, tid = divmod(int(key), 1_000_003)
            return f"gpu{ev.pids[pid]}:stream{ev.tids[tid]}"
        comm = key >= 2**40
        return f"cpu:thread{ev.tids[int(key) - (2**40 if comm else 0)]}" + (":comm" if comm else "")

    # -- cut every compute stream at each collective's launch and end
    u_start, u_end = ts[unit], ts[unit] + dur[unit]
    c_start, c_end = ts[coll], ts[coll] + dur[coll]
    seg_parts: list[tuple[np.ndarray, ...]] = []
    launch_dst: list[np.ndarray] = []  # collective index <- segment (global segment id)
    launch_src: list[np.ndarray] = []
    wait_dst: list[np.ndarray] = []  # segment <- collective
    wait_src: list[np.ndarray] = []
    tol_us = _WAIT_TOL_NS / 1000.0
    num_seg = 0
    for s in range(len(u_keys)):
        us = np.flatnonzero(u_sid == s)
        us = us[np.lexsort((u_start[us], u_step[us]))]
        n = len(us)
        st, en, sp = u_start[us], u_end[us], u_step[us]
        cum_end = np.maximum.accumulate(en)
        new = np.ones(n, dtype=bool)
        new[1:] = sp[1:] != sp[:-1]
        # launch: the last unit of the collective's step ending before it starts
        step_lo = np.searchsorted(sp, c_step, side="left")
        step_hi = np.searchsorted(sp, c_step, side="right")
        j = _search_in_runs(cum_end, step_lo, step_hi, c_start, side="right") - 1
        ok_l = j >= step_lo
        nxt = j + 1
        cut_l = ok_l & (nxt < step_hi)
        new[nxt[cut_l]] = True
        # end: the first unit of the step starting after the collective ends
        k = _search_in_runs(st, step_lo, step_hi, c_end - 1e-3, side="left")
        ok_w = k < step_hi
        new[k[ok_w]] = True
        seg = np.cumsum(new) - 1
        first = np.flatnonzero(new)
        # waited: idle from before the collective ended until shortly after it
        kk = np.minimum(k, max(n - 1, 0))
        prev_end = np.where(kk > step_lo, cum_end[np.maximum(kk - 1, 0)], -np.inf)
        gap = st[kk] - prev_end if n else np.zeros(len(k))
        late = st[kk] - c_end if n else np.zeros(len(k))
        waited = ok_w & (prev_end <= c_end + 1e-3) & (late <= np.maximum(tol_us, _WAIT_SHARE * np.where(np.isfinite(gap), gap, 0)))
        if n:
            launch_dst.append(np.flatnonzero(ok_l))
            launch_src.append(num_seg + seg[j[ok_l]])
            wait_dst.append(num_seg + seg[kk[waited]])
            wait_src.append(np.flatnonzero(waited))
            # how many of the step's collectives were launched / had ended before each segment,
            # counted by cut position (unit index) so both sides of a cut get different names
            has_units = step_hi > step_lo
            p_l = np.where(has_units, np.where(nxt < step_hi, np.maximum(nxt, step_lo), step_hi - 0.5), np.inf)
            p_w = np.where(has_units, np.where(ok_w, k, step_hi - 0.5), np.inf)
            f_lo = np.searchsorted(sp, sp[first], side="left")
            launched = _rank_count(p_l, first, f_lo)
            finished = _rank_count(p_w, first, f_lo)
            fs = st[first]
            f_step = sp[first]
            seg_busy = np.add.reduceat(en - st, first)
            seg_span = np.maximum.reduceat(en, first) - fs
            seg_parts.append((np.full(len(first), s), f_step, fs, seg_busy if device == "gpu" else seg_span, launched, finished))
            num_seg += len(first)

    # -- assemble: segments first, then collectives
    if seg_parts:
        s_sid, s_step, s_start, s_dur, s_l, s_f = (np.concatenate(x) for x in zip(*seg_parts, strict=True))
    else:
        s_sid = s_step = s_l = s_f = np.zeros(0, np.int64)
        s_start = s_dur = np.zeros(0)
    seg_names = [f"{lane[int(a)]}-compute#{int(b)}.{int(c)}" for a, b, c in zip(s_sid, s_l, s_f, strict=True)] if num_seg else []
    n_ops = num_seg + len(coll)
    c_keys, c_sid = np.unique(c_stream_key, return_inverse=True)
    all_stream_labels = [stream_label(int(k)) for k in u_keys] + [stream_label(int(k)) for k in c_keys]
    stream_codes = np.concatenate([s_sid, len(u_keys) + c_sid]).astype(np.int32)
    op_names = seg_names + c_name
    name_labels, name_codes = np.unique(np.array(op_names, dtype=object).astype(str), return_inverse=True) if n_ops else (np.array([]), np.zeros(0, np.int64))
    grp_labels = sorted({g for g in c_group if g})
    gl = {g: i for i, g in enumerate(grp_labels)}
    group_codes = np.concatenate([np.full(num_seg, -1), np.array([gl.get(g, -1) for g in c_group], dtype=np.int64)]).astype(np.int32)
    start_ns = np.concatenate([ns(s_start), ns(c_start)]) if n_ops else np.zeros(0, np.int64)
    dur_ns = np.round(np.concatenate([s_dur, dur[coll]]) * 1000.0).astype(np.int64)
    steps_all = np.concatenate([s_step, c_step]).astype(np.int64)
    kind = np.concatenate([np.zeros(num_seg, np.int8), c_kind])

    # explicit dependencies: previous op on the stream + launch / wait links (same step only)
    dst = np.concatenate([num_seg + np.concatenate(launch_dst), np.concatenate(wait_dst)]) if launch_dst else np.zeros(0, np.int64)
    src = np.concatenate([np.concatenate(launch_src), num_seg + np.concatenate(wait_src)]) if launch_dst else np.zeros(0, np.int64)
    same = steps_all[dst] == steps_all[src] if len(dst) else np.zeros(0, bool)
    dst, src = dst[same], src[same]
    order_ops = np.lexsort((start_ns, steps_all, stream_codes))
    prev = np.full(n_ops, -1, np.int64)
    if n_ops > 1:
        sm = (stream_codes[order_ops][1:] == stream_codes[order_ops][:-1]) & (steps_all[order_ops][1:] == steps_all[order_ops][:-1])
        prev[order_ops[1:][sm]] = order_ops[:-1][sm]
    # every op gets an explicit list (the previous op on its stream and its links), so the graph
    # never has to infer stream order for part of the table
    has = np.ones(n_ops, bool)
    pd = np.flatnonzero(prev >= 0)
    all_dst = np.concatenate([dst, pd])
    all_src = np.concatenate([src, prev[pd]])
    # unique (dst, src) pairs in (dst, src) order, as one int64 key each
    key = np.unique(all_dst.astype(np.int64) * max(n_ops, 1) + all_src)
    pair = np.stack([key // max(n_ops, 1), key % max(n_ops, 1)], axis=1)
    dep_ptr = np.zeros(n_ops + 1, np.int64)
    np.cumsum(np.bincount(pair[:, 0], minlength=n_ops), out=dep_ptr[1:])
    ws = info.get("world_size") if isinstance(info.get("world_size"), int) else None
    return RankOps(
        path=where,
        rank=rank,
        world_size=ws,
        backend=info.get("backend") if isinstance(info.get("backend"), str) else None,
        pg_config=pg_config,
        host=ev.header.get("host_name"),
        base_ns=int(base_ns) if isinstance(base_ns, int) else None,
        device=device,
        num_bytes=ev.num_bytes,
        num_events=len(ts),
        step=steps_all,
        stream=stream_codes,
        streams=all_stream_labels,
        name=name_codes.astype(np.int32),
        names=[str(x) for x in name_labels],
        kind=kind,
        start_ns=start_ns.astype(np.int64),
        dur_ns=dur_ns,
        group=group_codes,
        groups=grp_labels,
        meta_seq=np.concatenate([np.full(num_seg, -1), c_seq]).astype(np.int64),
        size_bytes=np.concatenate([np.full(num_seg, -1), c_size]).astype(np.int64),
        peer=np.concatenate([np.full(num_seg, -1), c_peer]).astype(np.int32),
        dep_ptr=dep_ptr,
        dep_idx=pair[:, 1].astype(np.int64),
        has_deps=has,
        group_info=group_info,
        coll_source=source if len(coll) else "",
        warnings=warns,
    )


def _top_level(idx: np.ndarray, tid: np.ndarray, t: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The events of ``idx`` not nested in an earlier event of the same thread."""
    if len(idx) == 0:
        return idx
    o = np.lexsort((-d, t, tid))
    tid_o, t_o, e_o = tid[o], t[o], t[o] + d[o]
    t0 = t_o.min()
    span = float((e_o - t0).max()) + 1.0
    _, grp = np.unique(tid_o, return_inverse=True)
    # running max of ends within each thread: offset threads so the max never crosses them
    off = grp * span * 2.0
    run = np.maximum.accumulate(e_o - t0 + off)
    prev = np.concatenate([[-np.inf], run[:-1]])
    new_thread = np.ones(len(o), bool)
    new_thread[1:] = grp[1:] != grp[:-1]
    top = new_thread | (t_o - t0 + off >= prev)
    return np.sort(idx[o[top]])


def _search_in_runs(a: np.ndarray, lo: np.ndarray, hi: np.ndarray, v: np.ndarray, *, side: str) -> np.ndarray:
    """searchsorted of each ``v[i]`` within the sorted slice ``a[lo[i]:hi[i]]`` (absolute index)."""
    out = lo.copy()
    if len(a) == 0 or len(v) == 0:
        return out
    for a_lo, a_hi in {(int(x), int(y)) for x, y in zip(lo.tolist(), hi.tolist(), strict=True)}:  # one per step
        m = (lo == a_lo) & (hi == a_hi)
        out[m] = a_lo + np.searchsorted(a[a_lo:a_hi], v[m], side=side)
    return out


def _rank_count(p: np.ndarray, f: np.ndarray, f_lo: np.ndarray) -> np.ndarray:
    """#{p <= f} - #{p < f_lo} for each (f, f_lo)."""
    ps = np.sort(p)
    return np.searchsorted(ps, f, side="right") - np.searchsorted(ps, f_lo, side="left")


def _count_before(c_step: np.ndarray, c_t: np.ndarray, q_step: np.ndarray, q_t: np.ndarray, *, strict: bool) -> np.ndarray:
    """For each query: how many collectives of its step have ``c_t`` <= ``q_t``."""
    if len(c_step) == 0:
        return np.zeros(len(q_t), np.int64)
    o = np.lexsort((c_t, c_step))
    cs, ct = c_step[o], c_t[o]
    lo = np.searchsorted(cs, q_step, side="left")
    hi = np.searchsorted(cs, q_step, side="right")
    pos = _search_in_runs(ct, lo, hi, q_t, side="left" if strict else "right")
    return pos - lo
