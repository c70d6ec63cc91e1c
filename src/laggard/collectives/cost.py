"""Alpha-beta(-gamma) cost models for ring, recursive halving-doubling (RHD) and StragglAR.

Times are in seconds for an AllReduce of ``size_bytes`` over ``n`` ranks:

* ``alpha_s``: latency of one message; ``beta_s_per_byte``: transfer time per byte on one link;
  ``gamma_s_per_byte``: local reduction time per byte.
* ``num_links``: how many transfers the machine carries at full speed at once. ``inf`` is the
  textbook model (a switch or NVLink: every rank sends and receives at full speed together). On a
  CPU host every loopback transfer is a memory copy by some core, so a round with ``k`` concurrent
  transfers runs ``max(1, k / num_links)`` times slower; ``laggard.collectives.calibrate`` measures it.

Models, with ``c`` the chunk size and ``R = n-2+log2(n)`` (the phase-2 rounds):

* ring: ``2(n-1)`` rounds of ``c = s/n``, the first ``n-1`` with a reduction;
* RHD (Rabenseifner): ``2 log2 p`` rounds of halving sizes ``s/2 .. s/p``, plus two full-size steps to
  fold in the ``n-p`` extra ranks when ``n`` is not a power of two ``p``;
* StragglAR phase 1: ring ReduceScatter among ``n-1`` ranks, ``n-2`` rounds of ``c = s/(n-1)``;
  phase 2: ``n-1`` swap rounds (with a reduction) then copies, ``R`` rounds of ``c = s/(n-1)``.

With the straggler ``delay_s`` late (measured from the other ranks' arrival), completion after the
others' arrival is ``delay + T_base`` for a synchronous algorithm and ``max(delay, T1) + T2`` for
StragglAR, so StragglAR wins iff ``delay > d* = T1 + T2 - T_base`` (and never if ``T2 >= T_base``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from laggard.collectives.schedule import (
    MAX_GREEDY_RANKS,
    check_num_ranks,
    stragglar_rounds,
    stragglar_schedule,
)
from laggard.errors import LaggardError

ALGORITHMS = ("ring", "rhd", "stragglar")


@dataclass(kw_only=True, slots=True, frozen=True)
class CostParams:
    """Machine parameters of the model (see the module docstring)."""

    alpha_s: float = 5e-6
    beta_s_per_byte: float = 1 / 150e9  # ~150 GB/s per direction: an NVLink-class GPU link
    gamma_s_per_byte: float = 0.0
    num_links: float = math.inf
    source: str = "default (NVLink-class GPU)"

    def __post_init__(self) -> None:
        for name in ("alpha_s", "beta_s_per_byte", "gamma_s_per_byte"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise LaggardError(f"cost model: {name} must be a finite number >= 0, got {v!r}")
        if not (self.num_links > 0):
            raise LaggardError(f"cost model: num_links must be > 0, got {self.num_links!r}")

    def with_links(self, num_links: float) -> CostParams:
        return replace(self, num_links=num_links)

    def to_json(self) -> dict:
        return {"alpha_s": self.alpha_s, "beta_s_per_byte": self.beta_s_per_byte,
                "gamma_s_per_byte": self.gamma_s_per_byte,
                "num_links": None if math.isinf(self.num_links) else self.num_links, "source": self.source}


def _check_size(size_bytes: float) -> float:
    if not (isinstance(size_bytes, int | float | np.integer | np.floating) and math.isfinite(size_bytes)
            and size_bytes >= 0):
        raise LaggardError(f"cost model: size_bytes must be a finite number >= 0, got {size_bytes!r}")
    return float(size_bytes)


def _round_s(p: CostParams, chunk_bytes: float, num_transfers: float, reduce: bool) -> float:
    slow = max(1.0, num_transfers / p.num_links)
    per_byte = p.beta_s_per_byte + (p.gamma_s_per_byte if reduce else 0.0)
    return p.alpha_s + chunk_bytes * per_byte * slow


def ring_time_s(num_ranks: int, size_bytes: float, params: CostParams) -> float:
    """Ring AllReduce: ReduceScatter then AllGather, ``n-1`` rounds each, chunks of ``s/n``."""
    n = check_num_ranks(num_ranks, what="ring model")
    c = _check_size(size_bytes) / n
    return (n - 1) * (_round_s(params, c, n, True) + _round_s(params, c, n, False))


def rhd_time_s(num_ranks: int, size_bytes: float, params: CostParams) -> float:
    """Recursive halving (ReduceScatter) + recursive doubling (AllGather), Rabenseifner style."""
    n = check_num_ranks(num_ranks, what="RHD model")
    s = _check_size(size_bytes)
    p = 1 << (n.bit_length() - 1)
    t = 0.0
    if p != n:  # the n-p extra ranks fold their data into partners first and get the result last
        extra = n - p
        t += _round_s(params, s, extra, True) + _round_s(params, s, extra, False)
    c = s
    for _ in range(int(math.log2(p))):
        c /= 2
        t += _round_s(params, c, p, True) + _round_s(params, c, p, False)
    return t


@lru_cache(maxsize=256)
def _phase2_profile(num_ranks: int) -> tuple[tuple[int, bool], ...]:
    """(transfers, has a reduction) per phase-2 round, from the synthesised schedule."""
    sched = stragglar_schedule(num_ranks).phase2
    counts = np.bincount(sched.round_idx, minlength=sched.num_rounds)
    red = np.bincount(sched.round_idx, weights=sched.reduce, minlength=sched.num_rounds) > 0
    return tuple(zip(counts.tolist(), red.tolist(), strict=True))


def stragglar_phase1_time_s(num_ranks: int, size_bytes: float, params: CostParams) -> float:
    """Phase 1: ring ReduceScatter among the ``n-1`` on-time ranks (``n-2`` rounds)."""
    n = check_num_ranks(num_ranks, what="StragglAR model")
    m = n - 1
    c = _check_size(size_bytes) / m
    return (m - 1) * _round_s(params, c, m, True)


def stragglar_phase2_time_s(num_ranks: int, size_bytes: float, params: CostParams) -> float:
    """Phase 2 (after the straggler arrives): ``R`` rounds of one chunk ``s/(n-1)``."""
    n = check_num_ranks(num_ranks, what="StragglAR model")
    c = _check_size(size_bytes) / (n - 1)
    if n <= MAX_GREEDY_RANKS and not math.isinf(params.num_links):
        return sum(_round_s(params, c, k, red) for k, red in _phase2_profile(n))
    # unlimited links: a round costs the same whatever its number of transfers; large n: assume all busy
    rounds = stragglar_rounds(n)
    return (n - 1) * _round_s(params, c, n, True) + (rounds - (n - 1)) * _round_s(params, c, n, False)


def stragglar_time_s(num_ranks: int, size_bytes: float, params: CostParams, *, delay_s: float = 0.0) -> float:
    """Completion measured from the straggler's arrival (``delay_s`` after the others).

    With ``delay_s >= T1`` phase 1 is hidden and this is ``T2``; with ``delay_s = 0`` it is ``T1+T2``.
    """
    t1 = stragglar_phase1_time_s(num_ranks, size_bytes, params)
    t2 = stragglar_phase2_time_s(num_ranks, size_bytes, params)
    return max(float(delay_s), t1) - float(delay_s) + t2


def algorithm_time_s(algorithm: str, num_ranks: int, size_bytes: float, params: CostParams, *,
                     delay_s: float = 0.0) -> float:
    """Time from the last arrival to completion for ``algorithm`` (``ring``, ``rhd``, ``stragglar``)."""
    if algorithm == "ring":
        return ring_time_s(num_ranks, size_bytes, params)
    if algorithm == "rhd":
        return rhd_time_s(num_ranks, size_bytes, params)
    if algorithm == "stragglar":
        return stragglar_time_s(num_ranks, size_bytes, params, delay_s=delay_s)
    raise LaggardError(f"cost model: unknown algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")


def baseline_time_s(num_ranks: int, size_bytes: float, params: CostParams, baseline: str = "best") -> float:
    """``ring``, ``rhd`` or ``best`` (the faster of the two)."""
    if baseline == "best":
        return min(ring_time_s(num_ranks, size_bytes, params), rhd_time_s(num_ranks, size_bytes, params))
    if baseline not in ("ring", "rhd"):
        raise LaggardError(f"cost model: baseline must be ring, rhd or best, got {baseline!r}")
    return algorithm_time_s(baseline, num_ranks, size_bytes, params)


def break_even_delay_s(num_ranks: int, size_bytes: float, params: CostParams, baseline: str = "best") -> float:
    """d*: the straggler delay above which StragglAR finishes before the baseline (``inf``: never)."""
    t_base = baseline_time_s(num_ranks, size_bytes, params, baseline)
    t1 = stragglar_phase1_time_s(num_ranks, size_bytes, params)
    t2 = stragglar_phase2_time_s(num_ranks, size_bytes, params)
    if t2 >= t_base:
        return math.inf
    return max(0.0, t1 + t2 - t_base)


def predicted_ratio(num_ranks: int, size_bytes: float, params: CostParams, baseline: str = "ring") -> float:
    """StragglAR's post-arrival time with phase 1 hidden, over the baseline's."""
    return stragglar_phase2_time_s(num_ranks, size_bytes, params) / baseline_time_s(
        num_ranks, size_bytes, params, baseline)
