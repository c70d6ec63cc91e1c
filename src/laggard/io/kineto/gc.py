"""Python's garbage collections in a profiler trace, as ``gc`` ops of the rank's compute stream.

torch.profiler records each collection as a ``Python GC`` event (category ``python_function``) when
it runs with ``with_stack=True`` and ``experimental_config=_ExperimentalConfig(record_python_gc_info=True)``
(torch 2.13 and later). A collection runs between the Python calls of its thread: on a CPU rank it
is an idle gap between the thread's ops. A gap that is a noticeable share of a step was taken out of
its segment as host time, before the segment (``laggard.io.kineto.segments``); the collection goes
where its gap went, so the op table shows the host time as the collection it was, as the Tracer's
``gc`` ops do, and the diagnosis names GC, not an untraced launch delay. A collection between two
segments keeps its time. One inside a segment's compute (a gap too small to take out: the young
generation's 0.01-0.2 ms collections) stays part of that compute and gets no op, as the segment's
time already holds it.

GPU ranks: their ops are the GPU streams' kernels; a collection on the launching thread shows there
as launch gaps, and it is not made an op (no CPU stream to put it on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from laggard.io.kineto.events import RankEvents
from laggard.io.kineto.segments import Segments, Streams

GC_EVENT = "Python GC"


@dataclass(kw_only=True, slots=True)
class Collections:
    """The rank's collections that became ops: stream index, step, start and duration (us)."""

    sid: np.ndarray
    step: np.ndarray
    start_us: np.ndarray
    dur_us: np.ndarray

    @property
    def num(self) -> int:
        return len(self.sid)


def _none() -> Collections:
    z = np.zeros(0, np.int64)
    return Collections(sid=z, step=z, start_us=np.zeros(0), dur_us=np.zeros(0))


def collections(ev: RankEvents, st: Streams, seg: Segments, step_of: Callable[[np.ndarray], np.ndarray], *,
                device: str) -> Collections:
    """The ``Python GC`` events of a CPU rank placed on its streams (see the module docstring).
    ``step_of``: the step of each of these start times (-1: outside every step window)."""
    if device != "cpu" or GC_EVENT not in ev.names:
        return _none()
    idx = np.flatnonzero(ev.name == ev.names.index(GC_EVENT))
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
    return Collections(sid=s[keep].astype(np.int64), step=step[keep].astype(np.int64), start_us=start[keep],
                       dur_us=(g1 - g0)[keep])


def _latest_before(starts: np.ndarray, mask: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per time in ``t``: the index (into ``starts``) of the latest start at or before it among
    ``mask``; -1 where none is."""
    rows = np.flatnonzero(mask)
    rows = rows[np.argsort(starts[rows], kind="stable")]
    j = np.searchsorted(starts[rows], t, side="right") - 1
    return np.where(j >= 0, rows[np.maximum(j, 0)] if len(rows) else -1, -1)


__all__ = ["GC_EVENT", "Collections", "collections"]
