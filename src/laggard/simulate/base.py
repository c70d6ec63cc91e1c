"""The worker-time distribution interface every simulation draws from (see ``dists`` for specs)."""

from __future__ import annotations

import math

import numpy as np

# Smallest time a sample may take: clipping floor for distributions that could reach zero or below.
MIN_TIME = 1e-12


class Distribution:
    """A distribution of positive worker times. Subclasses implement ``_draw`` and ``describe``."""

    __slots__ = ()

    def sample(self, rng: np.random.Generator, shape: int | tuple[int, ...]) -> np.ndarray:
        """Draw iid positive times (float64) of the given shape."""
        shape = (shape,) if isinstance(shape, int | np.integer) else tuple(int(s) for s in shape)
        return self._draw(rng, shape)

    def sample_jobs(self, rng: np.random.Generator, num_jobs: int, num_workers: int) -> np.ndarray:
        """One step of ``num_jobs`` jobs of ``num_workers`` workers: shape (num_jobs, num_workers).

        Parametric distributions draw iid; a distribution with a per-worker structure (a trace)
        lays the workers of each job out like the measured job.
        """
        return self.sample(rng, (num_jobs, num_workers))

    def sample_max(self, rng: np.random.Generator, num_jobs: int, num_workers: int) -> np.ndarray:
        """The barrier of ``num_jobs`` jobs: the max over ``num_workers`` workers, shape (num_jobs,).

        Parametric distributions that are increasing functions of a standard variate override this
        to take the max of the standard draws and transform only the maxima (exact, and about a
        quarter faster: one pass over the (jobs, workers) draws instead of four).
        """
        return self.sample_jobs(rng, num_jobs, num_workers).max(axis=1)

    def sample_steps(
        self, rng: np.random.Generator, num_runs: int, num_steps: int, num_workers: int
    ) -> np.ndarray:
        """Times of ``num_runs`` jobs of ``num_workers`` workers over ``num_steps`` steps.

        Shape ``(num_runs, num_steps, num_workers)``. Parametric distributions draw every entry
        independently; a distribution with a persistent per-worker part keeps it fixed across steps.
        """
        return self.sample(rng, (num_runs, num_steps, num_workers))

    def _draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def spec(self) -> str:
        """A spec string that ``parse_dist`` turns back into this distribution."""
        raise NotImplementedError

    def mean(self) -> float | None:
        """The exact mean, or None when it is not known in closed form (or infinite)."""
        return None

    def sf(self, x: np.ndarray) -> np.ndarray | None:
        """P(X > x) (survival function), or None when there is no closed form."""
        return None

    def cdf(self, x: np.ndarray) -> np.ndarray | None:
        """P(X <= x), or None when this distribution has no closed-form CDF."""
        s = self.sf(x)
        return None if s is None else 1.0 - s

    def expected_max(self, num_workers: int) -> float | None:
        """E[max of num_workers iid draws] in closed form, or None when there is none."""
        return None

    def support_upper(self) -> float:
        """A point beyond which the survival function is negligible (for quadrature)."""
        return math.inf


def harmonic(n: int) -> float:
    """H_n = 1 + 1/2 + ... + 1/n."""
    return float(np.sum(1.0 / np.arange(1, n + 1, dtype=np.float64))) if n > 0 else 0.0
