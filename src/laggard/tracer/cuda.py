"""GPU timing for the tracer: CUDA events on the current stream, dated through per-step anchors.

The timing model (docs/DESIGN.md, "Tracer: GPU timing and clock alignment"):

- Every op records two CUDA events on the current stream, never a synchronisation per op; its
  events are queried at later step boundaries and resolved once they have completed.
- GPU event times are only known relative to each other (``elapsed_time``, float32 ms: about
  7 significant digits). Dating every op from one anchor taken at start-up would cost 0.25 ms of
  precision after an hour and 4-8 ms after a day, and would let the GPU clock drift from the host
  clock unchecked. So at every step boundary the tracer takes a new **anchor**: an event recorded
  on a private side stream that nothing else uses, so it runs as soon as the GPU sees it. The host
  reads its clock before recording it and polls ``query()`` until it has run (a bounded spin,
  microseconds when the stream is idle): the event ran inside that bracket, whose midpoint is the
  anchor's host time and whose half width is its error bound. Each op is dated from the anchor
  current when it was recorded, so ``elapsed_time`` never spans more than a step (plus how far the
  host runs ahead of the GPU).
- When the side stream is not idle (``CUDA_DEVICE_MAX_CONNECTIONS=1`` serialises all streams onto
  one hardware queue) the spin gives up and the previous anchor stays in use; after
  ``max_stale_steps`` steps without a new one the tracer blocks once on an anchor event (a sync
  bounded by the work queued ahead of it) and takes a fresh bracket right after.

Imported only when the tracer times on the GPU.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from laggard.tracer._contexts import _OpCtx


@dataclass(kw_only=True, slots=True)
class AnchorConfig:
    """When and how the tracer re-anchors CUDA event times to the host clock."""

    # an event on an idle stream runs within ~5-20 us of its record call; 200 us covers a busy host
    # (a poll that was descheduled) while costing < 0.1% of a 0.2 s step when the stream is not idle
    spin_budget_ns: int = 200_000
    # a bracket this narrow is as good as launch + poll latency allow: stop trying for a better one
    good_error_ns: int = 10_000
    # brackets per step boundary when the first one is wide (the host was descheduled mid-poll)
    max_attempts: int = 3
    # steps without a new anchor before blocking on one: 8 steps of 10 s still keep elapsed_time
    # spans under 2^17 ms, where float32 rounds to < 8 us
    max_stale_steps: int = 8
    # False: one anchor at start-up for the whole run (the old scheme; kept to measure what it costs)
    reanchor: bool = True


ANCHOR = AnchorConfig()


@dataclass(slots=True)
class Anchor:
    """A CUDA event whose run time on the host's clock is known: ``host_ns`` +- ``error_ns``."""

    event: Any
    host_ns: int
    error_ns: int


def _stream_recorder(torch: Any) -> Callable[[Any], None]:
    """``record(event)`` on the current stream. ``Event.record()`` builds a Python ``Stream`` for the
    current stream on every call (``torch.cuda.current_stream()``): most of a record's host time, and
    a traced op records two. Here the current stream is read as its raw handle and its ``Stream`` kept
    per handle (torch's streams come from pools that live as long as the process), and the record is
    the C++ one. Where this torch lacks either call, ``Event.record()`` itself."""
    c = getattr(torch, "_C", None)
    raw = getattr(c, "_cuda_getCurrentRawStream", None)
    base = getattr(c, "_CudaEventBase", None)
    base_record = getattr(base, "record", None)
    if raw is None or base_record is None:
        return lambda ev: ev.record()
    device = torch.cuda.current_device()
    streams: dict[int, Any] = {}
    current_stream = torch.cuda.current_stream

    def record(ev: Any) -> None:
        handle = raw(device)
        stream = streams.get(handle)
        if stream is None:
            stream = streams[handle] = current_stream(device)
        base_record(ev, stream)

    return record


class _CudaOpCtx(_OpCtx):
    """GPU timing: CUDA events on the current stream, resolved later without a sync."""

    __slots__ = ("_ev0",)

    def __enter__(self) -> _CudaOpCtx:
        self._ev0 = self._t._cuda.record()
        return self

    def __exit__(self, *exc: object) -> bool:
        t = self._t
        ev1 = t._cuda.record()
        t._cuda.add(t._step if t._in_step else None, self._code, self._mb, self._ntok, self._aux, self._ev0, ev1)
        return False


