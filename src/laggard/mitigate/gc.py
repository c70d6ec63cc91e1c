"""Planned garbage collection: every rank collects at the same step, never one rank alone.

Python's automatic collector starts whenever a rank's allocation counters cross a threshold, so
ranks pause at different moments and every collective waits for the one that paused. ``PlannedGC``
turns automatic collection off and collects on all ranks together:

* ``interval_steps=N``: every N steps (no communication needed: all ranks count the same steps);
* ``adaptive=True``: when *any* rank's generation-0 count or RSS growth since its last collection
  passes a threshold; the ranks agree with one tiny all-reduce (MAX of three integers) per check;
* a hard memory guard (``max_rss_bytes``) that forces a collection on all ranks at the next check;
* ``gc.freeze()`` after start-up (``freeze_after_steps``) so long-lived objects (model, optimizer,
  dataset indices) are never traversed again.

Each collection is timed (``start_ns`` on ``clock_ns``, by default ``time.perf_counter_ns``, the
tracer's default local clock) and handed to ``on_collect(start_ns, dur_ns, generation)``. A
``laggard.tracer.Tracer`` with ``record_gc=True`` (its default) already records every collection,
planned ones included, through ``gc.callbacks``; with ``record_gc=False`` pass
``on_collect=tracer.record_gc, clock_ns=tracer.clock_ns`` instead (not both: each collection would
be recorded twice). Works without ``torch.distributed`` (a single process decides alone).

    gc_plan = PlannedGC(adaptive=True)
    gc_plan.start()            # after start-up: model, optimizer and data built
    for step in range(num_steps):
        train_step()
        gc_plan.step()         # every rank, same place in the step
    gc_plan.stop()
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from laggard.mitigate._errors import error, warn

# reasons, as bits of the agreed flag
REASON_INTERVAL = 1
REASON_COUNT = 2
REASON_RSS = 4
REASON_GUARD = 8
REASON_FREEZE = 16
_REASON_NAMES = {REASON_INTERVAL: "interval", REASON_COUNT: "gen0-count", REASON_RSS: "rss-growth",
                 REASON_GUARD: "memory-guard", REASON_FREEZE: "freeze"}


def reason_names(bits: int) -> list[str]:
    return [name for bit, name in _REASON_NAMES.items() if bits & bit]


@dataclass(kw_only=True, slots=True)
class Collection:
    """One planned collection on this rank."""

    step: int
    start_ns: int
    dur_ns: int
    generation: int
    reasons: int  # REASON_* bits, agreed across ranks
    num_collected: int
    rss_before_bytes: int | None
    rss_after_bytes: int | None

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "start_ns": self.start_ns, "dur_ns": self.dur_ns, "generation": self.generation,
                "reasons": reason_names(self.reasons), "num_collected": self.num_collected,
                "rss_before_bytes": self.rss_before_bytes, "rss_after_bytes": self.rss_after_bytes}


def rss_bytes() -> int | None:
    """Resident set size of this process (Linux /proc; None where not available)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _dist_group(group: Any) -> Any:
    """torch.distributed when it is initialised (without importing torch if the program did not)."""
    if "torch.distributed" not in sys.modules and group is None:
        return None
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        if group is not None:
            raise error("PlannedGC: a process group was given but torch.distributed is not initialised")
        return None
    return dist


