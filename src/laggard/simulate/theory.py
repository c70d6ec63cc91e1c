"""Closed forms and numerical integrals for order statistics: independent checks on the Monte-Carlo.

For a positive random variable Y, E[Y] = integral over x > 0 of P(Y > x). Every order statistic of
K iid worker times has a survival function built from the worker's survival function S(x):

* the barrier (BSP), max of K:                   1 - (1 - S)^K
* the barrier with b backups per worker, max of K mins of b+1:   1 - (1 - S^(b+1))^K
* the barrier that drops the m slowest, the (K-m)-th smallest:  P(more than m of K exceed x)

The integral is taken on a logarithmic grid (uniform relative resolution from 1e-12 up to where
the survival function vanishes), so heavy tails and narrow bulks are both resolved.
"""

from __future__ import annotations

import math

import numpy as np

from laggard.simulate.base import Distribution, harmonic

__all__ = ["harmonic", "expected_max", "expected_order_stat", "expected_max_exponential"]

_NUM_POINTS = 40_001
_LOG_LOW = math.log(1e-12)


def expected_max_exponential(num_workers: int, rate: float = 1.0) -> float:
    """E[max of K iid Exp(rate)] = H_K / rate."""
    return harmonic(num_workers) / rate


def _integrate_survival(dist: Distribution, surv_of_y) -> float | None:
    upper = dist.support_upper()
    if not math.isfinite(upper):
        return None
    u = np.linspace(_LOG_LOW, math.log(upper * 1.0001), _NUM_POINTS)
    x = np.exp(u)
    s = dist.sf(x)
    if s is None:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        y = surv_of_y(np.clip(s, 0.0, 1.0))
    integrand = y * x
    head = float(np.exp(_LOG_LOW))  # P(Y > x) = 1 below the grid: times are positive
    return head + float(np.sum(0.5 * (integrand[1:] + integrand[:-1]) * np.diff(u)))


def expected_max(dist: Distribution, num_workers: int, *, copies: int = 1) -> float | None:
    """E[max over K workers of (min over ``copies`` iid draws)]; None without a closed-form sf.

    ``copies=1`` is the plain barrier; ``copies=b+1`` is the barrier with b backups per worker.
    """
    k = int(num_workers)

    def surv(s: np.ndarray) -> np.ndarray:
        s_min = s**copies
        return -np.expm1(k * np.log1p(-s_min))

    return _integrate_survival(dist, surv)


def expected_order_stat(dist: Distribution, num_workers: int, num_dropped: int) -> float | None:
    """E[(K-m)-th smallest of K iid draws]: the barrier when the m slowest are dropped."""
    k, m = int(num_workers), int(num_dropped)
    if not 0 <= m < k:
        raise ValueError("need 0 <= num_dropped < num_workers")
    log_binom = [math.lgamma(k + 1) - math.lgamma(i + 1) - math.lgamma(k - i + 1) for i in range(m + 1)]

    def surv(s: np.ndarray) -> np.ndarray:
        # P(Y > x) = 1 - P(at most m of the K exceed x)
        f = 1.0 - s
        log_s, log_f = np.log(s), np.log(f)
        at_most_m = np.zeros_like(s)
        for i, lb in enumerate(log_binom):
            term = np.exp(lb + i * log_s + (k - i) * log_f)
            at_most_m += np.nan_to_num(term, nan=0.0)
        # where s == 0, all K are below x: P(at most m exceed) = 1
        at_most_m = np.where(s <= 0, 1.0, at_most_m)
        return np.clip(1.0 - at_most_m, 0.0, 1.0)

    return _integrate_survival(dist, surv)
