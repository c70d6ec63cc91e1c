"""One rank's compute in a Kineto trace: work units, streams, and segments cut at collectives.

The work units are the GPU kernels, copies and memsets of each stream (GPU ranks), or the
top-level CPU ops of each thread (CPU-only ranks). Each stream is cut into segments at every
collective: before its launch (the collective depends on the segment that ended last before it
started) and after its end (the first segment after it depends on it when the stream sat idle
until the collective ended, i.e. was waiting for it). Segments are named by how many collectives
of the step were launched and finished before them, so the same work has the same name on every
rank. A GPU segment lasts the sum of its kernels (launch gaps removed); a CPU segment its span (the
Python between its ops is its work) less the idle gaps inside it that are a noticeable share of a
step (``HOST_GAP_SHARE``) or that cut a crumb of work off its start or end (``_CRUMB_SHARE``: a
batch's slicing before a sleep, autograd's seed of the loss's gradient after one): those are host
time no op covers (a stall, a sleep, a collection), and the segment starts after them, so that the
replay's gap model (``laggard.engine.gaps``) sees them as the rank's untraced host time, as it sees
the gaps between the Tracer's ops, instead of slower compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from laggard.io.kineto.events import RankEvents

# a stream "waited" for a collective when it sat idle until shortly after the collective ended
_WAIT_TOL_NS = 100_000
_WAIT_SHARE = 0.25
_COMM_STREAM = 2**40  # stream key offset of a CPU thread's collectives (beside its compute)
_PID_MUL = 1_000_003  # GPU stream key: pid * _PID_MUL + tid
# what a segment mostly does, read from its units' names: the training phase (pipeline layouts
# name segments by it, so the same phase on different stages is one op type, as in the tracer)
PHASES = ("", "forward", "backward", "optimizer", "glue")
_GLUE = PHASES.index("glue")
# pipeline stages: a segment under this share of its stream's typical segment of the same phase is
# glue between two transfers (a receive buffer's allocation, bookkeeping), not a unit of the
# phase's work; 2% sits far below any real microbatch's compute and far above allocation calls
_GLUE_SHARE = 0.02
# ... or made of under this share of the ops (CPU) or kernels (GPU) of its phase's typical segment:
# descheduling stretches a glue piece's time, not its op count. On a busy 2-core host a one-op glue
# piece (0.01 ms) between a backward and the next receive was descheduled for 3.6 ms, over 2% of a
# pass, and read as a forward of its own (a stage with 49 forwards for 48 microbatches, their
# numbers dropped); the real passes it sat among are 14-56 top-level ops. A phase whose typical
# segment has under 10 units never meets this rule
_GLUE_UNITS_SHARE = 0.1
# CPU ranks: an idle gap inside a segment over this share of the stream's median step is host time,
# not the segment's compute. Real 2-core gloo jobs (4 ranks on 2 cores): descheduling leaves gaps of
# at most 16 ms (4.4% of a 370 ms step) in clean jobs, with a median op gap of 5 us; the host stalls
# the corpus injects are 33 ms and up (10%+). 5% keeps the descheduling inside the compute it
# interrupted (the Tracer counts it there too) and takes every stall out.
HOST_GAP_SHARE = 0.05
# CPU ranks: an idle gap over ``_CRUMB_GAP_SHARE`` of the median step is host time too when it cuts a
# crumb off a segment's end: the units before it (or after it) hold under ``_CRUMB_SHARE`` of the
# segment's busy time. A pass often begins with a few tiny ops (the batch's slicing) and ends with
# others (the loss's item(), autograd's ones_like for the loss's gradient, named like forward work)
# with the host's untraced time between them and the layers: without this rule that host time is
# counted as the pass's compute, and a stage whose host waits sit there reads as heavy. 2%, as glue
# (``_GLUE_SHARE``): far below a real pass's work.
_CRUMB_SHARE = 0.02
# 1%: the Python between a pass's first ops is 3-5 us a gap, and real clean 2-core pipelines (3-4
# ranks) have 2-4.5 ms per step of such gaps near a segment's ends, 99% of them under 0.25 ms; taken
# out as host time they tipped clean jobs over the healthy threshold. The launch delays the corpus
# injects are 1.4% of a step and up (5.8 ms of 410 ms).
_CRUMB_GAP_SHARE = 0.01
# ... and only where such gaps recur, in at least half the stream's steps: the clean jobs' were in 1-5
# of 16 steps (descheduling), and taken out as host time they made the other ranks' host time as
# noisy as a bursty stall's rank, and a stall every few steps no longer stood out as one rank's
_CRUMB_STEPS_SHARE = 0.5


def unit_phases(names: list[str]) -> np.ndarray:
    """Per event name (plus a trailing 'none'): 2 backward (autograd engine, *Backward kernels),
    3 optimizer (``Optimizer.step#...``), 1 forward (any other op), as int8 codes into PHASES."""
    def phase(s: str) -> int:
        if s.startswith("autograd::engine") or "Backward" in s or "backward" in s:
            return 2
        if s.startswith(("Optimizer.", "optimizer")):
            return 3
        return 1
    return np.array([phase(s) for s in names] + [0], dtype=np.int8)


@dataclass(kw_only=True, slots=True)
class Streams:
    """The compute units of a rank and the streams (keys) they and the collectives run on."""

    unit: np.ndarray  # event indices of the work units
    u_key: np.ndarray  # stream key of each unit
    c_key: np.ndarray  # stream key of each collective
    keys: np.ndarray  # the units' distinct stream keys (sorted)
    sid: np.ndarray  # each unit's index into keys
    lane: list[str]  # per stream: what its segments' names start with (equal across ranks)


@dataclass(kw_only=True, slots=True)
class Segments:
    """The segments of every compute stream and the links between them and the collectives."""

    sid: np.ndarray  # stream index
    step: np.ndarray
    start_us: np.ndarray
    dur_us: np.ndarray
    phase: np.ndarray  # int8 code into PHASES: what most of the segment's busy time is
    launched: np.ndarray  # collectives of the step launched before the segment
    finished: np.ndarray  # ... and finished before it
    launch_dst: np.ndarray  # collective index <- segment index (the collective's launch)
    launch_src: np.ndarray
    wait_dst: np.ndarray  # segment index <- collective index (the segment waited for it)
    wait_src: np.ndarray
    # CPU streams: each segment's first unit's start (start_us is after the host time taken out of it)
    first_us: np.ndarray
    # ... and each idle gap taken out as host time: its stream, where it was, and where it went
    # (``cut_at_us``: its place in the host time now before its segment, gaps in their order)
    cut_sid: np.ndarray
    cut_from_us: np.ndarray
    cut_to_us: np.ndarray
    cut_at_us: np.ndarray

    @property
    def num(self) -> int:
        return len(self.sid)

    def names(self, lane: list[str]) -> list[str]:
        return [f"{lane[int(a)]}-compute#{int(b)}.{int(c)}"
                for a, b, c in zip(self.sid, self.launched, self.finished, strict=True)]


def work_units(ev: RankEvents, *, device: str, cpu: np.ndarray, gpu: np.ndarray, is_wrapper: np.ndarray,
               is_nccl_kernel: np.ndarray, is_loader: np.ndarray,
               coll: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unit event indices, their stream keys, the collectives' stream keys). A CPU rank's DataLoader
    fetch (``is_loader``: its annotation, and the collate ops inside it) is no unit of compute: it is
    host work that becomes a ``data-wait`` op (``laggard.io.kineto.hostops``)."""
    nm = ev.name
    if device == "gpu":
        unit = np.flatnonzero(gpu & ~is_nccl_kernel[nm])
        u_key = ev.pid[unit].astype(np.int64) * _PID_MUL + ev.tid[unit]
        c_key = ev.pid[coll].astype(np.int64) * _PID_MUL + ev.tid[coll]
        return unit, u_key, c_key
    cand = np.flatnonzero(cpu & ~is_wrapper[nm] & ~np.isin(np.arange(len(ev.ts_us)), coll))
    unit = top_level(cand, ev.tid[cand], ev.ts_us[cand], ev.dur_us[cand])
    unit = unit[~is_loader[nm[unit]]]
    u_key = ev.tid[unit].astype(np.int64)
    c_key = ev.tid[coll].astype(np.int64)
    # a collective on a thread that also runs compute gets its own stream beside it
    c_key = np.where(np.isin(c_key, u_key), c_key + _COMM_STREAM, c_key)
    return unit, u_key, c_key


def streams(ev: RankEvents, unit: np.ndarray, u_key: np.ndarray, c_key: np.ndarray, *, device: str,
            main_tid: int | None) -> Streams:
    """Lanes: streams ordered by busy time (the main thread first on CPU ranks)."""
    keys, sid = np.unique(u_key, return_inverse=True)
    busy = np.bincount(sid, weights=ev.dur_us[unit], minlength=len(keys))
    order = np.argsort(-busy, kind="stable")
    if main_tid is not None and main_tid in keys:
        m = int(np.flatnonzero(keys == main_tid)[0])
        order = np.concatenate([[m], order[order != m]])
    lane = [""] * len(keys)
    for pos, s in enumerate(order.tolist()):
        lane[s] = ("gpu" if device == "gpu" else "cpu") + (f"-{pos}" if pos else "")
    return Streams(unit=unit, u_key=u_key, c_key=c_key, keys=keys, sid=sid, lane=lane)


def stream_label(ev: RankEvents, key: int, device: str) -> str:
    if device == "gpu":
        pid, tid = divmod(int(key), _PID_MUL)
        return f"gpu{ev.pids[pid]}:stream{ev.tids[tid]}"
    comm = key >= _COMM_STREAM
    return f"cpu:thread{ev.tids[int(key) - (_COMM_STREAM if comm else 0)]}" + (":comm" if comm else "")


def cut_segments(ev: RankEvents, st: Streams, u_step: np.ndarray, coll: np.ndarray, c_step: np.ndarray, *,
                 device: str, u_phase: np.ndarray, split_phases: bool = False) -> Segments:
    """Cut every compute stream at each collective's launch and end (see the module docstring).

    ``split_phases`` (pipeline stages): also cut where the training phase changes. A stage runs one
    microbatch's backward and another's forward with no transfer between them; cut there, the
    segments are the same units of work (one microbatch's forward or backward) on every stage, so
    each phase's ideal is the mean over the stages of like with like. Segments too short to be a
    microbatch's work (see ``_GLUE_SHARE``) are phase ``glue``."""
    ts, dur = ev.ts_us, ev.dur_us
    unit = st.unit
    u_start, u_end = ts[unit], ts[unit] + dur[unit]
    c_start, c_end = ts[coll], ts[coll] + dur[coll]
    parts: list[tuple[np.ndarray, ...]] = []
    links: list[tuple[np.ndarray, ...]] = []
    cuts: list[tuple[np.ndarray, ...]] = []
    num_seg = 0
    for s in range(len(st.keys)):
        us = np.flatnonzero(st.sid == s)
        us = us[np.lexsort((u_start[us], u_step[us]))]
        if not len(us):
            continue
        part, link, cut = _cut_stream(u_start[us], u_end[us], u_step[us], c_start, c_end, c_step, s, num_seg,
                                      gpu=device == "gpu", phase=u_phase[us], split_phases=split_phases)
        parts.append(part)
        links.append(link)
        cuts.append(cut)
        num_seg += len(part[0])
    if parts:
        sid, step, start, d, launched, finished, phase, first = (np.concatenate(x) for x in zip(*parts, strict=True))
        ld, ls, wd, ws = (np.concatenate(x) for x in zip(*links, strict=True))
        c_sid, c_from, c_to, c_at = (np.concatenate(x) for x in zip(*cuts, strict=True))
    else:
        sid = step = launched = finished = phase = c_sid = np.zeros(0, np.int64)
        start = d = first = c_from = c_to = c_at = np.zeros(0)
        ld = ls = wd = ws = np.zeros(0, np.int64)
    return Segments(sid=sid, step=step, start_us=start, dur_us=d, launched=launched, finished=finished,
                    phase=phase.astype(np.int8),
                    launch_dst=ld, launch_src=ls, wait_dst=wd, wait_src=ws, first_us=first,
                    cut_sid=c_sid.astype(np.int64), cut_from_us=c_from, cut_to_us=c_to, cut_at_us=c_at)


def _cut_stream(st: np.ndarray, en: np.ndarray, sp: np.ndarray, c_start: np.ndarray, c_end: np.ndarray,
                c_step: np.ndarray, s: int, num_seg: int, *, gpu: bool, phase: np.ndarray,
                split_phases: bool = False) -> tuple[tuple[np.ndarray, ...], ...]:
    """One stream's units (sorted by step, start) -> its segments, links (global segment ids) and the
    idle gaps taken out of its segments as host time (``Segments.cut_*``)."""
    n = len(st)
    tol_us = _WAIT_TOL_NS / 1000.0
    cum_end = np.maximum.accumulate(en)
    new = np.ones(n, dtype=bool)
    new[1:] = sp[1:] != sp[:-1]
    if split_phases:
        new[1:] |= phase[1:] != phase[:-1]
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
    gap = st[kk] - prev_end
    late = st[kk] - c_end
    waited = (ok_w & (prev_end <= c_end + 1e-3)
              & (late <= np.maximum(tol_us, _WAIT_SHARE * np.where(np.isfinite(gap), gap, 0))))
    link = (np.flatnonzero(ok_l), num_seg + seg[j[ok_l]], num_seg + seg[kk[waited]], np.flatnonzero(waited))
    # how many of the step's collectives were launched / had ended before each segment,
    # counted by cut position (unit index) so both sides of a cut get different names
    has_units = step_hi > step_lo
    p_l = np.where(has_units, np.where(nxt < step_hi, np.maximum(nxt, step_lo), step_hi - 0.5), np.inf)
    p_w = np.where(has_units, np.where(ok_w, k, step_hi - 0.5), np.inf)
    f_lo = np.searchsorted(sp, sp[first], side="left")
    launched = _rank_count(p_l, first, f_lo)
    finished = _rank_count(p_w, first, f_lo)
    fs = first_us = st[first]
    unit_busy = en - st
    seg_busy = np.add.reduceat(unit_busy, first)
    seg_span = np.maximum.reduceat(en, first) - fs
    cu = np.zeros(0, np.int64)
    gaps = at = np.zeros(0)
    if not gpu:  # host time inside a CPU segment: before it (see the module docstring)
        gaps = _host_gaps(st, cum_end, sp, new, seg, first, unit_busy, seg_busy)
        lost = np.add.reduceat(gaps, first)
        cu = np.flatnonzero(gaps > 0)
        done = np.cumsum(gaps) - gaps  # the host time taken out before each unit, the stream over
        at = fs[seg[cu]] + done[cu] - done[first][seg[cu]]
        fs, seg_span = fs + lost, seg_span - lost
    # the phase holding most of the segment's busy time
    busy = np.stack([np.add.reduceat(unit_busy * (phase == k), first) for k in range(len(PHASES))], axis=1)
    seg_phase = np.argmax(busy, axis=1)
    if split_phases:
        seg_phase = _glue(_tail(seg_phase, sp[first], fs), seg_busy, np.diff(np.r_[first, n]))
    part = (np.full(len(first), s), sp[first], fs, seg_busy if gpu else seg_span, launched, finished, seg_phase,
            first_us)
    cut = (np.full(len(cu), s), st[cu] - gaps[cu], st[cu], at)
    return part, link, cut


def microbatches(seg: Segments, *, merge_runs: bool = False) -> np.ndarray:
    """Per segment, its microbatch (-1: none): the k-th forward of a (stream, step) and its k-th
    backward are microbatch k, where the two counts agree. One forward and one backward per
    microbatch, each in microbatch order, is what gradient accumulation (F0 B0 F1 B1 ...) and a 1F1B
    stage both run. ``merge_runs`` (ranks without transfers): segments of one phase in a row are one
    pass (DDP cuts the last backward at its gradient all-reduces); a 1F1B stage runs backwards in a
    row, so there each segment is one. A (stream, step) whose counts differ gets none, rather than a
    wrong pairing."""
    fwd, bwd = PHASES.index("forward"), PHASES.index("backward")
    rows = np.flatnonzero((seg.phase == fwd) | (seg.phase == bwd))
    out = np.full(seg.num, -1, np.int32)
    if not len(rows):
        return out
    cell = seg.sid[rows].astype(np.int64) * (int(seg.step.max()) + 1) + seg.step[rows]  # (stream, step)
    order = np.lexsort((seg.start_us[rows], cell))
    c, is_b = cell[order], (seg.phase[rows][order] == bwd).astype(np.int64)
    new = np.r_[True, c[1:] != c[:-1]]
    new |= np.r_[True, is_b[1:] != is_b[:-1]] if merge_runs else True
    unit = np.cumsum(new) - 1  # each row's pass
    key = (c * 2 + is_b)[new]  # per pass: (cell, phase), in start order within the cell
    k_order = np.argsort(key, kind="stable")
    ks = key[k_order]
    first = np.r_[True, ks[1:] != ks[:-1]]
    ordinal = np.empty(len(key), np.int64)
    ordinal[k_order] = np.arange(len(ks)) - np.maximum.accumulate(np.where(first, np.arange(len(ks)), 0))
    _, ci = np.unique(key // 2, return_inverse=True)
    pb = key % 2
    agree = (np.bincount(ci, weights=1 - pb) == np.bincount(ci, weights=pb))[ci]  # per pass
    ok = agree[unit]
    out[rows[order[ok]]] = ordinal[unit[ok]]
    return out


def _host_gaps(st: np.ndarray, cum_end: np.ndarray, sp: np.ndarray, new: np.ndarray, seg: np.ndarray,
               first: np.ndarray, busy: np.ndarray, seg_busy: np.ndarray) -> np.ndarray:
    """Per unit: the idle gap before it inside its segment when over ``HOST_GAP_SHARE`` of the
    stream's median step (first unit to last end), or when it cuts a crumb off the segment's start or
    end in most of the stream's steps (``_CRUMB_SHARE``, ``_CRUMB_STEPS_SHARE``), else 0. ``seg``,
    ``first``: each unit's segment and each segment's first unit; ``busy``, ``seg_busy``: the units'
    and the segments' busy time."""
    gap = np.zeros(len(st))
    gap[1:] = st[1:] - cum_end[:-1]
    gap[new] = 0.0
    if not (gap > 0).any():
        return gap
    bounds = np.flatnonzero(np.r_[True, sp[1:] != sp[:-1]])
    step_span = np.maximum.reduceat(cum_end, bounds) - st[bounds]
    step_s = float(np.median(step_span))
    thr = HOST_GAP_SHARE * step_s
    # each unit's segment's busy time before it and from it on
    done = np.cumsum(busy) - busy
    before = done - done[first][seg]
    total = seg_busy[seg]
    crumb = (gap > _CRUMB_GAP_SHARE * step_s) & (np.minimum(before, total - before) < _CRUMB_SHARE * total)
    # ... where they recur: in most of the stream's steps (a delay before every pass), not now and
    # then (a descheduled rank, whose pause stays in the compute it interrupted, as the Tracer has it)
    steps_with = len(np.unique(sp[crumb]))
    if steps_with < _CRUMB_STEPS_SHARE * len(bounds):
        crumb[:] = False
    return np.where((gap > thr) | crumb, gap, 0.0)


def _tail(seg_phase: np.ndarray, seg_step: np.ndarray, seg_start: np.ndarray) -> np.ndarray:
    """Forward-looking segments after a step's last backward segment are the optimizer's (gradient
    clipping, norms, the update between the gradient collectives): phase ``optimizer``."""
    fwd, bwd = PHASES.index("forward"), PHASES.index("backward")
    b = seg_phase == bwd
    if not b.any():
        return seg_phase
    steps, inv = np.unique(seg_step, return_inverse=True)
    last_b = np.full(len(steps), np.inf)  # steps without a backward segment keep their forward
    last_b[np.unique(inv[b])] = -np.inf
    np.maximum.at(last_b, inv[b], seg_start[b])
    out = seg_phase.copy()
    out[(seg_phase == fwd) & (seg_start > last_b[inv])] = PHASES.index("optimizer")
    return out


def _glue(seg_phase: np.ndarray, seg_busy: np.ndarray, seg_units: np.ndarray) -> np.ndarray:
    """Forward and backward segments under ``_GLUE_SHARE`` of their phase's typical segment (the
    busy-weighted median: the size of the segments holding the phase's time, each weighing at most
    as much as the 90th percentile, so that one stalled segment, 142 ms among 2 ms forwards on a
    busy host, does not become the typical one and make every real forward glue), or with under
    ``_GLUE_UNITS_SHARE`` of the units of the phase's other segments (their median) -> glue."""
    out = seg_phase.copy()
    for k in (PHASES.index("forward"), PHASES.index("backward")):
        m = seg_phase == k
        if not m.any() or seg_busy[m].sum() <= 0:
            continue
        b = np.sort(seg_busy[m])
        w = np.minimum(b, b[int(0.9 * (len(b) - 1))])
        if w.sum() <= 0:
            w = b
        typical = float(b[np.searchsorted(np.cumsum(w), 0.5 * w.sum())])
        small = m & (seg_busy < _GLUE_SHARE * typical)
        if (m & ~small).any():
            small |= m & (seg_units < _GLUE_UNITS_SHARE * np.median(seg_units[m & ~small]))
        out[small] = _GLUE
    return out


def top_level(idx: np.ndarray, tid: np.ndarray, t: np.ndarray, d: np.ndarray) -> np.ndarray:
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
