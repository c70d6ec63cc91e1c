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

from laggard.errors import LaggardError, LaggardWarning
from laggard.simulate.base import MIN_TIME, Distribution, harmonic
from laggard.simulate.parametric import Constant, Exponential, Gaussian, LogNormal, Mixture, Pareto, Uniform

__all__ = [
    "MIN_TIME", "TEXTBOOK", "KNOWN", "Distribution", "parse_dist", "harmonic",
    "Constant", "Exponential", "Gaussian", "LogNormal", "Mixture", "Pareto", "Uniform",
]


# ---------------------------------------------------------------------------------------------
# parsing


@dataclass(frozen=True, slots=True)
class _Rule:
    text: str  # as the error message says it
    check: Callable[[float], bool]


_POSITIVE = _Rule("> 0", lambda v: v > 0)
_NONNEG = _Rule(">= 0", lambda v: v >= 0)
_ANY = _Rule("a number", lambda v: True)


@dataclass(frozen=True, slots=True)
class _Param:
    attr: str
    default: float
    rule: _Rule


_BASE = _Param("base", 0.0, _NONNEG)  # the fixed cost every shifted distribution adds
_PARAMS: dict[str, dict[str, _Param]] = {
    "constant": {"value": _Param("value", 1.0, _POSITIVE)},
    "lognormal": {"base": _BASE, "mean": _Param("mu", 0.0, _ANY), "sigma": _Param("sigma", 1.0, _POSITIVE)},
    "exponential": {"base": _BASE, "rate": _Param("rate", 1.0, _POSITIVE)},
    "gaussian": {"mean": _Param("mu", 1.0, _POSITIVE), "std": _Param("std", 0.05, _NONNEG),
                 "min": _Param("low", 0.0, _NONNEG)},
    "pareto": {"base": _BASE, "scale": _Param("scale", 1.0, _POSITIVE), "alpha": _Param("alpha", 3.0, _POSITIVE)},
    "uniform": {"low": _Param("low", 0.5, _NONNEG), "high": _Param("high", 1.5, _POSITIVE)},
}
_CLASSES: dict[str, type[Distribution]] = {
    "constant": Constant,
    "lognormal": LogNormal,
    "exponential": Exponential,
    "gaussian": Gaussian,
    "pareto": Pareto,
    "uniform": Uniform,
}
# the parameter that sets a distribution's spread (and so every tail figure): said when left to its default
_SPREAD = {"gaussian": "std", "lognormal": "sigma", "pareto": "alpha"}
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
        if not p.rule.check(v):
            raise _err(spec, where, f"{key} must be {p.rule.text}, got {value}")
        kwargs[p.attr] = v
    for p in params.values():
        kwargs.setdefault(p.attr, p.default)
    spread = _SPREAD.get(name)
    if spread is not None and spread not in raw:  # the spread sets every tail figure: never silently
        warnings.warn(f"{where} {spec!r}: {spread} not given, using {params[spread].default:g}; "
                      f"give {spread}= to choose it", LaggardWarning, stacklevel=3)
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
