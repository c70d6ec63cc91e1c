"""Empirical worker-time distributions from a trace laggard has read.

Per-worker times come from the op table: by default the sum of compute-op durations of each
(rank, step); ``level=op`` takes single ops instead (one value per rank and (step, microbatch,
chunk)), ``name=`` keeps only ops of these names. The matrix of times t[w, s] (worker w,
step s) is split into three parts that are resampled separately:

* a persistent per-worker offset m_w (the worker's mean: a slow GPU stays slow),
* a step effect c_s shared by all workers in the step (mean over workers of t - m),
* per-worker noise e[w, s] = t[w, s] - m_w - c_s.

A job of K workers is drawn by *tiling* the measured offsets (each measured worker appears K // W
times, the remainder is a random subset: the job grows with the same share of slow workers), one
step effect per step and one noise value per worker and step. At K = W this reproduces the
measured barrier. ``sample()`` (iid draws) takes a random offset, step effect and noise per draw.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from laggard.errors import LaggardError, LaggardWarning
from laggard.simulate.base import MIN_TIME, Distribution

LEVELS = ("step", "op")


@dataclass(kw_only=True, slots=True)
class WorkerTimes:
    """Per-worker times from a trace: ``times_s[w, s]`` for worker ``ranks[w]`` and sample ``s``."""

    times_s: np.ndarray
    ranks: np.ndarray
    level: str
    what: str  # e.g. "sum of compute op durations per (rank, step)"
    num_dropped: int = 0  # steps (or op instances) left out because some worker had no op in them

    @property
    def num_workers(self) -> int:
        return int(self.times_s.shape[0])

    @property
    def num_samples(self) -> int:
        return int(self.times_s.shape[1])

    def measured_barrier_s(self) -> float:
        """Mean over samples of the slowest worker's time: the measured barrier (compute only)."""
        return float(self.times_s.max(axis=0).mean())


