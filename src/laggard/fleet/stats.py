"""The fleet's numbers, read back from ``fleet.parquet`` column by column (memory bounded: the
nested findings are streamed row group by row group, never all held at once).

Only ``ok`` rows enter the statistics; ``rejected`` and ``error`` rows are counted by reason.
GPU-hours wasted are split by cause with each job's findings (a finding's ``score`` is the share
of the job's slowdown it explains; shares above 1 in total are scaled down, the rest is
'not explained'), and by op kind with S_t of compute vs communication (each kind's excess over 1).
"""

from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from laggard.errors import LaggardError
from laggard.fleet.config import FleetConfig

TOP_JOBS = 20
NOT_EXPLAINED = "not explained by a finding"
_SCALARS = ["job", "status", "error", "slowdown", "waste", "num_gpus", "gpu_hours", "gpu_hours_wasted",
            "s_compute", "s_comm", "verdict", "top_cause"]


@dataclass(kw_only=True, slots=True)
class FleetStats:
    num_jobs: int
    by_status: dict[str, int]
    failure_reasons: dict[str, int]  # reason kind -> jobs (rejected and error rows)
    failure_examples: dict[str, str]  # reason kind -> one full message
    slowdown: np.ndarray  # ok jobs, sorted (for the CDF)
    waste: np.ndarray  # ok jobs, sorted
    straggling_share: float  # share of ok jobs with S >= straggling_slowdown
    straggling_slowdown: float
    gpu_hours: float
    gpu_hours_wasted: float
    num_without_gpu_hours: int  # ok jobs whose size is unknown (no GPU-hours)
    wasted_by_cause: dict[str, float]
    wasted_by_kind: dict[str, float]  # compute | communication | neither
    top_cause_counts: dict[str, int]  # top finding per ok job; 'healthy' when none
    size_gpus: np.ndarray  # ok jobs with a known size, aligned with size_slowdown
    size_slowdown: np.ndarray
    pearson_log_size: float | None  # correlation of S with log2(GPUs)
    spearman_size: float | None  # rank correlation of S with GPUs
    top_jobs: list[dict[str, Any]] = field(default_factory=list)  # by GPU-hours wasted, with findings

    def to_json(self) -> dict[str, Any]:
        def q(a: np.ndarray, p: float) -> float | None:
            return float(np.quantile(a, p)) if len(a) else None

        return {
            "num_jobs": self.num_jobs,
            "by_status": self.by_status,
            "failure_reasons": self.failure_reasons,
            "straggling_share": _f(self.straggling_share),
            "straggling_slowdown": self.straggling_slowdown,
            "slowdown_quantiles": {str(p): q(self.slowdown, p) for p in (0.5, 0.9, 0.99)},
            "gpu_hours": self.gpu_hours,
            "gpu_hours_wasted": self.gpu_hours_wasted,
            "wasted_by_cause": self.wasted_by_cause,
            "wasted_by_kind": self.wasted_by_kind,
            "top_cause_counts": self.top_cause_counts,
            "pearson_log_size": self.pearson_log_size,
            "spearman_size": self.spearman_size,
            "top_jobs": self.top_jobs,
        }


def _f(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def reason_kind(message: str) -> str:
    """'/a/b/x.parquet: not a readable Parquet file (magic ...)' -> 'not a readable Parquet file'."""
    msg = message.strip()
    while True:  # drop leading 'path: ' prefixes
        m = re.match(r"^\S*[/\\]\S*?:\s+", msg)
        if m is None:
            break
        msg = msg[m.end():]
    msg = (msg.split(" (", 1)[0].split(": ", 1)[0] if msg.startswith(("too few", "replay fidelity"))
           else msg.split(" (", 1)[0])
    return re.sub(r"\d+(\.\d+)?", "#", msg)[:90]


def _ranks(a: np.ndarray) -> np.ndarray:
    order = np.argsort(a, kind="stable")
    r = np.empty(len(a), dtype=float)
    r[order] = np.arange(len(a), dtype=float)
    _, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=r)
    return (sums / counts)[inv]  # ties share their average rank


def _corr(x: np.ndarray, y: np.ndarray) -> float | None:
    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return None
    return _f(float(np.corrcoef(x, y)[0, 1]))


