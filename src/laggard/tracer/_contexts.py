"""The context managers ``Tracer.op`` and ``Tracer.step`` return (cheap: one per recorded op).

The common op (a known compute op timed on the CPU, in a step) takes the fast path: ``Tracer.op``
hands out a pooled ``_CpuOpCtx`` and reads the start time itself, so entering the block runs no
Python code, and leaving it packs one record into the page. Everything else (communication, GPU
timing, sequence lengths, between steps) goes through ``_OpCtx`` and ``Tracer._rec``. Where the
compiled module is built, the same fast path runs in C instead (``laggard/tracer/_fastop.c``, which
must keep doing what ``Tracer.op`` and ``_CpuOpCtx.__exit__`` do: tests/tracer/test_tracer_fastop.py).
"""

from __future__ import annotations

import struct
from typing import Any

from laggard.errors import LaggardError
from laggard.tracer._page import RECORD_BYTES

# the Tracer of laggard.tracer.core, which imports this module (so it is not imported back here)
Tracer = Any


class _NullCtx:
    """What ``op``/``step`` return when tracing is off: does nothing, cheaply."""

    __slots__ = ()

    def __enter__(self) -> _NullCtx:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False


_NULL = _NullCtx()


class _OpCtx:
    __slots__ = ("_t", "_code", "_mb", "_ntok", "_aux", "_start", "_excl0")

    def __init__(self, t: Tracer, code: int, mb: int, ntok: int, aux: tuple | None) -> None:
        self._t = t
        self._code = code
        self._mb = mb
        self._ntok = ntok
        self._aux = aux  # (size_bytes, seq, group, peer, side) of a communication op, or None

    def __enter__(self) -> _OpCtx:
        t = self._t
        if t._gcq:
            t._drain_gc()
        self._excl0 = t._excl_ns
        self._start = t._clock()
        return self

    def __exit__(self, *exc: object) -> bool:
        t = self._t
        end = t._clock()
        if t._gcq:
            t._drain_gc()
        start = self._start
        # time spent in ops recorded inside this one (nested ops, GC pauses) is theirs
        dur = end - start - (t._excl_ns - self._excl0)
        t._excl_ns += dur
        t._rec(self._code, self._mb, start, dur, self._ntok, self._aux)
        return False


class _CpuOpCtx:
    """The fast path of ``Tracer.op``: a compute op timed on the CPU, reused from the tracer's pool.

    ``Tracer.op`` sets every field, the start time included (it drains pending GC pauses first, as
    entering did): entering is a C call that returns None (no Python frame, ~40 ns less per op), so
    ``with tracer.op(...) as x`` binds None. The time from the ``op()`` call to the block is the
    interpreter's ``with`` set-up, tens of ns, inside the op as it always was.
    """

    __slots__ = ("_t", "_code", "_mb", "_ntok", "_start", "_excl0")

    __enter__ = type(None)  # NoneType() is None: not a descriptor, so called without self

    def __init__(self, t: Tracer) -> None:
        self._t = t

    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool:
        t = self._t
        clock, pack = t._clock, t._pack  # attributes, not methods: loaded as such, calls specialise
        end = clock()
        if t._gcq:
            t._drain_gc()
        start = self._start
        # time spent in ops recorded inside this one (nested ops, GC pauses) is theirs
        dur = end - start - (t._excl_ns - self._excl0)
        t._excl_ns += dur
        i = t._n
        if i < t._room:  # the common case, inlined
            try:
                pack(t._mv, i * RECORD_BYTES, start, dur, self._ntok, self._code, self._mb, -1)
            except struct.error:
                raise LaggardError(f"Tracer.op: microbatch and num_tokens must be integers, got "
                                   f"{self._mb!r} and {self._ntok!r}") from None
            t._n = i + 1  # count after packing: a flush that interrupts us never sees half a record
        else:
            t._rec(self._code, self._mb, start, dur, self._ntok, None)
        t._pool.append(self)  # reused by the next op() (creating objects is most of the cost)
        return False


class _StepCtx:
    __slots__ = ("_t", "_step")

    def __init__(self, t: Tracer, step: int) -> None:
        self._t = t
        self._step = step

    def __enter__(self) -> _StepCtx:
        self._t._begin_step(self._step)
        return self

    def __exit__(self, *exc: object) -> bool:
        self._t._end_step()
        return False


class _SkipCtx:
    """A step that is not recorded (``record_every``): every recording call is off meanwhile."""

    __slots__ = ("_t",)

    def __init__(self, t: Tracer) -> None:
        self._t = t

    def __enter__(self) -> _SkipCtx:
        t = self._t
        t._skip, t._plain = True, False
        return self

    def __exit__(self, *exc: object) -> bool:
        t = self._t
        t._skip, t._plain = False, t._enabled and t._cuda is None
        t._gcq.clear()  # collections during the skipped step are not this step's
        return False
