"""Garbage-collection pauses as ops of the tracer: seen through ``gc.callbacks`` (or recorded by
someone else's hook), queued where they happen and written at the next op or step boundary."""

from __future__ import annotations

import gc
from typing import Any


class GcMixin:
    """Part of ``Tracer``: the GC state lives on the tracer (``_gcq`` is created in its
    ``__init__`` before anything can collect)."""

    _gcq: Any
    _clock: Any
    _in_step: bool

    def _start_gc(self, *, record_gc: bool, gc_min_us: float, code: int) -> None:
        self._gc_code = code
        self._gc_t0 = 0
        self._gc_min_ns = int(gc_min_us * 1000)
        self._gc_in_step = False
        self._record_gc = record_gc
        if record_gc:
            gc.callbacks.append(self._on_gc)

    def _stop_gc(self) -> None:
        if self._record_gc and self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def record_gc(self, start_ns: int, dur_ns: int, generation: int = 2) -> None:
        """Record a garbage collection timed by someone else (e.g. a planned-GC hook).

        With ``record_gc=True`` (default) the tracer already sees every collection through
        ``gc.callbacks``; use this only for collections it cannot see, or trace with record_gc=False.
        """
        self.record("gc", start_ns, dur_ns, kind="other")  # type: ignore[attr-defined]

    def _drain_gc(self) -> None:
        q = self._gcq
        while q:
            t0, dur, _gen = q.popleft()
            if dur >= self._gc_min_ns:
                self._rec(self._gc_code, -1, t0, dur, -1, self._cpu_aux())  # type: ignore[attr-defined]
                self._excl_ns += dur  # type: ignore[has-type]
                self._gc_in_step = self._in_step

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        # may run in any thread and in the middle of a record: only queue it (deque appends are atomic)
        if phase == "start":
            self._gc_t0 = self._clock()
        else:
            self._gcq.append((self._gc_t0, self._clock() - self._gc_t0, info.get("generation", -1)))

    def _end_step_gc(self) -> None:
        """At a step's end: its pending pauses, or a zero-length gc op when it had none. GC is a
        cost of every step; ideal GC (the mean per gc op) is then that cost spread evenly over
        ranks and steps, and pauses that hit some ranks only show as straggling (S_t of gc above 1)."""
        if self._gcq:
            self._drain_gc()
        if self._record_gc and not self._gc_in_step:
            self._rec(self._gc_code, -1, self._clock(), 0, -1, self._cpu_aux())  # type: ignore[attr-defined]
        self._gc_in_step = False
