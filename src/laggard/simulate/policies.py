"""Synchronisation policies against stragglers, each with its cost: parse, simulate, compare.

=================  ==========================================================  ===================
spec               what it does                                                cost reported
=================  ==========================================================  ===================
bsp                barrier every step (the reference)                          -
backup:B           B backup copies of every worker's task, first one wins      (B+1)x compute
speculate[:M,Q]    Spark-style: after a fraction Q of tasks finished, copy     extra compute of the
                   tasks running past M x the median (M=1.5, Q=0.75)           copies
drop:M             the barrier waits for the fastest K-M workers               M/K of the gradient
overdecomp:P       P pieces per worker, handed out dynamically                 -
ssp:S              stale-synchronous: at most S steps ahead of the slowest     staleness <= S
async              no barrier at all                                           unbounded staleness
=================  ==========================================================  ===================

Parameters may also be given by name: ``backup:copies=1``, ``speculate:multiplier=2,quantile=0.9``.
Single-step policies share their random draws with BSP (common random numbers), so differences
between them are not blurred by sampling noise. SSP and async simulate runs of ``num_steps`` steps
(trials / num_steps runs, so every policy sees about the same number of worker-steps).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laggard.errors import LaggardError
from laggard.simulate import kernels
from laggard.simulate.base import Distribution
from laggard.simulate.engine import run_chunked, seed_sequence
from laggard.simulate.tail import MAX_WORKERS, check_seed, check_trials

KINDS = ("bsp", "backup", "speculate", "drop", "overdecomp", "ssp", "async")
_ALIASES = {
    "barrier": "bsp",
    "backups": "backup",
    "spec": "speculate",
    "speculation": "speculate",
    "drop-slowest": "drop",
    "overdecompose": "overdecomp",
    "over-decomposition": "overdecomp",
    "stale": "ssp",
    "asp": "async",
    "asynchronous": "async",
}
# name -> (parameter names in positional order, defaults)
_PARAMS: dict[str, tuple[tuple[str, ...], dict[str, float]]] = {
    "bsp": ((), {}),
    "backup": (("copies",), {"copies": 1}),
    "speculate": (("multiplier", "quantile"), {"multiplier": 1.5, "quantile": 0.75}),
    "drop": (("m",), {"m": 1}),
    "overdecomp": (("pieces",), {"pieces": 4}),
    "ssp": (("staleness",), {"staleness": 3}),
    "async": ((), {}),
}
_INT_PARAMS = {"copies", "m", "pieces", "staleness"}
DEFAULT_POLICIES = ("bsp", "backup:1", "speculate", "drop:1", "overdecomp:4", "ssp:3", "async")
DEFAULT_TRIALS = 20_000
DEFAULT_STEPS = 100
# Chunk sizing, in float64 values per trial per worker. Single-step policies share one layout so
# that they see the same draws (common random numbers); ssp and async share theirs, so async is
# exactly ssp with a bound beyond the run length.
_SINGLE_STEP_ELEMS = 4
_MULTI_STEP_ELEMS = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class Policy:
    kind: str
    copies: int = 0
    multiplier: float = 1.5
    quantile: float = 0.75
    num_drop: int = 0
    pieces: int = 1
    staleness: int | None = None  # None with kind == "async": unbounded

    @property
    def multi_step(self) -> bool:
        return self.kind in ("ssp", "async")

    def label(self) -> str:
        match self.kind:
            case "backup":
                return f"backup:{self.copies}"
            case "speculate":
                return f"speculate:{self.multiplier:g},{self.quantile:g}"
            case "drop":
                return f"drop:{self.num_drop}"
            case "overdecomp":
                return f"overdecomp:{self.pieces}"
            case "ssp":
                return f"ssp:{self.staleness}"
        return self.kind


def parse_policy(spec: str, *, where: str = "--policy") -> Policy:
    """``backup:1``, ``speculate:multiplier=2``, ``ssp:3``... -> Policy (LaggardError if malformed)."""
    if not isinstance(spec, str) or not spec.strip():
        raise LaggardError(f"{where}: empty policy (known: {', '.join(KINDS)})")
    name, _, body = spec.strip().partition(":")
    name = _ALIASES.get(name.strip().lower(), name.strip().lower())
    if name not in _PARAMS:
        raise LaggardError(f"{where} {spec!r}: unknown policy {name!r} (known: {', '.join(KINDS)})")
    order, defaults = _PARAMS[name]
    values: dict[str, float] = dict(defaults)
    items = [x.strip() for x in body.split(",")] if body.strip() else []
    if len(items) > len(order):
        raise LaggardError(f"{where} {spec!r}: {name} takes at most {len(order)} parameter(s)"
                           + (f" ({', '.join(order)})" if order else ""))
    seen: set[str] = set()
    for pos, item in enumerate(items):
        key, eq, val = item.partition("=")
        if eq:
            key = key.strip().lower()
            if key not in order:
                raise LaggardError(f"{where} {spec!r}: unknown parameter {key!r} for {name}"
                                   + (f" (known: {', '.join(order)})" if order else ""))
        else:
            key, val = order[pos], item
        if key in seen:
            raise LaggardError(f"{where} {spec!r}: parameter {key!r} given twice")
        seen.add(key)
        try:
            v = float(val)
        except ValueError:
            raise LaggardError(f"{where} {spec!r}: {key} must be a number, got {val.strip()!r}") from None
        if key in _INT_PARAMS and (not v.is_integer()):
            raise LaggardError(f"{where} {spec!r}: {key} must be a whole number, got {val.strip()!r}")
        values[key] = v
    rules = {
        "copies": (lambda v: 1 <= v <= 16, "an integer in 1..16"),
        "m": (lambda v: v >= 1, "an integer >= 1"),
        "pieces": (lambda v: 1 <= v <= 256, "an integer in 1..256"),
        "staleness": (lambda v: 0 <= v <= 100_000, "an integer >= 0"),
        "multiplier": (lambda v: 1.0 <= v <= 100, "a number >= 1"),
        "quantile": (lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
    }
    for key, v in values.items():
        ok, rule = rules[key]
        if not (math.isfinite(v) and ok(v)):
            raise LaggardError(f"{where} {spec!r}: {key} must be {rule}, got {v:g}")
    match name:
        case "backup":
            return Policy(kind=name, copies=int(values["copies"]))
        case "speculate":
            return Policy(kind=name, multiplier=values["multiplier"], quantile=values["quantile"])
        case "drop":
            return Policy(kind=name, num_drop=int(values["m"]))
        case "overdecomp":
            return Policy(kind=name, pieces=int(values["pieces"]))
        case "ssp":
            return Policy(kind=name, staleness=int(values["staleness"]))
    return Policy(kind=name)


@dataclass(kw_only=True, slots=True)
class PolicyRow:
    policy: str
    mean: float  # mean step (barrier) time
    p99: float
    idle_fraction: float
    compute_multiplier: float
    gradient_lost: float = 0.0  # share of the gradient left out of each update
    staleness: int | None = 0  # bound on how stale a gradient may be, in steps; None: unbounded
    barrier_cut: float = 0.0  # 1 - mean / mean(BSP)
    verdict: str = ""
    stderr: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "mean": self.mean,
            "p99": self.p99,
            "idle_fraction": self.idle_fraction,
            "compute_multiplier": self.compute_multiplier,
            "gradient_lost": self.gradient_lost,
            "staleness": self.staleness,
            "barrier_cut": self.barrier_cut,
            "verdict": self.verdict,
            "stderr": self.stderr,
            **self.extra,
        }


@dataclass(kw_only=True, slots=True)
class PolicyResult:
    dist: str
    spec: str
    num_workers: int
    num_trials: int
    num_steps: int
    seed: int
    rows: list[PolicyRow]
    source: dict[str, Any] = field(default_factory=dict)

    def row(self, label: str) -> PolicyRow:
        for r in self.rows:
            if r.policy == label:
                return r
        raise KeyError(label)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "dist": self.dist,
            "spec": self.spec,
            "workers": self.num_workers,
            "trials": self.num_trials,
            "steps": self.num_steps,
            "seed": self.seed,
            "rows": [r.to_json() for r in self.rows],
        }
        if self.source:
            out["source"] = self.source
        return out


def verdict(row: PolicyRow, kind: str) -> str:
    """One phrase: does the policy shorten the barrier, and at what cost."""
    if kind == "bsp":
        return "baseline"
    cut = row.barrier_cut
    if cut < -0.01:
        gain = f"hurts: barrier {-cut:.0%} longer"
    elif cut < 0.02:
        gain = "no real gain"
    elif cut < 0.10:
        gain = f"barely helps: barrier {cut:.1%} shorter"
    else:
        gain = f"cuts the barrier by {cut:.0%}"
    costs = []
    if row.compute_multiplier > 1.005:
        costs.append(f"{row.compute_multiplier:.3g}x compute")
    if row.gradient_lost > 0:
        costs.append(f"{row.gradient_lost:.2%} of the gradient lost")
    if kind == "async":
        costs.append("unbounded staleness")
    elif row.staleness:
        costs.append(f"gradients up to {row.staleness} steps stale")
    return gain + (f" ({'; '.join(costs)})" if costs else "")


def _simulate(policy: Policy, dist: Distribution, k: int, num_trials: int, num_steps: int, seed: int,
              threads: int | None, chunk_elems: int | None) -> PolicyRow:
    ss = seed_sequence(seed, k)  # the same stream for every single-step policy: common random numbers
    kind = policy.kind
    if policy.multi_step:
        num_runs = max(2, math.ceil(num_trials / num_steps))
        stale = policy.staleness if kind == "ssp" else None

        def kernel(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
            return kernels.stale_synchronous(dist, rng, n, k, num_steps, stale)

        per_trial = num_steps * k * _MULTI_STEP_ELEMS
        out = run_chunked(kernel, num_runs, per_trial, seed_sequence(seed, k, 1), threads=threads,
                          chunk_elems=chunk_elems)
        inc = out["increments"].reshape(-1)
        p99 = float(np.quantile(inc, 0.99))
    else:
        per_trial = k * _SINGLE_STEP_ELEMS
        match kind:
            case "bsp":
                def kernel(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
                    return kernels.bsp(dist, rng, n, k)
            case "backup":
                def kernel(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
                    return kernels.backup(dist, rng, n, k, policy.copies)
                per_trial = k * max(_SINGLE_STEP_ELEMS, policy.copies + 2)
            case "speculate":
                def kernel(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
                    return kernels.speculate(dist, rng, n, k, policy.multiplier, policy.quantile)
            case "drop":
                def kernel(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
                    return kernels.drop(dist, rng, n, k, policy.num_drop)
            case "overdecomp":
                def kernel(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
                    return kernels.overdecompose(dist, rng, n, k, policy.pieces)
                per_trial = k * (2 * policy.pieces + 4) * 4
            case _:  # pragma: no cover - parse_policy only makes the kinds above
                raise ValueError(kind)
        out = run_chunked(kernel, num_trials, per_trial, ss, threads=threads, chunk_elems=chunk_elems)
        p99 = float(np.quantile(out["step"], 0.99))
    step = out["step"]
    busy, useful, capacity = (float(out[x].sum()) for x in ("busy", "useful", "capacity"))
    row = PolicyRow(
        policy=policy.label(),
        mean=float(step.mean()),
        p99=p99,
        idle_fraction=max(0.0, 1.0 - busy / capacity) if capacity > 0 else 0.0,
        compute_multiplier=busy / useful if useful > 0 else 1.0,
        gradient_lost=policy.num_drop / k if kind == "drop" else 0.0,
        staleness=None if kind == "async" else (policy.staleness or 0),
        stderr=float(step.std(ddof=1) / math.sqrt(step.size)),
    )
    if kind == "speculate":
        row.extra["copies_per_step"] = float(out["num_copies"].mean())
    return row


def compare_policies(
    dist: Distribution,
    num_workers: int,
    policies: Sequence[Policy | str] = DEFAULT_POLICIES,
    *,
    num_trials: int = DEFAULT_TRIALS,
    num_steps: int = DEFAULT_STEPS,
    seed: int = 0,
    threads: int | None = None,
    chunk_elems: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> PolicyResult:
    """Simulate each policy for a job of ``num_workers`` workers; BSP is added as the reference.
    ``on_progress(done, total)``: policies simulated."""
    k = num_workers
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= MAX_WORKERS:
        raise LaggardError(f"--workers: need one worker count in 1..{MAX_WORKERS}, got {k!r}")
    k = int(k)
    num_trials = check_trials(num_trials)
    seed = check_seed(seed)
    if isinstance(num_steps, bool) or not isinstance(num_steps, int | np.integer) or not 2 <= num_steps <= 100_000:
        raise LaggardError(f"--steps: need an integer in 2..100000, got {num_steps!r}")
    parsed = [parse_policy(p) if isinstance(p, str) else p for p in policies]
    if not parsed:
        raise LaggardError("--policy: give at least one policy")
    for p in parsed:
        if p.kind == "drop" and p.num_drop >= k:
            raise LaggardError(f"--policy {p.label()}: cannot drop {p.num_drop} of {k} workers (need fewer than {k})")
    if not any(p.kind == "bsp" for p in parsed):
        parsed.insert(0, Policy(kind="bsp"))
    first: dict[str, Policy] = {}
    for p in parsed:
        first.setdefault(p.label(), p)
    unique = list(first.values())
    rows = []
    for i, p in enumerate(unique):
        if on_progress is not None:
            on_progress(i, len(unique))
        rows.append(_simulate(p, dist, k, num_trials, int(num_steps), seed, threads, chunk_elems))
    if on_progress is not None:
        on_progress(len(unique), len(unique))
    base = next(r for r, p in zip(rows, unique, strict=True) if p.kind == "bsp")
    for r, p in zip(rows, unique, strict=True):
        r.barrier_cut = 1.0 - r.mean / base.mean if base.mean > 0 else 0.0
        r.verdict = verdict(r, p.kind)
    return PolicyResult(dist=dist.describe(), spec=dist.spec(), num_workers=k, num_trials=num_trials,
                        num_steps=int(num_steps), seed=seed, rows=rows)
