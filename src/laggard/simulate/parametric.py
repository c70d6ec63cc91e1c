"""Parametric worker-time distributions: constant, lognormal, exponential, clipped Gaussian, Pareto,
uniform and mixtures of them. Each knows its mean, survival function and (where one exists) the
closed form of E[max of K]."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from laggard.simulate.base import MIN_TIME, Distribution, harmonic


@dataclass(frozen=True, kw_only=True, slots=True)
class Constant(Distribution):
    value: float = 1.0

    def _draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return np.full(shape, self.value, dtype=np.float64)

    def sample_max(self, rng: np.random.Generator, num_jobs: int, num_workers: int) -> np.ndarray:
        return np.full(num_jobs, self.value, dtype=np.float64)

    def describe(self) -> str:
        return f"constant {self.value:g}"

    def spec(self) -> str:
        return f"constant:value={self.value!r}"

    def mean(self) -> float:
        return self.value

    def sf(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x) < self.value).astype(np.float64)

    def expected_max(self, num_workers: int) -> float:
        return self.value

    def support_upper(self) -> float:
        return self.value


class _Monotone(Distribution):
    """An increasing function of a standard variate: ``_standard`` draws the variate, ``_transform``
    maps it (in place). The barrier is then the transform of the max of the standard draws."""

    __slots__ = ()

    def _standard(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError

    def _transform(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return self._transform(self._standard(rng, shape))

    def sample_max(self, rng: np.random.Generator, num_jobs: int, num_workers: int) -> np.ndarray:
        return self._transform(self._standard(rng, (num_jobs, num_workers)).max(axis=1))


def _plus(base: float) -> str:
    """``"B + "`` in front of a shifted distribution's description (nothing when B is 0)."""
    return f"{base:g} + " if base else ""


_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _norm_sf(z: np.ndarray) -> np.ndarray:
    """P(Z > z) for a standard normal, accurate far into the upper tail."""
    return 0.5 * _erfc(np.asarray(z, dtype=np.float64) / math.sqrt(2.0))