def _dict_mask(col: pa.ChunkedArray | pa.Array, wanted: set[str]) -> np.ndarray:
    """Boolean mask of rows whose (dictionary or string) value is in ``wanted``."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(arr.type):
        labels = arr.dictionary.to_pylist()
        hit = np.array([lab in wanted for lab in labels] + [False], dtype=bool)
        idx = arr.indices.fill_null(len(labels)).to_numpy(zero_copy_only=False).astype(np.int64)
        return hit[idx]
    values = np.asarray(arr.to_pylist(), dtype=object)
    return np.isin(values, list(wanted))


def _int_col(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy().astype(np.int64, copy=False)


def worker_times(
    table: pa.Table,
    *,
    level: str = "step",
    kind: str = "compute",
    names: list[str] | None = None,
    where: str = "trace",
) -> WorkerTimes:
    """Extract per-worker times (seconds) from an op table (see the module docstring)."""
    if level not in LEVELS:
        raise LaggardError(f"{where}: level must be one of {', '.join(LEVELS)}, got {level!r}")
    for col in ("rank", "step", "kind", "dur_ns", *(("microbatch", "vchunk") if level == "op" else ())):
        if col not in table.column_names:
            raise LaggardError(f"{where}: the op table has no {col!r} column")
    mask = _dict_mask(table.column("kind"), {kind})
    if names:
        mask &= _dict_mask(table.column("name"), set(names))
    what_ops = f"{kind} ops" + (f" named {', '.join(names)}" if names else "")
    if not mask.any():
        raise LaggardError(f"{where}: no {what_ops} in the trace")
    rank = _int_col(table, "rank")[mask]
    dur_s = _int_col(table, "dur_ns")[mask].astype(np.float64) * 1e-9
    if level == "step":
        key = _int_col(table, "step")[mask]
        what = f"sum of durations of {what_ops} per (rank, step)"
    else:
        keys = np.stack([_int_col(table, c)[mask] for c in ("step", "microbatch", "vchunk")], axis=1)
        _, key = np.unique(keys, axis=0, return_inverse=True)
        key = key.reshape(-1)
        what = f"durations of {what_ops}, one per (rank, step, microbatch, chunk)"
    ranks, r_idx = np.unique(rank, return_inverse=True)
    keys_u, k_idx = np.unique(key, return_inverse=True)
    num_w, num_k = ranks.size, keys_u.size
    cell = r_idx * num_k + k_idx
    total = np.bincount(cell, weights=dur_s, minlength=num_w * num_k).reshape(num_w, num_k)
    count = np.bincount(cell, minlength=num_w * num_k).reshape(num_w, num_k)
    if level == "op" and count.max() > 1:
        # several ops share a (rank, step, microbatch, chunk): treat their sum as the op time
        what += " (ops sharing a slot summed)"
    complete = (count > 0).all(axis=0)
    num_dropped = int(num_k - complete.sum())
    unit = "steps" if level == "step" else "op slots"
    if not complete.any():
        raise LaggardError(f"{where}: no {unit[:-1]} has {what_ops} on every worker; cannot build worker times")
    if num_w < 2:
        raise LaggardError(f"{where}: the trace has one worker; need at least two to separate worker and noise")
    if complete.sum() < 2:
        raise LaggardError(f"{where}: only one complete {unit[:-1]}; need at least two")
    if num_dropped:
        warnings.warn(
            f"{where}: left out {num_dropped} of {num_k} {unit} where some worker had no {what_ops}",
            LaggardWarning,
            stacklevel=2,
        )
    times = total[:, complete]
    if (times <= 0).any():
        raise LaggardError(f"{where}: some worker has zero total duration of {what_ops} in a {unit[:-1]}")
    return WorkerTimes(times_s=times, ranks=ranks, level=level, what=what, num_dropped=num_dropped)


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class EmpiricalTrace(Distribution):
    """Worker times resampled from a trace: tiled worker offsets + step effect + noise (seconds)."""

    offsets_s: np.ndarray  # (W,) persistent per-worker means
    step_effects_s: np.ndarray  # (S,) shared by all workers of a step
    noise_s: np.ndarray  # (W * S,) per-worker, per-step residuals
    floor_s: float  # the fastest measured time: no draw goes below it
    source_spec: str
    what: str
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_times(cls, wt: WorkerTimes, *, source_spec: str, info: dict[str, Any] | None = None) -> EmpiricalTrace:
        t = wt.times_s
        offsets = t.mean(axis=1)
        resid = t - offsets[:, None]
        step_eff = resid.mean(axis=0)
        noise = (resid - step_eff[None, :]).reshape(-1)
        return cls(offsets_s=offsets, step_effects_s=step_eff, noise_s=noise,
                   floor_s=max(float(t.min()), MIN_TIME), source_spec=source_spec, what=wt.what,
                   info=dict(info or {}))

    @property
    def num_workers(self) -> int:
        return int(self.offsets_s.size)

    def _finish(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(x, self.floor_s, out=x)

    def _draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        x = self.offsets_s[rng.integers(0, self.offsets_s.size, shape)]
        x += self.step_effects_s[rng.integers(0, self.step_effects_s.size, shape)]
        x += self.noise_s[rng.integers(0, self.noise_s.size, shape)]
        return self._finish(x)

    def _tiled_offsets(self, rng: np.random.Generator, num_jobs: int, num_workers: int) -> np.ndarray:
        """(num_jobs, num_workers) offsets: every measured worker K // W times, then a random subset."""
        w = self.offsets_s.size
        reps, rest = divmod(num_workers, w)
        out = np.empty((num_jobs, num_workers), dtype=np.float64)
        if reps:
            out[:, : reps * w] = np.tile(self.offsets_s, reps)[None, :]
        if rest:
            pick = np.argsort(rng.random((num_jobs, w)), axis=1)[:, :rest]
            out[:, reps * w :] = self.offsets_s[pick]
        return out

    def sample_jobs(self, rng: np.random.Generator, num_jobs: int, num_workers: int) -> np.ndarray:
        """One step of ``num_jobs`` jobs of ``num_workers`` workers: shape (num_jobs, num_workers)."""
        x = self._tiled_offsets(rng, num_jobs, num_workers)
        x += self.step_effects_s[rng.integers(0, self.step_effects_s.size, (num_jobs, 1))]
        x += self.noise_s[rng.integers(0, self.noise_s.size, (num_jobs, num_workers))]
        return self._finish(x)

    def sample_steps(
        self, rng: np.random.Generator, num_runs: int, num_steps: int, num_workers: int
    ) -> np.ndarray:
        x = np.empty((num_runs, num_steps, num_workers), dtype=np.float64)
        x[:] = self._tiled_offsets(rng, num_runs, num_workers)[:, None, :]
        x += self.step_effects_s[rng.integers(0, self.step_effects_s.size, (num_runs, num_steps, 1))]
        x += self.noise_s[rng.integers(0, self.noise_s.size, (num_runs, num_steps, num_workers))]
        return self._finish(x)

    def describe(self) -> str:
        return (f"empirical from {self.info.get('path', self.source_spec)}: {self.num_workers} workers x "
                f"{self.step_effects_s.size} samples ({self.what})")

    def spec(self) -> str:
        return self.source_spec

    def mean(self) -> float:
        # E[offset] + E[step effect] + E[noise] (the last two are zero up to the floor clipping)
        return float(self.offsets_s.mean() + self.step_effects_s.mean() + self.noise_s.mean())

    def support_upper(self) -> float:
        return float(self.offsets_s.max() + self.step_effects_s.max() + self.noise_s.max())


