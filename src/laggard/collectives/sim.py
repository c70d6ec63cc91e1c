"""Expected AllReduce completion at scale (up to thousands of ranks) from the cost model.

Each trial draws every rank's arrival time at the AllReduce (its compute time) from a distribution of
``laggard.simulate.dists`` (scaled by ``time_scale_s``), optionally adds a persistent extra delay to
one rank, and computes, vectorised over trials:

* ring / RHD: ``max(arrival) + T``;
* StragglAR with straggler ``g``: phase 1 starts when every rank but ``g`` is there, phase 2 when ``g``
  is there and phase 1 is done: ``max(arr[g], max(arr[not g]) + T1) + T2``;
  ``g`` is the true last rank (``eager``: agreed through the store as the ranks arrive; store latency
  is not modelled) or the last rank of the previous trial (``previous``: what a predictor can know;
  consecutive trials are consecutive steps);
* adaptive: StragglAR (``previous`` guess, or ``eager``) when the previous step's gap (last minus
  second-to-last arrival) exceeded ``d*``, else the faster of ring and RHD.

Reported: mean completion (from the step start) and mean exposed communication (completion minus the
last arrival) per algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from laggard.collectives import cost
from laggard.collectives.schedule import check_num_ranks
from laggard.errors import LaggardError, check_seed

SIM_ALGORITHMS = ("ring", "rhd", "stragglar_eager", "stragglar_previous", "adaptive", "adaptive_eager")


@dataclass(kw_only=True, slots=True)
class SimResult:
    num_ranks: int
    size_bytes: int
    num_trials: int
    mean_completion_s: dict[str, float]
    mean_exposed_s: dict[str, float]
    mean_gap_s: float  # last minus second-to-last arrival
    break_even_delay_s: float
    adaptive_stragglar_share: float

    def to_json(self) -> dict:
        return {"ranks": self.num_ranks, "size_bytes": self.size_bytes, "trials": self.num_trials,
                "mean_completion_s": self.mean_completion_s, "mean_exposed_s": self.mean_exposed_s,
                "mean_gap_s": self.mean_gap_s, "break_even_delay_s": self.break_even_delay_s,
                "adaptive_stragglar_share": self.adaptive_stragglar_share}


def _stragglar_completion(arr: np.ndarray, guess: np.ndarray, t1: float, t2: float) -> np.ndarray:
    rows = np.arange(arr.shape[0])
    t_guess = arr[rows, guess]
    others = arr.copy()
    others[rows, guess] = -np.inf
    return np.maximum(t_guess, others.max(axis=1) + t1) + t2


def simulate_completion(num_ranks: int, size_bytes: float, params: cost.CostParams,
                        arrivals_s: np.ndarray) -> SimResult:
    """Completion of every algorithm for given arrival times, shape ``(num_trials, num_ranks)``."""
    n = check_num_ranks(num_ranks, what="collectives simulate")
    arr = np.asarray(arrivals_s, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != n or arr.shape[0] < 1 or not np.isfinite(arr).all():
        raise LaggardError(f"collectives simulate: arrivals must be finite, shape (trials, {n})")
    t_ring = cost.ring_time_s(n, size_bytes, params)
    t_rhd = cost.rhd_time_s(n, size_bytes, params)
    t1 = cost.stragglar_phase1_time_s(n, size_bytes, params)
    t2 = cost.stragglar_phase2_time_s(n, size_bytes, params)
    d_star = cost.break_even_delay_s(n, size_bytes, params, "best")
    last = arr.max(axis=1)
    top2 = np.partition(arr, n - 2, axis=1)[:, n - 2:]
    gap = top2[:, 1] - top2[:, 0]
    oracle = arr.argmax(axis=1)
    previous = np.concatenate([[oracle[0]], oracle[:-1]])  # the first trial has no history: oracle
    prev_gap = np.concatenate([[gap[0]], gap[:-1]])
    comp = {
        "ring": last + t_ring,
        "rhd": last + t_rhd,
        "stragglar_eager": _stragglar_completion(arr, oracle, t1, t2),
        "stragglar_previous": _stragglar_completion(arr, previous, t1, t2),
    }
    use = prev_gap > d_star
    comp["adaptive"] = np.where(use, comp["stragglar_previous"], last + min(t_ring, t_rhd))
    comp["adaptive_eager"] = np.where(use, comp["stragglar_eager"], last + min(t_ring, t_rhd))
    return SimResult(num_ranks=n, size_bytes=int(size_bytes), num_trials=int(arr.shape[0]),
                     mean_completion_s={k: float(v.mean()) for k, v in comp.items()},
                     mean_exposed_s={k: float((v - last).mean()) for k, v in comp.items()},
                     mean_gap_s=float(gap.mean()), break_even_delay_s=d_star,
                     adaptive_stragglar_share=float(use.mean()))


def simulate_at_scale(ranks: list[int], size_bytes: float, params: cost.CostParams, dist_spec: str, *,
                      time_scale_s: float = 1e-3, num_trials: int = 2000, persistent_delay_s: float = 0.0,
                      seed: int = 0) -> list[SimResult]:
    """Draw arrivals from ``dist_spec`` (``laggard simulate`` syntax) for each ``n`` in ``ranks``.

    ``persistent_delay_s`` is added to the last rank in every trial (a persistent straggler).
    """
    from laggard.simulate.dists import parse_dist

    if not (np.isfinite(time_scale_s) and time_scale_s > 0):
        raise LaggardError(f"collectives simulate: time scale must be > 0, got {time_scale_s!r}")
    if not (np.isfinite(persistent_delay_s) and persistent_delay_s >= 0):
        raise LaggardError(f"collectives simulate: persistent delay must be >= 0, got {persistent_delay_s!r}")
    if not isinstance(num_trials, int) or not 1 <= num_trials <= 1_000_000:
        raise LaggardError(f"collectives simulate: trials must be in 1..1000000, got {num_trials!r}")
    d = parse_dist(dist_spec)
    rng = np.random.default_rng(check_seed(seed))
    out = []
    for n in ranks:
        n = check_num_ranks(n, what="collectives simulate")
        arr = d.sample(rng, (num_trials, n)) * time_scale_s
        arr[:, -1] += persistent_delay_s
        out.append(simulate_completion(n, size_bytes, params, arr))
    return out
