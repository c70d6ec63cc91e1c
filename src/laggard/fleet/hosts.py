"""The fleet per host: which machines keep showing up as the straggler across jobs ("lemon nodes").

Read from ``fleet.parquet`` alone (each row's ``hosts``: rank -> host, and its findings), a row
group at a time. For every host: the jobs it ran in (analyzed jobs whose trace names it), the jobs
in which a finding about a machine named one of its ranks, and the GPU-hours its slowness cost the
job: each such finding's share of the job's wasted GPU-hours (shares over 1 in total scaled down,
as the fleet's by-cause split does), divided among the hosts it names by their number of named
ranks. All of a job's GPUs wait for a straggler, so that is what its slowness cost the other ranks
(a hang's window is not a straggler's: the waste is taken outside it, as goodput does).
A host named in at least ``chronic_min_jobs`` jobs and in ``chronic_share`` of its jobs is chronic;
named in one job, a one-off; between, occasional; never, clean. Hosts are ranked by the GPU-hours
they cost, then by how often they were named. ``write_hosts`` writes the table as ``hosts.parquet``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from laggard.errors import LaggardError
from laggard.fleet.config import FleetConfig
from laggard.fleet.goodput import job_goodput

HOSTS_FILE = "hosts.parquet"
HOSTS_SCHEMA = pa.schema([
    ("rank", pa.int64()),  # 1 = the host that cost the most
    ("host", pa.string()),
    ("verdict", pa.string()),  # chronic | occasional | one-off | clean
    ("num_jobs", pa.int64()),  # analyzed jobs it ran in
    ("num_named", pa.int64()),  # of them, jobs in which a finding named one of its ranks
    ("named_share", pa.float64()),
    ("gpu_hours_cost", pa.float64()),  # the job GPU-hours its slowness cost (see the module)
    ("causes", pa.list_(pa.string())),  # the causes of the findings that named it, most frequent first
    ("gpus", pa.list_(pa.string())),  # GPU UUIDs (or PCI bus ids) its ranks used, where traced
    ("jobs", pa.list_(pa.string())),
    ("named_jobs", pa.list_(pa.string())),
])


@dataclass(kw_only=True, slots=True)
class HostRow:
    host: str
    num_jobs: int = 0
    num_named: int = 0
    gpu_hours_cost: float = 0.0
    verdict: str = "clean"
    causes: dict[str, int] = field(default_factory=dict)
    gpus: set[str] = field(default_factory=set)
    jobs: list[str] = field(default_factory=list)
    named_jobs: list[str] = field(default_factory=list)

    @property
    def named_share(self) -> float:
        return self.num_named / self.num_jobs if self.num_jobs else 0.0

    def to_json(self, rank: int) -> dict[str, Any]:
        return {"rank": rank, "host": self.host, "verdict": self.verdict, "num_jobs": self.num_jobs,
                "num_named": self.num_named, "named_share": self.named_share, "gpu_hours_cost": self.gpu_hours_cost,
                "causes": sorted(self.causes, key=lambda c: -self.causes[c]), "gpus": sorted(self.gpus),
                "jobs": self.jobs, "named_jobs": self.named_jobs}


@dataclass(kw_only=True, slots=True)
class HostsView:
    hosts: list[HostRow]  # ranked
    num_jobs_with_hosts: int  # analyzed jobs whose trace names its hosts
    num_jobs_without_hosts: int  # analyzed jobs that do not (left out of this view)

    def to_json(self, top: int | None = None) -> dict[str, Any]:
        return {"num_jobs_with_hosts": self.num_jobs_with_hosts, "num_jobs_without_hosts": self.num_jobs_without_hosts,
                "hosts": [h.to_json(i) for i, h in enumerate(self.hosts[:top], 1)]}


def host_view(parquet: str | Path, config: FleetConfig | None = None) -> HostsView:
    """The per-host view of the fleet results in ``parquet`` (see the module)."""
    cfg = config or FleetConfig()
    try:
        f = pq.ParquetFile(parquet)
        if "hosts" not in f.schema_arrow.names:  # written before hosts were recorded: no host is known
            return HostsView(hosts=[], num_jobs_with_hosts=0, num_jobs_without_hosts=f.metadata.num_rows)
        have = set(f.schema_arrow.names)
        cols = ["job", "status", "gpu_hours", "gpu_hours_wasted", "findings", "hosts", "gpu_hours_hung",
                "gpu_hours_hung_traced"]
        rows: dict[str, HostRow] = {}
        with_hosts = without = 0
        for batch in f.iter_batches(batch_size=4096, columns=[c for c in cols if c in have]):
            data = {n: batch.column(i).to_pylist() for i, n in enumerate(batch.schema.names)}
            for i in range(batch.num_rows):
                r = {c: data[c][i] if c in data else None for c in cols}
                if r["status"] != "ok":
                    continue
                if not r["hosts"]:
                    without += 1
                    continue
                with_hosts += 1
                _add_job(rows, r["job"], _straggler_loss(r), r["findings"] or [], r["hosts"], cfg)
    except (OSError, pa.ArrowException) as e:
        raise LaggardError(f"{parquet}: cannot read fleet results ({str(e).splitlines()[0]})") from None
    for h in rows.values():
        h.verdict = _verdict(h, cfg)
    ranked = sorted(rows.values(), key=lambda h: (-h.gpu_hours_cost, -h.num_named, -h.named_share, h.host))
    return HostsView(hosts=ranked, num_jobs_with_hosts=with_hosts, num_jobs_without_hosts=without)


def _straggler_loss(r: dict[str, Any]) -> float:
    """The job's GPU-hours lost to stragglers: its waste less a hang's window (laggard.fleet.goodput)."""
    gh, ghw = r["gpu_hours"], r["gpu_hours_wasted"]
    if gh is None or ghw is None:
        return 0.0
    return job_goodput(gh, ghw, r["gpu_hours_hung"] or 0.0, r["gpu_hours_hung_traced"] or 0.0).stragglers


def _add_job(rows: dict[str, HostRow], job: str, lost: float, findings: list[dict[str, Any]],
             hosts: list[dict[str, Any]], cfg: FleetConfig) -> None:
    """One analyzed job's part of every host's numbers."""
    host_of: dict[int, str] = {}
    for e in hosts:
        name = e.get("host") or e.get("gpu_uuid")  # one GPU is one place when no host name is known
        if name:
            host_of[int(e["rank"])] = name
            row = rows.setdefault(name, HostRow(host=name))
            gpu = e.get("gpu_uuid") or e.get("pci_bus_id")
            if gpu:
                row.gpus.add(gpu)
    for name in dict.fromkeys(host_of.values()):
        rows[name].num_jobs += 1
        rows[name].jobs.append(job)
    shares = [min(max(f.get("score") or 0.0, 0.0), 1.0) for f in findings]
    scale = 1.0 / sum(shares) if sum(shares) > 1.0 else 1.0
    named: set[str] = set()
    for f, share in zip(findings, shares, strict=True):
        if f.get("cause") not in cfg.host_causes:
            continue
        ranks = [int(w["rank"]) for w in f.get("workers") or []]
        if not ranks:
            continue
        for name in {host_of[r] for r in ranks if r in host_of}:
            k = sum(1 for r in ranks if host_of.get(r) == name)
            rows[name].gpu_hours_cost += lost * share * scale * k / len(ranks)
            rows[name].causes[f["cause"]] = rows[name].causes.get(f["cause"], 0) + 1
            named.add(name)
    for name in sorted(named):
        rows[name].num_named += 1
        rows[name].named_jobs.append(job)


def _verdict(h: HostRow, cfg: FleetConfig) -> str:
    if h.num_named == 0:
        return "clean"
    if h.num_named >= cfg.chronic_min_jobs and h.named_share >= cfg.chronic_share:
        return "chronic"
    return "one-off" if h.num_named == 1 else "occasional"


def write_hosts(view: HostsView, out_dir: str | Path) -> Path:
    """``hosts.parquet`` in ``out_dir``: one row per host, ranked (written even when empty)."""
    p = Path(out_dir) / HOSTS_FILE
    rows = [h.to_json(i) for i, h in enumerate(view.hosts, 1)]
    try:
        pq.write_table(pa.Table.from_pylist(rows, schema=HOSTS_SCHEMA), p)
    except OSError as e:
        raise LaggardError(f"{p}: cannot write the per-host table ({e.strerror or e})") from None
    return p


__all__ = ["HOSTS_FILE", "HOSTS_SCHEMA", "HostRow", "HostsView", "host_view", "write_hosts"]
