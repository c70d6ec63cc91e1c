"""Cost of a microbatch from its sequence (document) lengths: c = a * sum(d^2) + b * sum(d) + c0.

Attention inside each document grows with the square of its length, everything else (projections,
MLP, norms) linearly with the number of tokens, and each microbatch pays a fixed overhead ``c0``
(kernel launches, pipeline send/receive). ``fit_cost`` fits a, b, c0 from measured microbatch times
by least squares with non-negative coefficients (exact: every active set of three unknowns is tried).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from laggard.mitigate._errors import error

Cost = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class CostModel:
    """c(d) = a * d^2 + b * d + c0 for one sequence; a microbatch costs c0 + sum(a d^2 + b d)."""

    a: float = 1.0
    b: float = 0.0
    c0: float = 0.0

    def __post_init__(self) -> None:
        for name in ("a", "b", "c0"):
            v = getattr(self, name)
            if not isinstance(v, int | float | np.floating | np.integer) or not math.isfinite(v) or v < 0:
                raise error(f"CostModel: {name} must be a finite number >= 0, got {v!r}")

    def doc_costs(self, lengths: Any) -> np.ndarray:
        """Per-document part (no ``c0``): a * d^2 + b * d, float64, vectorised."""
        d = np.asarray(lengths, dtype=np.float64)
        return (self.a * d + self.b) * d

    def __call__(self, d: Any) -> Any:
        """c(d): the cost of a microbatch that holds one sequence of length ``d`` (arrays elementwise)."""
        out = self.doc_costs(d) + self.c0
        return float(out) if np.ndim(out) == 0 else out

    def microbatch_cost(self, seq_lens: Any) -> float:
        """c0 + sum over the microbatch's sequences of a d^2 + b d."""
        return float(self.c0 + self.doc_costs(seq_lens).sum())

    def to_json(self) -> dict[str, float]:
        return {"a": float(self.a), "b": float(self.b), "c0": float(self.c0)}


def doc_costs(lengths: np.ndarray, cost: CostModel | Cost | None) -> tuple[np.ndarray, float]:
    """Per-document costs and the per-bin constant for ``cost`` (None: attention-dominated d^2)."""
    d = np.asarray(lengths)
    if cost is None:
        f = d.astype(np.float64)
        return f * f, 0.0
    if isinstance(cost, CostModel):
        return cost.doc_costs(d), float(cost.c0)
    if not callable(cost):
        raise error(f"cost must be None, a CostModel or a callable on a length, got {type(cost).__name__}")
    try:
        out = np.asarray(cost(d.astype(np.float64)), dtype=np.float64)
        if out.shape != d.shape:
            raise ValueError
    except (TypeError, ValueError):  # a scalar-only callable
        out = np.array([float(cost(int(x))) for x in d.tolist()], dtype=np.float64)
    if len(out) and (not np.isfinite(out).all() or (out < 0).any()):
        raise error("cost: the cost callable returned a negative or non-finite value")
    return out, 0.0


# below this R^2 the sequence lengths explain less than half of how op durations vary: a balance
# planned on the model would move work by a cost the measurements do not follow (the fit is said
# unreliable, not hidden)
MIN_USEFUL_R2 = 0.5


@dataclass(kw_only=True, slots=True)
class CostFit:
    """A fitted cost model and how well it explains the measurements."""

    model: CostModel
    r2: float
    num_samples: int
    rmse: float
    quadratic: bool = True

    @property
    def reliable(self) -> bool:
        """Whether the lengths explain most of the durations' variance (``MIN_USEFUL_R2``)."""
        return math.isfinite(self.r2) and self.r2 >= MIN_USEFUL_R2

    def to_json(self) -> dict[str, Any]:
        return {**self.model.to_json(), "r2": _finite(self.r2), "num_samples": self.num_samples,
                "rmse": _finite(self.rmse), "quadratic": self.quadratic, "reliable": self.reliable}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def features(seq_lens: Sequence[Sequence[int]] | Sequence[np.ndarray]) -> np.ndarray:
    """(n, 3) design matrix: sum d^2, sum d and 1 per microbatch (vectorised over a ragged list)."""
    counts = np.fromiter((len(s) for s in seq_lens), dtype=np.int64, count=len(seq_lens))
    flat = (np.concatenate([np.asarray(s, dtype=np.float64).ravel() for s in seq_lens])
            if len(counts) else np.zeros(0))
    if len(flat) and (not np.isfinite(flat).all() or (flat < 0).any()):
        raise error("fit_cost: sequence lengths must be finite and >= 0")
    seg = np.repeat(np.arange(len(counts)), counts)
    x = np.zeros((len(counts), 3), dtype=np.float64)
    x[:, 0] = np.bincount(seg, weights=flat * flat, minlength=len(counts))
    x[:, 1] = np.bincount(seg, weights=flat, minlength=len(counts))
    x[:, 2] = 1.0
    return x


def nnls_small(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients >= 0 for a handful of columns: best of every active set."""
    n, k = x.shape
    scale = np.sqrt((x * x).sum(axis=0))
    scale[scale == 0] = 1.0
    xs = x / scale
    best, best_res = np.zeros(k), float(y @ y)
    for r in range(1, k + 1):
        for cols in itertools.combinations(range(k), r):
            sub = xs[:, cols]
            coef, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if (coef < 0).any():
                continue
            res = y - sub @ coef
            rr = float(res @ res)
            if rr < best_res * (1 - 1e-12):
                best_res = rr
                best = np.zeros(k)
                best[list(cols)] = coef
    return best / scale


def fit_cost(seq_lens: Sequence[Sequence[int]] | Sequence[np.ndarray], times: Sequence[float] | np.ndarray, *,
             quadratic: bool = True, intercept: bool = True) -> CostFit:
    """Fit c = a sum(d^2) + b sum(d) + c0 to measured microbatch ``times`` (any unit; the model keeps it).

    ``seq_lens[i]`` are the sequence lengths packed into microbatch ``i``. ``quadratic=False`` fits only
    b and c0 (when a trace carries token counts but not the lengths of the sequences).
    """
    y = np.asarray(times, dtype=np.float64).ravel()
    if len(seq_lens) != len(y):
        raise error(f"fit_cost: {len(seq_lens)} microbatches but {len(y)} times")
    if not np.isfinite(y).all():
        raise error("fit_cost: times must be finite")
    keep = [quadratic, True, intercept]
    num_free = sum(keep)
    if len(y) < num_free:
        raise error(f"fit_cost: need at least {num_free} microbatches to fit {num_free} coefficients, got {len(y)}")
    x = features(seq_lens)
    coef = np.zeros(3)
    coef[keep] = nnls_small(x[:, keep], y)
    pred = x @ coef
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res <= 1e-24 else 0.0)
    return CostFit(model=CostModel(float(coef[0]), float(coef[1]), float(coef[2])), r2=r2,
                   num_samples=len(y), rmse=math.sqrt(ss_res / len(y)), quadratic=quadratic)


__all__ = ["CostFit", "CostModel", "doc_costs", "fit_cost"]