@dataclass(frozen=True, kw_only=True, slots=True)
class LogNormal(_Monotone):
    """``base + exp(N(mean, sigma))``: a fixed cost plus a heavy-ish tail."""

    base: float = 0.0
    mu: float = 0.0
    sigma: float = 1.0

    def _standard(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return rng.standard_normal(shape)

    def _transform(self, x: np.ndarray) -> np.ndarray:
        x *= self.sigma
        x += self.mu
        np.exp(x, out=x)
        if self.base:
            x += self.base
        return np.maximum(x, MIN_TIME, out=x)

    def describe(self) -> str:
        return f"{_plus(self.base)}lognormal(mean={self.mu:g}, sigma={self.sigma:g})"

    def spec(self) -> str:
        return f"lognormal:base={self.base!r},mean={self.mu!r},sigma={self.sigma!r}"

    def mean(self) -> float:
        return self.base + math.exp(self.mu + 0.5 * self.sigma**2)

    def sf(self, x: np.ndarray) -> np.ndarray:
        y = np.asarray(x, dtype=np.float64) - self.base
        out = np.ones_like(y)
        pos = y > 0
        out[pos] = _norm_sf((np.log(y[pos]) - self.mu) / self.sigma)
        return out

    def support_upper(self) -> float:
        return self.base + math.exp(self.mu + 12.0 * self.sigma)


@dataclass(frozen=True, kw_only=True, slots=True)
class Exponential(_Monotone):
    """``base + Exp(rate)``; E[max of K] = base + H_K / rate."""

    base: float = 0.0
    rate: float = 1.0

    def _standard(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return rng.standard_exponential(shape)

    def _transform(self, x: np.ndarray) -> np.ndarray:
        x *= 1.0 / self.rate
        x += max(self.base, MIN_TIME)
        return x

    def describe(self) -> str:
        return f"{_plus(self.base)}exponential(rate={self.rate:g})"

    def spec(self) -> str:
        return f"exponential:base={self.base!r},rate={self.rate!r}"

    def mean(self) -> float:
        return self.base + 1.0 / self.rate

    def sf(self, x: np.ndarray) -> np.ndarray:
        y = np.asarray(x, dtype=np.float64) - self.base
        return np.exp(-self.rate * np.maximum(y, 0.0))

    def expected_max(self, num_workers: int) -> float:
        return self.base + harmonic(num_workers) / self.rate

    def support_upper(self) -> float:
        return self.base + 60.0 / self.rate


@dataclass(frozen=True, kw_only=True, slots=True)
class Gaussian(_Monotone):
    """``N(mean, std)`` clipped below at ``low`` (a light tail)."""

    mu: float = 1.0
    std: float = 0.05
    low: float = 0.0

    def _standard(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return rng.standard_normal(shape)

    def _transform(self, x: np.ndarray) -> np.ndarray:
        x *= self.std
        x += self.mu
        return np.maximum(x, max(self.low, MIN_TIME), out=x)

    def describe(self) -> str:
        return f"gaussian(mean={self.mu:g}, std={self.std:g}) clipped at {max(self.low, 0.0):g}"

    def spec(self) -> str:
        return f"gaussian:mean={self.mu!r},std={self.std!r},min={self.low!r}"

    def mean(self) -> float | None:
        if self.std == 0:
            return max(self.mu, self.low)
        # mean of max(X, low) for X ~ N(mu, std)
        a = (max(self.low, 0.0) - self.mu) / self.std
        phi = math.exp(-0.5 * a * a) / math.sqrt(2 * math.pi)
        big_phi = 0.5 * (1 + math.erf(a / math.sqrt(2)))
        return max(self.low, 0.0) * big_phi + self.mu * (1 - big_phi) + self.std * phi

    def sf(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if self.std == 0:
            return (x < max(self.mu, self.low)).astype(np.float64)
        out = _norm_sf((x - self.mu) / self.std)
        return np.where(x < max(self.low, 0.0), 1.0, out)

    def support_upper(self) -> float:
        return self.mu + 12.0 * self.std


@dataclass(frozen=True, kw_only=True, slots=True)
class Pareto(_Monotone):
    """``base + scale * U**(-1/alpha)``: power-law tail with index alpha (mean infinite if alpha <= 1)."""

    base: float = 0.0
    scale: float = 1.0
    alpha: float = 3.0

    def _standard(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        # numpy's pareto() is the Lomax form (Pareto type II shifted to 0): add 1 for type I.
        return rng.pareto(self.alpha, shape)

    def _transform(self, x: np.ndarray) -> np.ndarray:
        x += 1.0
        x *= self.scale
        if self.base:
            x += self.base
        return x

    def describe(self) -> str:
        return f"{_plus(self.base)}pareto(scale={self.scale:g}, alpha={self.alpha:g})"

    def spec(self) -> str:
        return f"pareto:base={self.base!r},scale={self.scale!r},alpha={self.alpha!r}"

    def mean(self) -> float | None:
        if self.alpha <= 1:
            return None
        return self.base + self.scale * self.alpha / (self.alpha - 1)

    def sf(self, x: np.ndarray) -> np.ndarray:
        y = np.asarray(x, dtype=np.float64) - self.base
        return np.where(y >= self.scale, (self.scale / np.maximum(y, self.scale)) ** self.alpha, 1.0)

    def expected_max(self, num_workers: int) -> float | None:
        # E[max] = scale * Gamma(K+1) Gamma(1-1/a) / Gamma(K+1-1/a) for alpha > 1
        if self.alpha <= 1:
            return None
        k, inv = num_workers, 1.0 / self.alpha
        log_ratio = math.lgamma(k + 1) + math.lgamma(1 - inv) - math.lgamma(k + 1 - inv)
        return self.base + self.scale * math.exp(log_ratio)

    def support_upper(self) -> float:
        # survival 1e-18 there; the truncated tail integral is negligible only for alpha >= 2
        return self.base + self.scale * 1e18 ** (1.0 / self.alpha) if self.alpha >= 2 else math.inf


@dataclass(frozen=True, kw_only=True, slots=True)
class Uniform(_Monotone):
    low: float = 0.5
    high: float = 1.5

    def _standard(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return rng.random(shape)

    def _transform(self, x: np.ndarray) -> np.ndarray:
        x *= self.high - self.low
        x += self.low
        return np.maximum(x, MIN_TIME, out=x)

    def describe(self) -> str:
        return f"uniform({self.low:g}, {self.high:g})"

    def spec(self) -> str:
        return f"uniform:low={self.low!r},high={self.high!r}"

    def mean(self) -> float:
        return 0.5 * (self.low + self.high)

    def sf(self, x: np.ndarray) -> np.ndarray:
        return np.clip((self.high - np.asarray(x, dtype=np.float64)) / (self.high - self.low), 0.0, 1.0)

    def expected_max(self, num_workers: int) -> float:
        return self.low + (self.high - self.low) * num_workers / (num_workers + 1)

    def support_upper(self) -> float:
        return self.high


@dataclass(frozen=True, kw_only=True, slots=True)
class Mixture(Distribution):
    """Each draw comes from component i with probability ``weights[i]`` (rare big delays)."""

    components: tuple[Distribution, ...]
    weights: tuple[float, ...]

    def _draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        if len(self.components) == 1:
            return self.components[0].sample(rng, shape)
        # Choose a component for every entry, then fill each component's entries in one draw.
        which = np.searchsorted(np.cumsum(self.weights)[:-1], rng.random(shape), side="right")
        out = np.empty(shape, dtype=np.float64)
        for i, comp in enumerate(self.components):
            mask = which == i
            n = int(np.count_nonzero(mask))
            if n:
                out[mask] = comp.sample(rng, n)
        return out

    def describe(self) -> str:
        return "mixture of " + " + ".join(
            f"{w:.4g} x {c.describe()}" for w, c in zip(self.weights, self.components, strict=True)
        )

    def spec(self) -> str:
        parts = []
        for w, c in zip(self.weights, self.components, strict=True):
            name, _, args = c.spec().partition(":")
            parts.append(f"{w!r}*{name}({args})")
        return "mixture:" + "+".join(parts)

    def mean(self) -> float | None:
        means = [c.mean() for c in self.components]
        if any(m is None for m in means):
            return None
        return float(sum(w * m for w, m in zip(self.weights, means, strict=True)))  # type: ignore[operator]

    def sf(self, x: np.ndarray) -> np.ndarray | None:
        total = np.zeros_like(np.asarray(x, dtype=np.float64))
        for w, c in zip(self.weights, self.components, strict=True):
            f = c.sf(x)
            if f is None:
                return None
            total += w * f
        return total

    def support_upper(self) -> float:
        return max(c.support_upper() for c in self.components)