class CudaTiming:
    """CUDA event pool, pending GPU ops and the anchors mapping GPU time to the local clock."""

    def __init__(self, clock: Callable[[], int], config: AnchorConfig | None = None) -> None:
        import torch

        self.torch = torch
        self.cfg = ANCHOR if config is None else config
        self.free: list[Any] = []
        self.pending: deque[tuple] = deque()
        self.clock = clock
        self.num_anchors = 0
        self.num_stale_steps = 0  # step boundaries that kept the previous anchor
        self.num_blocking_anchors = 0
        self.max_anchor_error_ns = 0
        self._stale = 0
        # anchors only: an event on a stream with no work queued runs as soon as the GPU sees it
        self._record = _stream_recorder(torch)
        self.side = torch.cuda.Stream()
        torch.cuda.synchronize()
        self.anchor = self._bracket() or self._blocking_anchor()
        self._use(self.anchor)

    def event(self) -> Any:
        return self.free.pop() if self.free else self.torch.cuda.Event(enable_timing=True)

    def record(self) -> Any:
        """A pooled event, recorded now on the current stream (what ``Event.record()`` does, see
        ``_stream_recorder``)."""
        ev = self.free.pop() if self.free else self.torch.cuda.Event(enable_timing=True)
        self._record(ev)
        return ev

    def add(self, step: int | None, code: int, mb: int, ntok: int, aux: tuple | None, ev0: Any, ev1: Any) -> None:
        """An op timed by events ``ev0``..``ev1``: dated from the anchor current now, once ``ev1`` has run."""
        self.pending.append((step, code, mb, ntok, aux, ev0, ev1, self.anchor))

    def completed(self) -> Iterator[tuple[int | None, tuple]]:
        """Pop the ops whose events have run, in record order: (step, (code, mb, start_ns, dur_ns, ntok, aux))."""
        pending = self.pending
        while pending and pending[0][6].query():
            step, code, mb, ntok, aux, ev0, ev1, a = pending.popleft()
            start = a.host_ns + round(a.event.elapsed_time(ev0) * 1e6)
            dur = round(ev0.elapsed_time(ev1) * 1e6)
            self.free += [ev0, ev1]
            yield step, (code, mb, start, dur, ntok, aux)

    def step_boundary(self) -> None:
        """A new step starts: take a new anchor (a bounded spin; a bounded sync when long overdue)."""
        if not self.cfg.reanchor:
            return
        a = self._bracket()
        if a is None:
            self._stale += 1
            self.num_stale_steps += 1
            if self._stale < self.cfg.max_stale_steps:
                return
            a = self._blocking_anchor()
        self._use(a)

    def stats(self) -> dict[str, int]:
        return {"cuda_num_anchors": self.num_anchors, "cuda_num_stale_steps": self.num_stale_steps,
                "cuda_num_blocking_anchors": self.num_blocking_anchors,
                "cuda_max_anchor_error_ns": self.max_anchor_error_ns}

    def _use(self, a: Anchor) -> None:
        self.anchor = a
        self._stale = 0
        self.num_anchors += 1
        self.max_anchor_error_ns = max(self.max_anchor_error_ns, a.error_ns)

    def _bracket(self) -> Anchor | None:
        """Record an event on the side stream and poll until it has run; None if it does not in time."""
        cfg, clock = self.cfg, self.clock
        best: Anchor | None = None
        for _ in range(cfg.max_attempts):
            ev = self.torch.cuda.Event(enable_timing=True)
            t0 = clock()
            ev.record(self.side)
            deadline = t0 + cfg.spin_budget_ns
            while not ev.query():
                if clock() > deadline:
                    return best  # the side stream is queued behind other work: do not pile up more
            t1 = clock()
            a = Anchor(event=ev, host_ns=(t0 + t1) // 2, error_ns=(t1 - t0 + 1) // 2)
            if best is None or a.error_ns < best.error_ns:
                best = a
            if a.error_ns <= cfg.good_error_ns:
                break
        return best

    def _blocking_anchor(self) -> Anchor:
        """Wait for an anchor event (bounded by the work queued ahead of it), then bracket a fresh one."""
        self.num_blocking_anchors += 1
        ev = self.torch.cuda.Event(enable_timing=True)
        t0 = self.clock()
        ev.record(self.side)
        ev.synchronize()
        t1 = self.clock()
        waited = Anchor(event=ev, host_ns=(t0 + t1) // 2, error_ns=(t1 - t0 + 1) // 2)
        fresh = self._bracket()  # what was queued ahead has drained: this one runs at once
        return fresh if fresh is not None and fresh.error_ns < waited.error_ns else waited