def fleet_stats(parquet: str | Path, config: FleetConfig | None = None, *, top: int = TOP_JOBS) -> FleetStats:
    cfg = config or FleetConfig()
    try:
        f = pq.ParquetFile(parquet)
        t = f.read(columns=_SCALARS)
    except (OSError, ValueError) as e:
        raise LaggardError(f"{parquet}: cannot read fleet results ({str(e).splitlines()[0]})") from None
    status = np.array(t.column("status").to_pylist(), dtype=object)
    ok = status == "ok"

    def col(name: str) -> np.ndarray:
        return t.column(name).to_numpy(zero_copy_only=False).astype(float)

    slowdown, waste = col("slowdown"), col("waste")
    gpus, gh, ghw = col("num_gpus"), col("gpu_hours"), col("gpu_hours_wasted")
    s_c, s_m = col("s_compute"), col("s_comm")
    by_status: dict[str, int] = {}
    for s in status:
        by_status[s] = by_status.get(s, 0) + 1
    reasons: dict[str, int] = {}
    examples: dict[str, str] = {}
    for st, err in zip(status, t.column("error").to_pylist(), strict=True):
        if st != "ok" and err:
            k = f"{st}: {reason_kind(err)}"
            reasons[k] = reasons.get(k, 0) + 1
            examples.setdefault(k, err)
    S = slowdown[ok & np.isfinite(slowdown)]
    known = ok & np.isfinite(ghw)
    tops: dict[str, int] = {}
    for is_ok, c in zip(ok, t.column("top_cause").to_pylist(), strict=True):
        if is_ok:
            tops[c or "healthy"] = tops.get(c or "healthy", 0) + 1
    sized = ok & np.isfinite(gpus) & (gpus > 0) & np.isfinite(slowdown)
    wasted_by_kind = _by_kind(s_c[known], s_m[known], ghw[known])
    wasted_by_cause, top_jobs = _scan_findings(f, ok, ghw, top)
    return FleetStats(
        num_jobs=len(status),
        by_status=by_status,
        failure_reasons=dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
        failure_examples=examples,
        slowdown=np.sort(S),
        waste=np.sort(waste[ok & np.isfinite(waste)]),
        straggling_share=float(np.mean(S >= cfg.straggling_slowdown)) if len(S) else float("nan"),
        straggling_slowdown=cfg.straggling_slowdown,
        gpu_hours=float(np.nansum(gh[known])),
        gpu_hours_wasted=float(np.sum(ghw[known])),
        num_without_gpu_hours=int((ok & ~np.isfinite(ghw)).sum()),
        wasted_by_cause=wasted_by_cause,
        wasted_by_kind=wasted_by_kind,
        top_cause_counts=dict(sorted(tops.items(), key=lambda kv: -kv[1])),
        size_gpus=gpus[sized],
        size_slowdown=slowdown[sized],
        pearson_log_size=_corr(np.log2(gpus[sized]), slowdown[sized]),
        spearman_size=_corr(_ranks(gpus[sized]), _ranks(slowdown[sized])),
        top_jobs=top_jobs,
    )


def _by_kind(s_c: np.ndarray, s_m: np.ndarray, ghw: np.ndarray) -> dict[str, float]:
    ec = np.where(np.isfinite(s_c), np.maximum(s_c - 1.0, 0.0), 0.0)
    em = np.where(np.isfinite(s_m), np.maximum(s_m - 1.0, 0.0), 0.0)
    tot = ec + em
    share_c = np.divide(ec, tot, out=np.zeros_like(tot), where=tot > 0)
    share_m = np.divide(em, tot, out=np.zeros_like(tot), where=tot > 0)
    return {
        "compute": float(np.sum(ghw * share_c)),
        "communication": float(np.sum(ghw * share_m)),
        "neither": float(np.sum(ghw[tot <= 0])),
    }


def _scan_findings(f: pq.ParquetFile, ok: np.ndarray, ghw: np.ndarray,
                   top: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """One pass over the findings, a row group at a time: GPU-hours by cause, and the top jobs."""
    score = np.where(ok & np.isfinite(ghw), ghw, -np.inf)
    top_idx = set(heapq.nlargest(top, np.flatnonzero(np.isfinite(score)).tolist(), key=lambda i: score[i]))
    by_cause: dict[str, float] = {}
    top_rows: list[dict[str, Any]] = []
    offset = 0
    cols = ["job", "slowdown", "num_gpus", "gpu_hours_wasted", "findings", "json"]
    for batch in f.iter_batches(batch_size=4096, columns=cols):
        findings = batch.column(4).to_pylist()
        for j, fs in enumerate(findings):
            i = offset + j
            if not ok[i] or not np.isfinite(ghw[i]):
                continue
            shares = [(x["cause"], min(max(x["score"] or 0.0, 0.0), 1.0)) for x in fs or []]
            total = sum(s for _, s in shares)
            scale = 1.0 / total if total > 1.0 else 1.0
            for cause, s in shares:
                by_cause[cause] = by_cause.get(cause, 0.0) + ghw[i] * s * scale
            by_cause[NOT_EXPLAINED] = by_cause.get(NOT_EXPLAINED, 0.0) + ghw[i] * max(0.0, 1.0 - total * scale)
            if i in top_idx:
                top_rows.append({"job": batch.column(0)[j].as_py(), "slowdown": batch.column(1)[j].as_py(),
                                 "num_gpus": batch.column(2)[j].as_py(), "gpu_hours_wasted": float(ghw[i]),
                                 "findings": fs or [], "json": batch.column(5)[j].as_py()})
        offset += batch.num_rows
    top_rows.sort(key=lambda r: -r["gpu_hours_wasted"])
    return dict(sorted(by_cause.items(), key=lambda kv: -kv[1])), top_rows
