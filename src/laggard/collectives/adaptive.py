"""Adaptive AllReduce: StragglAR when a straggler is expected to be late enough, else native.

Each call every rank:

1. decides, from state all ranks share (so they agree without talking): predicted straggler and delay
   (``LagTracker``), break-even delay ``d*`` for this size (``laggard.collectives.cost``);
2. runs StragglAR with the predicted straggler if ``delay > d*``, else the group's ``all_reduce``;
   with ``eager=True`` StragglAR's straggler is instead whoever arrives last, agreed through the
   process group's store: each rank counts itself in (``store.add``) and the ``n-1``-th arrival
   publishes the missing rank, so phase 1 starts as soon as ``n-1`` ranks are there;
3. measures how long it waited and shares it (one small ``all_reduce`` of an ``n``-vector, which also
   keeps every rank's tracker identical), to update the prediction.

The store round trips cost a few hundred microseconds on TCP, fine for large tensors. Under NCCL the
tracker exchange would be a tiny NCCL all_reduce and wait times need a ``cuda.synchronize`` (or events).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from laggard.collectives.cost import CostParams, break_even_delay_s
from laggard.collectives.p2p import group_ranks
from laggard.collectives.predict import LagTracker
from laggard.collectives.stragglar import stragglar_allreduce
from laggard.errors import LaggardError

_instances = itertools.count()


@dataclass(kw_only=True, slots=True)
class Decision:
    """What one call did (the same on every rank)."""

    algorithm: str  # "stragglar" or "native"
    straggler: int | None
    predicted_delay_s: float
    break_even_delay_s: float
    wait_s: float = 0.0


def agree_on_straggler(store: dist.Store, key: str, rank: int, num_ranks: int) -> int:
    """Eager mode: the rank that arrives last at ``key`` (every rank of the group calls this once).

    Ranks arriving first learn the answer as soon as ``n-1`` ranks are in; the last one reads it.
    """
    count = int(store.add(f"{key}/count", 1))
    store.set(f"{key}/slot/{count}", str(rank))
    if count == num_ranks - 1:
        arrived = {int(store.get(f"{key}/slot/{i}")) for i in range(1, num_ranks)}
        missing = sorted(set(range(num_ranks)) - arrived)
        store.set(f"{key}/straggler", str(missing[0]))
    return int(store.get(f"{key}/straggler"))


class AdaptiveAllReduce:
    """Callable AllReduce that switches to StragglAR for predictable, long enough straggler delays.

    Create one per group on every rank, in the same order (``name`` keys the store in eager mode).
    ``params`` are the cost-model parameters (measure them with ``laggard.collectives.calibrate``).
    """

    def __init__(self, group: dist.ProcessGroup | None = None, *, params: CostParams | None = None,
                 smoothing: float = 0.3, min_calls: int = 2, eager: bool = False,
                 store: dist.Store | None = None, name: str | None = None, baseline: str = "best") -> None:
        self.group = group
        self.me, self.ranks = group_ranks(group)
        self.num_ranks = len(self.ranks)
        if self.me < 0:
            raise LaggardError("adaptive AllReduce: this process is not a member of the group")
        if self.num_ranks < 2:
            raise LaggardError("adaptive AllReduce: the group needs at least 2 ranks")
        self.params = params if params is not None else CostParams()
        self.tracker = LagTracker(num_ranks=self.num_ranks, smoothing=smoothing)
        self.min_calls = int(min_calls)
        self.eager = bool(eager)
        self.baseline = baseline
        self.name = name if name is not None else f"i{next(_instances)}"
        self.store = store
        if self.eager and self.store is None:
            self.store = dist.distributed_c10d._get_default_store()  # private API; pass store= to avoid
        self.num_calls = 0
        self.history: list[Decision] = []

    def decide(self, size_bytes: int) -> Decision:
        """The decision for the next call of ``size_bytes`` (pure function of shared state)."""
        d_star = break_even_delay_s(self.num_ranks, size_bytes, self.params, self.baseline)
        strag, delay = self.tracker.predict()
        use = self.tracker.num_updates >= self.min_calls and delay > d_star
        return Decision(algorithm="stragglar" if use else "native", straggler=strag if use else None,
                        predicted_delay_s=delay, break_even_delay_s=d_star)

    def __call__(self, tensor: torch.Tensor, op: object = dist.ReduceOp.SUM) -> Decision:
        t0 = time.perf_counter()
        decision = self.decide(tensor.numel() * tensor.element_size())
        call = self.num_calls
        self.num_calls += 1
        if decision.algorithm == "stragglar":
            if self.eager:
                assert self.store is not None
                key = f"laggard/stragglar/{self.name}/{call}"
                decision.straggler = agree_on_straggler(self.store, key, self.me, self.num_ranks)
                self._cleanup(call)
            stragglar_allreduce(tensor, straggler=decision.straggler, group=self.group, op=op)
        else:
            dist.all_reduce(tensor, op=op, group=self.group)
        decision.wait_s = time.perf_counter() - t0
        waits = torch.zeros(self.num_ranks, dtype=torch.float64)
        waits[self.me] = decision.wait_s
        dist.all_reduce(waits, group=self.group)
        self.tracker.update_waits(waits.numpy())
        self.history.append(decision)
        return decision

    def _cleanup(self, call: int) -> None:
        """Drop the store keys of an eager call two calls back (every rank has read them by now)."""
        if self.me != 0 or call < 2 or self.store is None:
            return
        key = f"laggard/stragglar/{self.name}/{call - 2}"
        try:
            self.store.delete_key(f"{key}/count")
            self.store.delete_key(f"{key}/straggler")
            for i in range(1, self.num_ranks):
                self.store.delete_key(f"{key}/slot/{i}")
        except (RuntimeError, NotImplementedError):  # some stores cannot delete; keys are tiny
            pass


def stragglar_share(decisions: list[Decision]) -> float:
    """Fraction of calls that used StragglAR."""
    return float(np.mean([d.algorithm == "stragglar" for d in decisions])) if decisions else 0.0
