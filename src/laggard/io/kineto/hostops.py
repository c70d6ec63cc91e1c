"""Host work a profiler trace names, as ops of a CPU rank's compute stream: Python's garbage
collections (``gc``) and the DataLoader fetching the next batch (``data-wait``), as the Tracer records
them, so the diagnosis names GC or the input pipeline, not an untraced launch delay or slow compute.

torch.profiler records each collection as a ``Python GC`` event (category ``python_function``) when
it runs with ``with_stack=True`` and ``experimental_config=_ExperimentalConfig(record_python_gc_info=True)``
(torch 2.13 and later), and every ``next()`` on a DataLoader as an ``enumerate(DataLoader)#...``
annotation. Neither is a unit of compute (``segments.work_units`` leaves the annotation and the
collate ops inside it out), so each is idle time between the thread's ops. A gap that is a noticeable
share of a step was taken out of its segment as host time, before the segment
(``laggard.io.kineto.segments``); the event goes where its gap went, so the op table shows the host
time as what it was. One between two segments keeps its time. One inside a segment's compute (a gap
too small to take out: the young generation's 0.01-0.2 ms collections) stays part of that compute and
gets no op, as the segment's time already holds it.

GPU ranks: their ops are the GPU streams' kernels; host work on the launching thread shows there as
launch gaps, and it is not made an op (no CPU stream to put it on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from laggard.io.kineto.events import RankEvents
from laggard.io.kineto.segments import Segments, Streams

GC_EVENT = "Python GC"
LOADER_PREFIX = "enumerate(DataLoader)#"
# the op names they become (the Tracer's)
GC_OP, DATA_OP = "gc", "data-wait"


@dataclass(kw_only=True, slots=True)
class HostOps:
    """The rank's host events that became ops: stream index, step, start and duration (us), name."""

    sid: np.ndarray
    step: np.ndarray
    start_us: np.ndarray
    dur_us: np.ndarray
    names: list[str]

    @property
    def num(self) -> int:
        return len(self.sid)


def _none() -> HostOps:
    z = np.zeros(0, np.int64)
    return HostOps(sid=z, step=z, start_us=np.zeros(0), dur_us=np.zeros(0), names=[])


def is_loader(name: str) -> bool:
    return name.startswith(LOADER_PREFIX)


def host_ops(ev: RankEvents, st: Streams, seg: Segments, step_of: Callable[[np.ndarray], np.ndarray], *,
             device: str, loader: np.ndarray) -> HostOps:
    """The garbage collections and DataLoader fetches of a CPU rank placed on its streams (see the
    module docstring). ``step_of``: the step of each start time (-1: outside every step window);
    ``loader``: per name, whether it is a DataLoader fetch (``labels.Labels.is_name["loader"]``)."""
    if device != "cpu":
        return _none()
    gc_code = ev.names.index(GC_EVENT) if GC_EVENT in ev.names else -1
    parts = [_placed(ev, st, seg, step_of, np.flatnonzero(ev.name == gc_code), GC_OP),
             _placed(ev, st, seg, step_of, np.flatnonzero(loader[ev.name]), DATA_OP)]
    return HostOps(sid=np.concatenate([p.sid for p in parts]), step=np.concatenate([p.step for p in parts]),
                   start_us=np.concatenate([p.start_us for p in parts]),
                   dur_us=np.concatenate([p.dur_us for p in parts]), names=[n for p in parts for n in p.names])


def _placed(ev: RankEvents, st: Streams, seg: Segments, step_of: Callable[[np.ndarray], np.ndarray],
            idx: np.ndarray, name: str) -> HostOps:
    """Events ``idx`` on the streams of their threads, where their time went (module docstring)."""
    if not len(idx):
        return _none()
    g0, g1 = ev.ts_us[idx], ev.ts_us[idx] + ev.dur_us[idx]
    s = np.searchsorted(st.keys, ev.tid[idx])
    ok = (s < len(st.keys)) & (st.keys[np.minimum(s, len(st.keys) - 1)] == ev.tid[idx])
    step = step_of(g0)
    ok &= step >= 0
    idx, g0, g1, s, step = idx[ok], g0[ok], g1[ok], s[ok], step[ok]
    start = g0.copy()
    keep = np.ones(len(idx), bool)
    for sid in np.unique(s).tolist():
        q = np.flatnonzero(s == sid)
        cut = _latest_before(seg.cut_from_us, seg.cut_sid == sid, g0[q])
        moved = cut >= 0
        moved[moved] = g0[q][moved] < seg.cut_to_us[cut[moved]]
        c, m = cut[moved], q[moved]  # in host time taken out of a segment: where that time went
        start[m] = seg.cut_at_us[c] + (g0[m] - seg.cut_from_us[c])
        g1[m] = np.minimum(g1[m], seg.cut_to_us[c])
        held = _latest_before(seg.first_us, seg.sid == sid, g0[q])
        inside = held >= 0
        inside[inside] = g0[q][inside] < seg.start_us[held[inside]] + seg.dur_us[held[inside]]
        keep[q[inside & ~moved]] = False  # in a segment's compute: its time is the segment's
    return HostOps(sid=s[keep].astype(np.int64), step=step[keep].astype(np.int64), start_us=start[keep],
                   dur_us=(g1 - g0)[keep], names=[name] * int(keep.sum()))


def _latest_before(starts: np.ndarray, mask: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per time in ``t``: the index (into ``starts``) of the latest start at or before it among
    ``mask``; -1 where none is."""
    rows = np.flatnonzero(mask)
    rows = rows[np.argsort(starts[rows], kind="stable")]
    j = np.searchsorted(starts[rows], t, side="right") - 1
    return np.where(j >= 0, rows[np.maximum(j, 0)] if len(rows) else -1, -1)


__all__ = ["DATA_OP", "GC_EVENT", "GC_OP", "LOADER_PREFIX", "HostOps", "host_ops", "is_loader"]
