"""The ``ProfilerStep#N`` windows of one rank's events and the step each event belongs to (CPU
events: the window holding their start; GPU events: their launcher's step, else a GPU-side window,
else the CPU window holding their start), and the per-thread lookups of the call holding or
preceding a time (an event's launcher, its metadata's ``record_param_comms``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from laggard.io.kineto.events import RankEvents
from laggard.io.kineto.labels import Labels


def windows(ev: RankEvents, sel: np.ndarray, step_of_name: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def in_window(t: np.ndarray, w: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """The step of the window (``windows``) holding each time; -1 outside every window."""
    steps, lo, hi = w
    if len(steps) == 0:
        return np.full(len(t), -1, np.int64)
    i = np.searchsorted(lo, t, side="right") - 1
    ok = (i >= 0) & (t < hi[np.maximum(i, 0)])
    return np.where(ok, steps[np.maximum(i, 0)], -1)


def containing(tid_q: np.ndarray, t_q: np.ndarray, tid_c: np.ndarray, lo_c: np.ndarray,
                hi_c: np.ndarray) -> np.ndarray:
    """For each query (thread, time): the index of the latest-starting candidate on that thread
    whose [lo, hi] holds the time; -1 if none."""
    return _latest_start(tid_q, t_q, tid_c, lo_c, hi_c)


def preceding(tid_q: np.ndarray, t_q: np.ndarray, tid_c: np.ndarray, lo_c: np.ndarray) -> np.ndarray:
    """For each query (thread, time): the index of the latest candidate on that thread starting at
    or before the time; -1 if none."""
    return _latest_start(tid_q, t_q, tid_c, lo_c, None)


def _latest_start(tid_q: np.ndarray, t_q: np.ndarray, tid_c: np.ndarray, lo_c: np.ndarray,
                  hi_c: np.ndarray | None) -> np.ndarray:
    """The latest candidate on the query's thread starting at or before its time (and, with
    ``hi_c``, still running then); -1 if none."""
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
        if hi_c is not None:
            ok &= hi_c[c] >= t_q[q]
        out[q[ok]] = c[ok]
    return out


@dataclass(kw_only=True, slots=True)
class EventSteps:
    step: np.ndarray  # step of every event (-1: none or not used)
    whole: bool  # no ProfilerStep windows: the whole trace is step 0
    cpu_windows: tuple[np.ndarray, np.ndarray, np.ndarray]
    launch_tid: np.ndarray  # per GPU event: thread and time of the CPU call that launched it
    launch_ts: np.ndarray


def event_steps(ev: RankEvents, lb: Labels, cpu: np.ndarray, gpu: np.ndarray, warns: list[str]) -> EventSteps:
    """CPU events belong to the step whose window holds their start; GPU events to the step of the
    CPU call that launched them (``correlation``), else to the GPU-side ``ProfilerStep#N`` window,
    else to the CPU window holding their start."""
    ts = ev.ts_us
    cpu_w = windows(ev, cpu, lb.step_of_name)
    gpu_w = windows(ev, lb.cat_gpu_ann[ev.cat], lb.step_of_name)
    whole = len(cpu_w[0]) == 0
    if whole:
        lo_all = float(ts.min()) if len(ts) else 0.0
        hi_all = float((ts + ev.dur_us).max()) + 1.0 if len(ts) else 1.0
        cpu_w = (np.array([0]), np.array([lo_all]), np.array([hi_all]))
        warns.append(f"{ev.path}: no ProfilerStep#N annotations; the whole trace is analyzed as one step (0)")
    step = np.full(len(ts), -1, np.int64)
    step[cpu] = in_window(ts[cpu], cpu_w)
    launch_tid = np.zeros(0, np.int64)
    launch_ts = np.zeros(0)
    if gpu.any():
        g = np.flatnonzero(gpu)
        gstep, launch_tid, launch_ts = _launcher_steps(ev, lb, g, step)
        miss = gstep < 0
        if miss.any() and len(gpu_w[0]):
            gstep[miss] = in_window(ts[g[miss]], gpu_w)
            miss = gstep < 0
        if miss.any() and not whole:
            gstep[miss] = in_window(ts[g[miss]], cpu_w)
        if whole:
            gstep[:] = 0
        step[g] = gstep
    return EventSteps(step=step, whole=whole, cpu_windows=cpu_w, launch_tid=launch_tid, launch_ts=launch_ts)


def _launcher_steps(ev: RankEvents, lb: Labels, g: np.ndarray, step: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per GPU event ``g``: the step, thread and time of the runtime call that launched it."""
    rt = np.flatnonzero(lb.cat_rt[ev.cat] & (ev.corr >= 0))
    gstep = np.full(len(g), -1, np.int64)
    if not len(rt):
        return gstep, np.full(len(g), -1), np.full(len(g), np.nan)
    o = rt[np.argsort(ev.corr[rt], kind="stable")]
    j = np.minimum(np.searchsorted(ev.corr[o], ev.corr[g]), len(o) - 1)
    hit = (ev.corr[o][j] == ev.corr[g]) & (ev.corr[g] >= 0)
    gstep[hit] = step[o[j[hit]]]
    return gstep, np.where(hit, ev.tid[o[j]], -1), np.where(hit, ev.ts_us[o[j]], np.nan)
