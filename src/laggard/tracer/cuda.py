"""GPU timing for the tracer: CUDA events on the current stream, resolved at later step boundaries.

Never a synchronisation per op: an op's events are queried when a step ends and converted to the
local clock through an anchor event recorded (on an idle stream) when the tracer started. Imported
only when the tracer times on the GPU.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from laggard.tracer.core import _OpCtx


class _CudaOpCtx(_OpCtx):
    """GPU timing: CUDA events on the current stream, resolved later without a sync."""

    __slots__ = ("_ev0",)

    def __enter__(self) -> _CudaOpCtx:
        self._ev0 = self._t._cuda.event()
        self._ev0.record()
        return self

    def __exit__(self, *exc: object) -> bool:
        t = self._t
        ev1 = t._cuda.event()
        ev1.record()
        t._cuda.pending.append((t._step if t._in_step else None, self._code, self._mb, self._ntok, self._aux,
                                self._ev0, ev1))
        return False


class CudaTiming:
    """CUDA event pool, pending GPU ops and the anchor mapping GPU time to the local clock."""

    def __init__(self, clock: Callable[[], int]) -> None:
        import torch

        self.torch = torch
        self.free: list[Any] = []
        self.pending: deque[tuple] = deque()
        self.clock = clock
        self.anchor()

    def event(self) -> Any:
        return self.free.pop() if self.free else self.torch.cuda.Event(enable_timing=True)

    def anchor(self) -> None:
        # an event on an idle stream runs at once: its GPU time is now on the local clock
        self.torch.cuda.synchronize()
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        ev.synchronize()
        self.anchor_ns = self.clock()
        self.anchor_ev = ev

    def to_local(self, ev: Any) -> int:
        return self.anchor_ns + round(self.anchor_ev.elapsed_time(ev) * 1e6)
