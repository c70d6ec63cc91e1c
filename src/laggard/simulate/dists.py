"""Worker-time distributions and their command-line specs.

A distribution gives positive per-worker step times (any unit; the textbook model is unit-free).
Specs are ``NAME:key=value,...``:

=============  ==================================================================  ==============
spec           model                                                               defaults
=============  ==================================================================  ==============
constant       ``value``                                                           value=1
lognormal      ``base + exp(N(mean, sigma))`` (the textbook: base=1,mean=-0.7,     base=0,mean=0,
               sigma=0.9; ``textbook`` is an alias for it)                         sigma=1
exponential    ``base + Exp(rate)`` (``mean=`` may replace ``rate=``)              base=0,rate=1
gaussian       ``N(mean, std)`` clipped below at ``min`` (and at a tiny positive   mean=1,std=0.05,
               floor); ``normal`` is an alias                                      min=0
pareto         ``base + scale * U**(-1/alpha)`` (Pareto type I, tail index alpha)  base=0,scale=1,
                                                                                   alpha=3
uniform        ``U(low, high)``                                                    low=0.5,high=1.5
mixture        ``W1*DIST1(k=v,...)+W2*DIST2(...)``: pick a component per draw with   (one weight may
               probability W (weights are normalised; one may be left out and gets   be left out)
               the rest), e.g. rare big delays:
               ``mixture:0.99*gaussian(mean=1,std=0.05)+0.01*constant(value=5)``
trace          ``trace:PATH`` or ``trace:path=PATH,kind=compute,name=OP``: empirical
               per-worker step times of a job laggard can read (see ``empirical``)
=============  ==================================================================  ==============

``parse_dist(spec)`` returns a :class:`Distribution`; its API (``sample(rng, shape)``,
``describe()``) is used by other parts of laggard (collectives straggler injection), keep it stable.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from laggard.ops import LaggardError, LaggardWarning

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


@dataclass(frozen=True, kw_only=True, slots=True)
class Constant(Distribution):
    value: float = 1.0

    def _draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return np.full(shape, self.value, dtype=np.float64)

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


_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _norm_sf(z: np.ndarray) -> np.ndarray:
    """P(Z > z) for a standard normal, accurate far into the upper tail."""
    return 0.5 * _erfc(np.asarray(z, dtype=np.float64) / math.sqrt(2.0))


@dataclass(frozen=True, kw_only=True, slots=True)
class LogNormal(Distribution):
    """``base + exp(N(mean, sigma))``: a fixed cost plus a heavy-ish tail."""

    base: float = 0.0
    mu: float = 0.0
    sigma: float = 1.0

    def _draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        out = rng.standard_normal(shape)
        out *= self.sigma
        out += self.mu
        np.exp(out, out=out)
        if self.base:
            out += self.base
        return np.maximum(out, MIN_TIME, out=out)

    def describe(self) -> str:
        head = f"{self.base:g} + " if self.base else ""
        return f"{head}lognormal(mean={self.mu:g}, sigma={self.sigma:g})"

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
class Exponential(Distribution):
    """``base + Exp(rate)``; E[max of K] = base + H_K / rate."""

    base: float = 0.0
    rate: float = 1.0

    def _draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        out = rng.standard_exponential(shape)
        out *= 1.0 / self.rate
        out += max(self.base, MIN_TIME)
        return out

    def describe(self) -> str:
        head = f"{self.base:g} + " if self.base else ""
        return f"{head}exponential(rate={self.rate:g})"

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
class Gaussian(Distribution):
    """``N(mean, std)`` clipped below at ``low`` (a light tail)."""

    mu: float = 1.0
    std: float = 0.05
    low: float = 0.0

    def _draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        out = rng.standard_normal(shape)
        out *= self.std
        out += self.mu
        return np.maximum(out, max(self.low, MIN_TIME), out=out)

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
class Pareto(Distribution):
    """``base + scale * U**(-1/alpha)``: power-law tail with index alpha (mean infinite if alpha <= 1)."""

    base: float = 0.0
    scale: float = 1.0
    alpha: float = 3.0

    def _draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        # numpy's pareto() is the Lomax form (Pareto type II shifted to 0): add 1 for type I.
        out = rng.pareto(self.alpha, shape)
        out += 1.0
        out *= self.scale
        if self.base:
            out += self.base
        return out

    def describe(self) -> str:
        head = f"{self.base:g} + " if self.base else ""
        return f"{head}pareto(scale={self.scale:g}, alpha={self.alpha:g})"

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
class Uniform(Distribution):
    low: float = 0.5
    high: float = 1.5

    def _draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        out = rng.random(shape)
        out *= self.high - self.low
        out += self.low
        return np.maximum(out, MIN_TIME, out=out)

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


def harmonic(n: int) -> float:
    """H_n = 1 + 1/2 + ... + 1/n."""
    return float(np.sum(1.0 / np.arange(1, n + 1, dtype=np.float64))) if n > 0 else 0.0


# ---------------------------------------------------------------------------------------------
# parsing


@dataclass(frozen=True, kw_only=True, slots=True)
class _Param:
    attr: str
    default: float
    check: Callable[[float], bool]
    rule: str


def _positive(v: float) -> bool:
    return v > 0


def _nonneg(v: float) -> bool:
    return v >= 0


def _any(v: float) -> bool:
    return True


_PARAMS: dict[str, dict[str, _Param]] = {
    "constant": {"value": _Param(attr="value", default=1.0, check=_positive, rule="> 0")},
    "lognormal": {
        "base": _Param(attr="base", default=0.0, check=_nonneg, rule=">= 0"),
        "mean": _Param(attr="mu", default=0.0, check=_any, rule="a number"),
        "sigma": _Param(attr="sigma", default=1.0, check=_positive, rule="> 0"),
    },
    "exponential": {
        "base": _Param(attr="base", default=0.0, check=_nonneg, rule=">= 0"),
        "rate": _Param(attr="rate", default=1.0, check=_positive, rule="> 0"),
    },
    "gaussian": {
        "mean": _Param(attr="mu", default=1.0, check=_positive, rule="> 0"),
        "std": _Param(attr="std", default=0.05, check=_nonneg, rule=">= 0"),
        "min": _Param(attr="low", default=0.0, check=_nonneg, rule=">= 0"),
    },
    "pareto": {
        "base": _Param(attr="base", default=0.0, check=_nonneg, rule=">= 0"),
        "scale": _Param(attr="scale", default=1.0, check=_positive, rule="> 0"),
        "alpha": _Param(attr="alpha", default=3.0, check=_positive, rule="> 0"),
    },
    "uniform": {
        "low": _Param(attr="low", default=0.5, check=_nonneg, rule=">= 0"),
        "high": _Param(attr="high", default=1.5, check=_positive, rule="> 0"),
    },
}
_CLASSES: dict[str, type[Distribution]] = {
    "constant": Constant,
    "lognormal": LogNormal,
    "exponential": Exponential,
    "gaussian": Gaussian,
    "pareto": Pareto,
    "uniform": Uniform,
}
_ALIASES = {"normal": "gaussian", "exp": "exponential", "const": "constant"}
_PRESETS = {"textbook": "lognormal:base=1.0,mean=-0.7,sigma=0.9"}
KNOWN = (*_CLASSES, "mixture", "trace", *_PRESETS)

TEXTBOOK = _PRESETS["textbook"]


def _err(spec: str, where: str, msg: str) -> LaggardError:
    return LaggardError(f"{where} {spec!r}: {msg}")


def _parse_kv(body: str, spec: str, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    if not body.strip():
        return out
    for item in body.split(","):
        key, eq, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not eq or not key or not value:
            raise _err(spec, where, f"expected key=value, got {item.strip()!r}")
        if key in out:
            raise _err(spec, where, f"parameter {key!r} given twice")
        out[key] = value
    return out


def _number(key: str, value: str, spec: str, where: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise _err(spec, where, f"{key} must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise _err(spec, where, f"{key} must be finite, got {value!r}")
    return v


def _parametric(name: str, body: str, spec: str, where: str) -> Distribution:
    params = _PARAMS[name]
    raw = _parse_kv(body, spec, where)
    if name == "exponential" and "mean" in raw:
        if "rate" in raw:
            raise _err(spec, where, "give rate= or mean=, not both")
        m = _number("mean", raw.pop("mean"), spec, where)
        if m <= 0:
            raise _err(spec, where, f"mean must be > 0, got {m:g}")
        raw["rate"] = repr(1.0 / m)
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in params:
            raise _err(spec, where, f"unknown parameter {key!r} for {name} (known: {', '.join(params)})")
        p = params[key]
        v = _number(key, value, spec, where)
        if not p.check(v):
            raise _err(spec, where, f"{key} must be {p.rule}, got {value}")
        kwargs[p.attr] = v
    for p in params.values():
        kwargs.setdefault(p.attr, p.default)
    if name == "uniform" and not kwargs["high"] > kwargs["low"]:
        raise _err(spec, where, "high must be greater than low")
    if name == "gaussian" and kwargs["low"] >= kwargs["mu"] and kwargs["std"] > 0:
        raise _err(spec, where, "min must be below mean")
    if name == "pareto" and kwargs["alpha"] <= 1:
        warnings.warn(
            f"{where} {spec!r}: alpha <= 1 has an infinite mean; simulated means will not converge",
            LaggardWarning,
            stacklevel=3,
        )
    return _CLASSES[name](**kwargs)


def _split_top(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _mixture(body: str, spec: str, where: str) -> Mixture:
    if body.count("(") != body.count(")"):
        raise _err(spec, where, "unbalanced parentheses in mixture")
    terms = [t.strip() for t in _split_top(body, "+")]
    if len(terms) < 2 or any(not t for t in terms):
        raise _err(spec, where, "a mixture needs at least two terms: W1*DIST1(k=v,...)+W2*DIST2(...)")
    weights: list[float | None] = []
    comps: list[Distribution] = []
    for term in terms:
        weight_txt, star, rest = term.partition("*")
        if star and "(" not in weight_txt:
            w = _number("weight", weight_txt.strip(), spec, where)
            if not 0 < w:
                raise _err(spec, where, f"mixture weights must be > 0, got {weight_txt.strip()}")
            weights.append(w)
        else:
            rest = term
            weights.append(None)
        rest = rest.strip()
        name, paren, args = rest.partition("(")
        if paren and not args.endswith(")"):
            raise _err(spec, where, f"mixture term {term!r}: expected DIST(k=v,...)")
        inner = f"{name.strip()}:{args[:-1]}" if paren else name.strip()
        if name.strip().lower() in ("mixture", "trace"):
            raise _err(spec, where, f"mixture term {term!r}: components must be parametric")
        comps.append(parse_dist(inner, where=f"{where} (mixture term)"))
    missing = [i for i, w in enumerate(weights) if w is None]
    given = sum(w for w in weights if w is not None)
    if len(missing) > 1:
        raise _err(spec, where, "at most one mixture term may leave out its weight")
    if missing:
        if given >= 1:
            raise _err(spec, where, "the given weights already sum to 1 or more; nothing left for the other term")
        weights[missing[0]] = 1.0 - given
    total = sum(w for w in weights if w is not None)
    norm = tuple(float(w) / total for w in weights if w is not None)
    return Mixture(components=tuple(comps), weights=norm)


def parse_dist(spec: str, *, where: str = "distribution") -> Distribution:
    """Turn a spec such as ``lognormal:base=1.0,mean=-0.7,sigma=0.9`` into a Distribution.

    Raises LaggardError (one line naming the spec and the problem) on a bad spec.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise LaggardError(f"{where}: empty distribution spec (try {TEXTBOOK!r})")
    text = spec.strip()
    name, _, body = text.partition(":")
    name = name.strip().lower()
    name = _ALIASES.get(name, name)
    if name in _PRESETS:
        if body.strip():
            raise _err(spec, where, f"{name} takes no parameters (it is {_PRESETS[name]})")
        return parse_dist(_PRESETS[name], where=where)
    if name in _PARAMS:
        return _parametric(name, body, spec, where)
    if name == "mixture":
        return _mixture(body, spec, where)
    if name == "trace":
        from laggard.simulate.empirical import parse_trace_spec

        return parse_trace_spec(body, spec=spec, where=where)
    raise _err(spec, where, f"unknown distribution {name!r} (known: {', '.join(KNOWN)})")
