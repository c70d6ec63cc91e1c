"""Predict the straggler and its delay from recent AllReduce calls (pure numpy).

Input per call: how long each rank waited inside the collective (``wait_s``). Whoever arrives last
waits least, so ``max(wait) - wait[i]`` is rank ``i``'s arrival lag behind the first rank, without
needing synchronised clocks across hosts (one host's ``perf_counter`` arrival times work too:
``update_arrivals``). Lags are smoothed with an exponentially weighted moving average; the predicted
straggler is the rank with the largest smoothed lag and its predicted delay is how far it trails the
next-latest rank: that gap is the time StragglAR can hide phase 1 in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from laggard.errors import LaggardError


@dataclass(kw_only=True, slots=True)
class LagTracker:
    """Exponentially weighted per-rank arrival lag."""

    num_ranks: int
    smoothing: float = 0.3  # weight of the newest call
    lag_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    num_updates: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.num_ranks, int) or self.num_ranks < 2:
            raise LaggardError(f"lag tracker: needs at least 2 ranks, got {self.num_ranks!r}")
        if not 0 < self.smoothing <= 1:
            raise LaggardError(f"lag tracker: smoothing must be in (0, 1], got {self.smoothing!r}")
        if self.lag_s.size != self.num_ranks:
            self.lag_s = np.zeros(self.num_ranks)

    def update_arrivals(self, arrival_s: np.ndarray) -> None:
        """Fold in one call's arrival times (any common clock)."""
        a = np.asarray(arrival_s, dtype=np.float64)
        if a.shape != (self.num_ranks,) or not np.isfinite(a).all():
            raise LaggardError(f"lag tracker: expected {self.num_ranks} finite arrival times")
        lag = a - a.min()
        if self.num_updates == 0:
            self.lag_s = lag
        else:
            self.lag_s = (1 - self.smoothing) * self.lag_s + self.smoothing * lag
        self.num_updates += 1

    def update_waits(self, wait_s: np.ndarray) -> None:
        """Fold in one call's per-rank time spent inside the collective."""
        w = np.asarray(wait_s, dtype=np.float64)
        self.update_arrivals(-w)  # arriving later = waiting less

    def predict(self) -> tuple[int, float]:
        """(predicted straggler, predicted delay in seconds behind the next-latest rank)."""
        order = np.argsort(self.lag_s, kind="stable")
        top, second = int(order[-1]), int(order[-2])
        return top, float(self.lag_s[top] - self.lag_s[second])