class PlannedGC:
    """Collect garbage on every rank at the same step (see the module docstring)."""

    def __init__(self, *, interval_steps: int | None = 500, adaptive: bool = False,
                 gen0_threshold: int = 200_000, rss_growth_bytes: int | None = 2 * 2**30,
                 max_rss_bytes: int | None = None, min_interval_steps: int = 1,
                 max_interval_steps: int | None = None, check_every_steps: int = 1, generation: int = 2,
                 freeze_after_steps: int | None = 1, group: Any = None, device: Any = None,
                 on_collect: Callable[[int, int, int], Any] | None = None,
                 clock_ns: Callable[[], int] = time.perf_counter_ns) -> None:
        if interval_steps is None and not adaptive and max_rss_bytes is None:
            raise error("PlannedGC: give interval_steps, adaptive=True or max_rss_bytes, or nothing is ever collected")
        for name, v, lo in (("interval_steps", interval_steps, 1), ("min_interval_steps", min_interval_steps, 1),
                            ("max_interval_steps", max_interval_steps, 1), ("check_every_steps", check_every_steps, 1),
                            ("gen0_threshold", gen0_threshold, 1), ("freeze_after_steps", freeze_after_steps, 0),
                            ("rss_growth_bytes", rss_growth_bytes, 1), ("max_rss_bytes", max_rss_bytes, 1)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
                raise error(f"PlannedGC: {name} must be an integer >= {lo}, got {v!r}")
        if generation not in (0, 1, 2):
            raise error(f"PlannedGC: generation must be 0, 1 or 2, got {generation!r}")
        self.interval_steps = interval_steps
        self.adaptive = adaptive
        self.gen0_threshold = gen0_threshold
        self.rss_growth_bytes = rss_growth_bytes
        self.max_rss_bytes = max_rss_bytes
        self.min_interval_steps = min_interval_steps
        self.max_interval_steps = max_interval_steps
        self.check_every_steps = check_every_steps
        self.generation = generation
        self.freeze_after_steps = freeze_after_steps
        self.group = group
        self.device = device
        self.on_collect = on_collect
        self.clock_ns = clock_ns
        self.collections: list[Collection] = []
        self.num_steps = 0
        self.num_unplanned = 0  # collections this object did not start (someone else called gc.collect)
        self.frozen = False
        self._started = False
        self._was_enabled = True
        self._last_step = 0
        self._rss_base: int | None = None
        self._in_collect = False
        self._dist: Any = None
        self._warned_enabled = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> PlannedGC:
        """Turn automatic collection off (restored by ``stop``) and start counting steps."""
        if self._started:
            return self
        self._dist = _dist_group(self.group)
        if self._dist is not None and self.device is None:
            backend = self._dist.get_backend(self.group)
            if backend == "nccl":
                import torch

                self.device = torch.device("cuda", torch.cuda.current_device())
        self._was_enabled = gc.isenabled()
        gc.disable()
        gc.callbacks.append(self._observe)
        self._rss_base = rss_bytes()
        if (self.rss_growth_bytes is not None or self.max_rss_bytes is not None) and self._rss_base is None:
            warn("PlannedGC: cannot read this process's RSS here; RSS growth and the memory guard are off")
        self._started = True
        return self

    def stop(self) -> None:
        """Restore automatic collection as it was before ``start`` (frozen objects stay frozen)."""
        if not self._started:
            return
        if self._observe in gc.callbacks:
            gc.callbacks.remove(self._observe)
        if self._was_enabled:
            gc.enable()
        self._started = False

    def __enter__(self) -> PlannedGC:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and not self._in_collect:
            self.num_unplanned += 1

    # ------------------------------------------------------------------ per step

    def local_reasons(self, step: int) -> int:
        """What this rank alone would collect for at ``step`` (REASON_* bits)."""
        since = step - self._last_step
        bits = 0
        if self.freeze_after_steps is not None and not self.frozen and step >= self.freeze_after_steps:
            bits |= REASON_FREEZE
        if self.interval_steps is not None and since >= self.interval_steps:
            bits |= REASON_INTERVAL
        if self.max_interval_steps is not None and since >= self.max_interval_steps:
            bits |= REASON_INTERVAL
        rss = None
        if self.max_rss_bytes is not None or (self.adaptive and self.rss_growth_bytes is not None):
            rss = rss_bytes()
        if self.max_rss_bytes is not None and rss is not None and rss >= self.max_rss_bytes:
            bits |= REASON_GUARD
        if self.adaptive and since >= self.min_interval_steps:
            if gc.get_count()[0] >= self.gen0_threshold:
                bits |= REASON_COUNT
            if (self.rss_growth_bytes is not None and rss is not None and self._rss_base is not None
                    and rss - self._rss_base >= self.rss_growth_bytes):
                bits |= REASON_RSS
        return bits

    def _needs_agreement(self) -> bool:
        return self._dist is not None and (self.adaptive or self.max_rss_bytes is not None)

    def _agree(self, bits: int) -> int:
        """OR of every rank's bits: one all-reduce (MAX) of a tensor of five 0/1 flags."""
        import torch

        t = torch.tensor([(bits >> i) & 1 for i in range(len(_REASON_NAMES))], dtype=torch.int32,
                         device=self.device)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group)
        return sum(int(v) << i for i, v in enumerate(t.tolist()))

    def step(self) -> bool:
        """Call once per training step, on every rank, at the same point of the step. Returns True when
        this step collected."""
        if not self._started:
            raise error("PlannedGC.step() before start()")
        if gc.isenabled():
            gc.disable()
            if not self._warned_enabled:
                self._warned_enabled = True
                warn("PlannedGC: something re-enabled automatic garbage collection; turned it off again")
        self.num_steps += 1
        step = self.num_steps
        if step % self.check_every_steps and not (self.freeze_after_steps is not None and not self.frozen
                                                  and step == self.freeze_after_steps):
            return False
        bits = self.local_reasons(step)
        if self._needs_agreement():
            bits = self._agree(bits)
        if not bits:
            return False
        self._collect(step, bits)
        return True

    def _collect(self, step: int, bits: int) -> None:
        rss_before = rss_bytes()
        self._in_collect = True
        start_ns = self.clock_ns()
        t0 = time.perf_counter_ns()
        try:
            num = gc.collect(self.generation if not bits & (REASON_GUARD | REASON_FREEZE) else 2)
        finally:
            dur_ns = time.perf_counter_ns() - t0
            self._in_collect = False
        if bits & REASON_FREEZE and not self.frozen:
            gc.freeze()
            self.frozen = True
        rss_after = rss_bytes()
        self._last_step = step
        self._rss_base = rss_after
        generation = self.generation if not bits & (REASON_GUARD | REASON_FREEZE) else 2
        self.collections.append(Collection(step=step, start_ns=start_ns, dur_ns=dur_ns, generation=generation,
                                           reasons=bits, num_collected=num, rss_before_bytes=rss_before,
                                           rss_after_bytes=rss_after))
        if self.on_collect is not None:
            self.on_collect(start_ns, dur_ns, generation)

    def collect_now(self) -> None:
        """Collect on this rank immediately (outside the plan; for a checkpoint or an evaluation that
        every rank reaches together)."""
        self._collect(self.num_steps, REASON_INTERVAL)

    # ------------------------------------------------------------------ reporting

    def summary(self) -> dict[str, Any]:
        durs = [c.dur_ns for c in self.collections]
        return {
            "num_steps": self.num_steps, "num_collections": len(self.collections),
            "collection_steps": [c.step for c in self.collections],
            "total_collect_s": sum(durs) * 1e-9, "max_collect_s": max(durs) * 1e-9 if durs else 0.0,
            "num_unplanned": self.num_unplanned, "frozen": self.frozen,
            "distributed": self._dist is not None,
        }


__all__ = ["Collection", "PlannedGC", "reason_names", "rss_bytes"]