def trace_distribution(
    path: str | Path,
    *,
    level: str = "step",
    kind: str = "compute",
    names: list[str] | None = None,
    spec: str | None = None,
    where: str = "trace",
) -> EmpiricalTrace:
    """Load a trace with ``laggard.io.load_job`` and build its empirical worker-time distribution."""
    from laggard.io import load_job

    p = Path(path)
    job = load_job(p, fmt="auto")
    for msg in job.warnings:
        warnings.warn(f"{p}: {msg}", LaggardWarning, stacklevel=2)
    return from_table(job.table, meta=job.meta, path=str(p), level=level, kind=kind, names=names,
                      spec=spec, where=f"{where} {p}")


def from_table(
    table: pa.Table,
    *,
    meta: Any = None,
    path: str = "<table>",
    level: str = "step",
    kind: str = "compute",
    names: list[str] | None = None,
    spec: str | None = None,
    where: str = "trace",
) -> EmpiricalTrace:
    """The empirical distribution of an op table (``meta``: the job's JobMeta, optional)."""
    wt = worker_times(table, level=level, kind=kind, names=names, where=where)
    info: dict[str, Any] = {
        "path": path,
        "level": level,
        "num_workers": wt.num_workers,
        "num_samples": wt.num_samples,
        "num_dropped": wt.num_dropped,
        "what": wt.what,
        "measured_barrier_s": wt.measured_barrier_s(),
        "measured_mean_s": float(wt.times_s.mean()),
        "slowest_worker_rank": int(wt.ranks[int(np.argmax(wt.times_s.mean(axis=1)))]),
    }
    if meta is not None:
        info["dp_size"] = getattr(meta, "dp_size", None)
        info["pp_size"] = getattr(meta, "pp_size", None)
        info["num_gpus"] = getattr(meta, "num_gpus", None)
    dist = EmpiricalTrace.from_times(wt, source_spec=spec or f"trace:{path}", info=info)
    dist.info.update(
        offset_spread_s=float(dist.offsets_s.max() - dist.offsets_s.min()),
        step_effect_std_s=float(dist.step_effects_s.std()),
        noise_std_s=float(dist.noise_s.std()),
    )
    return dist


def parse_trace_spec(body: str, *, spec: str, where: str) -> EmpiricalTrace:
    """``trace:PATH`` or ``trace:path=PATH[,level=step|op][,kind=compute][,name=OP[;OP...]]``."""
    text = body.strip()
    if not text:
        raise LaggardError(f"{where} {spec!r}: give the trace path, e.g. trace:run/trace.parquet")
    opts: dict[str, str] = {}
    if text.startswith("path="):
        for item in text.split(","):
            key, eq, value = item.partition("=")
            key = key.strip().lower()
            if not eq or not value.strip():
                raise LaggardError(f"{where} {spec!r}: expected key=value, got {item!r}")
            if key not in ("path", "level", "kind", "name"):
                raise LaggardError(f"{where} {spec!r}: unknown option {key!r} (known: path, level, kind, name)")
            opts[key] = value.strip()
    else:
        opts["path"] = text
    names = [n for n in opts.get("name", "").split(";") if n] or None
    return trace_distribution(opts["path"], level=opts.get("level", "step"), kind=opts.get("kind", "compute"),
                              names=names, spec=spec.strip(), where=where)
