"""Tail at scale: how the barrier (the max of K worker times) grows with the number of workers K."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laggard.errors import LaggardError
from laggard.simulate import theory
from laggard.simulate.base import Distribution
from laggard.simulate.engine import run_chunked, seed_sequence

DEFAULT_WORKERS = (1, 2, 4, 16, 64, 256, 1024)
DEFAULT_TRIALS = 200_000
MAX_WORKERS = 1 << 20


@dataclass(kw_only=True, slots=True)
class TailRow:
    """One job size: the barrier's mean and p99 over the trials, and its slowdown vs one worker."""

    num_workers: int
    mean: float
    p99: float
    slowdown: float
    stderr: float
    exact_mean: float | None = None  # closed form or numerical integral, when the dist has one
    vs_reference: float | None = None  # mean / mean at the reference size (trace projections)


@dataclass(kw_only=True, slots=True)
class TailResult:
    dist: str
    spec: str
    num_trials: int
    seed: int
    single_worker_mean: float
    rows: list[TailRow]
    reference_workers: int | None = None  # e.g. the measured job size of a trace
    source: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        rows = []
        for r in self.rows:
            row: dict[str, Any] = {"workers": r.num_workers, "mean": r.mean, "p99": r.p99, "slowdown": r.slowdown,
                                   "stderr": r.stderr, "exact_mean": r.exact_mean}
            if self.reference_workers is not None:
                row["vs_reference"] = r.vs_reference
            rows.append(row)
        out: dict[str, Any] = {
            "dist": self.dist,
            "spec": self.spec,
            "trials": self.num_trials,
            "seed": self.seed,
            "single_worker_mean": self.single_worker_mean,
            "rows": rows,
        }
        if self.reference_workers is not None:
            out["reference_workers"] = self.reference_workers
        if self.source:
            out["source"] = self.source
        return out


def check_workers(workers: Sequence[int], where: str = "--workers") -> list[int]:
    if not workers:
        raise LaggardError(f"{where}: give at least one worker count")
    out = []
    for k in workers:
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= MAX_WORKERS:
            raise LaggardError(f"{where}: worker counts must be integers in 1..{MAX_WORKERS}, got {k!r}")
        out.append(int(k))
    return out


MAX_TRIALS = 100_000_000


def check_trials(num_trials: int, where: str = "--trials") -> int:
    if isinstance(num_trials, bool) or not isinstance(num_trials, int | np.integer) or num_trials < 100:
        raise LaggardError(f"{where}: need at least 100 trials, got {num_trials!r}")
    if num_trials > MAX_TRIALS:
        raise LaggardError(f"{where}: at most {MAX_TRIALS} trials (the per-trial results are kept), got {num_trials}")
    return int(num_trials)


def check_seed(seed: int, where: str = "--seed") -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise LaggardError(f"{where}: the seed must be an integer >= 0, got {seed!r}")
    return int(seed)


def barrier_times(
    dist: Distribution,
    num_workers: int,
    num_trials: int,
    seed: int,
    *,
    threads: int | None = None,
    chunk_elems: int | None = None,
) -> np.ndarray:
    """The max of ``num_workers`` iid draws, once per trial (float64, shape ``(num_trials,)``)."""

    def kernel(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        return {"max": dist.sample_max(rng, n, num_workers)}

    ss = seed_sequence(seed, num_workers)
    return run_chunked(kernel, num_trials, num_workers, ss, threads=threads, chunk_elems=chunk_elems)["max"]


def tail_at_scale(
    dist: Distribution,
    workers: Sequence[int] = DEFAULT_WORKERS,
    *,
    num_trials: int = DEFAULT_TRIALS,
    seed: int = 0,
    threads: int | None = None,
    chunk_elems: int | None = None,
    reference_workers: int | None = None,
    exact: bool = True,
    on_progress: Callable[[int, int], None] | None = None,
) -> TailResult:
    """E[max], p99 and slowdown vs one worker for each job size in ``workers``.

    Each size uses its own random stream (derived from ``seed`` and the size), so adding a size
    to the list does not change the others. ``exact`` adds the closed form / numerical integral
    of E[max] where the distribution has one. ``on_progress(done, total)``: job sizes simulated.
    """
    ks = check_workers(list(workers))
    num_trials = check_trials(num_trials)
    seed = check_seed(seed)
    means: dict[int, tuple[float, float, float]] = {}
    sizes = sorted(set(ks) | {1} | ({reference_workers} if reference_workers else set()))
    for i, k in enumerate(sizes):
        if on_progress is not None:
            on_progress(i, len(sizes))
        m = barrier_times(dist, k, num_trials, seed, threads=threads, chunk_elems=chunk_elems)
        means[k] = (float(m.mean()), float(np.quantile(m, 0.99)), float(m.std(ddof=1) / math.sqrt(m.size)))
    if on_progress is not None:
        on_progress(len(sizes), len(sizes))
    single = means[1][0]
    rows = []
    for k in ks:
        mean, p99, se = means[k]
        ex = None
        if exact:
            ex = dist.expected_max(k)
            if ex is None:
                ex = theory.expected_max(dist, k)
        ref = means[reference_workers][0] if reference_workers else None
        rows.append(TailRow(num_workers=k, mean=mean, p99=p99, slowdown=mean / single, stderr=se, exact_mean=ex,
                            vs_reference=(mean / ref) if ref else None))
    return TailResult(dist=dist.describe(), spec=dist.spec(), num_trials=num_trials, seed=seed,
                      single_worker_mean=single, rows=rows, reference_workers=reference_workers)
