"""Goodput: of the GPU-hours a job (and the fleet) ran, how many were productive, how many were lost
to stragglers (by cause) and how many to hangs.

Per job (the fleet task fills the row's ``gpu_hours_productive`` and ``goodput`` with
:func:`job_goodput`): the traced steps' GPU-hours (``gpu_hours``) plus the part of a hang's window
(``laggard.hang.window``: hang, desync, missing ranks; from the dumps beside the trace) outside
them are the job's GPU-hours; the hang's whole window is lost to the hang; the stragglers' loss is
the analysis' wasted GPU-hours less their share in the hang's window (a hung step is a hang, not a
straggler: the analysis sees it as one very slow step), and the rest is productive.
Across the fleet (:func:`fleet_goodput`, read back from ``fleet.parquet`` a row group at a time):
the sums over analyzed jobs, the stragglers' loss split by cause with each job's findings (shares
over 1 scaled down, as the by-cause split of ``laggard.fleet.stats``), and the jobs that lost most.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from laggard.errors import LaggardError

NOT_EXPLAINED = "not explained by a finding"
WORST_JOBS = 10  # jobs listed by GPU-hours lost (stragglers and hangs)


@dataclass(kw_only=True, slots=True)
class JobGoodput:
    total: float  # GPU-hours: traced steps plus a hang's window outside them
    stragglers: float
    hangs: float
    productive: float

    @property
    def goodput(self) -> float:
        return self.productive / self.total if self.total > 0 else float("nan")


def job_goodput(gpu_hours: float, wasted: float, hung: float = 0.0, hung_traced: float = 0.0) -> JobGoodput:
    """One job's split (see the module): ``hung`` the hang window's GPU-hours, ``hung_traced`` its
    part inside the traced steps."""
    gpu_hours, wasted = max(gpu_hours, 0.0), max(wasted, 0.0)
    in_trace = min(max(hung_traced, 0.0), gpu_hours)
    hung = max(hung, in_trace)
    stragglers = wasted * (1.0 - in_trace / gpu_hours) if gpu_hours > 0 else 0.0
    stragglers = min(stragglers, gpu_hours - in_trace)
    total = gpu_hours + hung - in_trace
    return JobGoodput(total=total, stragglers=stragglers, hangs=hung, productive=max(total - hung - stragglers, 0.0))


@dataclass(kw_only=True, slots=True)
class FleetGoodput:
    gpu_hours: float = 0.0
    productive: float = 0.0
    stragglers: float = 0.0
    hangs: float = 0.0
    stragglers_by_cause: dict[str, float] = field(default_factory=dict)
    num_jobs: int = 0  # analyzed jobs with a known size
    num_hung_jobs: int = 0
    hang_verdicts: dict[str, int] = field(default_factory=dict)
    worst_jobs: list[dict[str, Any]] = field(default_factory=list)  # by GPU-hours lost

    @property
    def goodput(self) -> float:
        return self.productive / self.gpu_hours if self.gpu_hours > 0 else float("nan")

    def to_json(self) -> dict[str, Any]:
        g = self.goodput
        return {"gpu_hours": self.gpu_hours, "productive": self.productive, "stragglers": self.stragglers,
                "hangs": self.hangs, "goodput": g if math.isfinite(g) else None,
                "stragglers_by_cause": self.stragglers_by_cause, "num_jobs": self.num_jobs,
                "num_hung_jobs": self.num_hung_jobs, "hang_verdicts": self.hang_verdicts, "worst_jobs": self.worst_jobs}


_COLUMNS = ["job", "status", "gpu_hours", "gpu_hours_wasted", "findings", "gpu_hours_hung", "gpu_hours_hung_traced",
            "hang_verdict"]


def fleet_goodput(parquet: str | Path, *, worst: int = WORST_JOBS) -> FleetGoodput:
    """The fleet's goodput from its results (see the module)."""
    out = FleetGoodput()
    heap: list[tuple[float, int, dict[str, Any]]] = []
    try:
        f = pq.ParquetFile(parquet)
        have = set(f.schema_arrow.names)
        n = 0
        for batch in f.iter_batches(batch_size=4096, columns=[c for c in _COLUMNS if c in have]):
            cols = {name: batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}
            for i in range(batch.num_rows):
                row = {c: (cols[c][i] if c in cols else None) for c in _COLUMNS}
                lost = _add_job(out, row)
                if lost is not None:
                    item = (lost[0], n, lost[1])
                    if len(heap) < worst:
                        heapq.heappush(heap, item)
                    else:
                        heapq.heappushpop(heap, item)
                n += 1
    except (OSError, pa.ArrowException) as e:
        raise LaggardError(f"{parquet}: cannot read fleet results ({str(e).splitlines()[0]})") from None
    out.stragglers_by_cause = dict(sorted(out.stragglers_by_cause.items(), key=lambda kv: -kv[1]))
    out.worst_jobs = [j for _, _, j in sorted(heap, key=lambda t: (-t[0], t[1]))]
    return out


def _add_job(out: FleetGoodput, row: dict[str, Any]) -> tuple[float, dict[str, Any]] | None:
    """Add one row; returns (GPU-hours lost, the job's line) for an analyzed job of known size."""
    gh, ghw = row["gpu_hours"], row["gpu_hours_wasted"]
    if row["status"] != "ok" or gh is None or ghw is None or not (math.isfinite(gh) and math.isfinite(ghw)):
        return None
    g = job_goodput(gh, ghw, row["gpu_hours_hung"] or 0.0, row["gpu_hours_hung_traced"] or 0.0)
    out.num_jobs += 1
    out.gpu_hours += g.total
    out.productive += g.productive
    out.stragglers += g.stragglers
    out.hangs += g.hangs
    if row["hang_verdict"]:
        out.num_hung_jobs += 1
        out.hang_verdicts[row["hang_verdict"]] = out.hang_verdicts.get(row["hang_verdict"], 0) + 1
    shares = [(x["cause"], min(max(x.get("score") or 0.0, 0.0), 1.0)) for x in row["findings"] or []]
    total = sum(s for _, s in shares)
    scale = 1.0 / total if total > 1.0 else 1.0
    by_cause = out.stragglers_by_cause
    for cause, s in shares:
        by_cause[cause] = by_cause.get(cause, 0.0) + g.stragglers * s * scale
    by_cause[NOT_EXPLAINED] = by_cause.get(NOT_EXPLAINED, 0.0) + g.stragglers * max(0.0, 1.0 - total * scale)
    line = {"job": row["job"], "gpu_hours": g.total, "productive": g.productive, "stragglers": g.stragglers,
            "hangs": g.hangs, "goodput": g.goodput if math.isfinite(g.goodput) else None,
            "hang_verdict": row["hang_verdict"]}
    return g.stragglers + g.hangs, line


__all__ = ["FleetGoodput", "JobGoodput", "fleet_goodput", "job_goodput"]
