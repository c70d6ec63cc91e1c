"""The per-job task: the same pipeline as ``laggard analyze`` (``laggard.io.load_job`` then
``laggard.analysis.pipeline.analyze``: what-if and diagnosis), turned into a fleet row and the ``--json`` document.

Runs wherever the engine puts it (a pool process, a Ray worker): a remote job is fetched there, into
a temporary directory. Nothing a job does stops the run: every failure becomes a row with a reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from laggard.errors import LaggardError
from laggard.fleet.config import FleetConfig
from laggard.fleet.discover import JobSpec
from laggard.fleet.rows import add_goodput, analysis_row, empty_row, error_row

JOBS_DIR = "jobs"


@dataclass(kw_only=True, slots=True)
class JobResult:
    row: dict[str, Any]
    doc: bytes | None  # the analysis as `laggard analyze --json` writes it; None when it failed
    # the worker already wrote the JSON document and the row (laggard.fleet.writer.analyze_and_write)
    written: bool = False


def json_name(job: str) -> str:
    """Where a job's JSON document goes, relative to the output directory: readable and unique."""
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", job.rstrip("/"))[-80:].strip("_.")
    return f"{JOBS_DIR}/{tail}-{hashlib.sha1(job.encode()).hexdigest()[:10]}.json"


def run_batch(specs: list[JobSpec], cfg: FleetConfig) -> list[JobResult]:
    """Analyze each job of a batch in turn (the unit an engine schedules)."""
    return [run_job(s, cfg) for s in specs]


def run_job(spec: JobSpec, cfg: FleetConfig) -> JobResult:
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            # the pipeline records its warnings in the analysis (and the row counts them); a worker
            # process has no terminal to print them to
            warnings.simplefilter("ignore")
            return _analyze(spec, cfg, t0)
    except LaggardError as e:
        reason = str(e)
    except MemoryError:
        reason = "out of memory while analyzing the job"
    except Exception as e:  # a bug on one job's data must not stop a fleet of thousands
        reason = f"internal error: {type(e).__name__}: {e}".splitlines()[0]
    return JobResult(row=error_row(spec.job, spec.fmt, spec.size_bytes, reason, time.perf_counter() - t0), doc=None)


def _analyze(spec: JobSpec, cfg: FleetConfig, t0: float) -> JobResult:
    from laggard.analysis.pipeline import analyze
    from laggard.hang.window import find_hang
    from laggard.io import load_job
    from laggard.report.html import replay_error
    from laggard.report.jsonout import dumps

    with _local_copy(spec) as local:
        job = load_job(local, fmt=spec.fmt, cache=cfg.job_cache)
        hang = find_hang(local) if local.is_dir() else None  # dumps beside the trace: goodput's hang part
    num_steps = len(np.unique(job.column("step")))
    if num_steps < cfg.min_steps:
        row = empty_row(spec.job, spec.fmt, spec.size_bytes)
        row.update(status="rejected", num_steps=num_steps, num_ops=job.num_ops, wall_s=time.perf_counter() - t0,
                   error=f"too few steps: {num_steps} < {cfg.min_steps}")
        return JobResult(row=row, doc=None)
    span = _trace_span_ns(job)
    num_gpus = job.meta.num_gpus
    res = analyze(job, config=cfg.analysis)
    del job
    doc = res.to_json()
    mean_err, _ = replay_error(res)
    row = analysis_row(empty_row(spec.job, spec.fmt, spec.size_bytes), doc, replay_error=mean_err)
    add_goodput(row, hang, num_gpus=num_gpus, trace_span_ns=span)
    reason = _rejection(row, cfg)
    if reason is not None:
        row.update(status="rejected", error=reason)
    row["json"] = json_name(spec.job)
    data = dumps(doc)
    row["wall_s"] = time.perf_counter() - t0
    return JobResult(row=row, doc=data)


def _trace_span_ns(job: Any) -> tuple[int, int] | None:
    """(first start, last end) of the traced ops, ns on the job's clock (Unix time for the Tracer's)."""
    if not job.num_ops:
        return None
    start = job.column("start_ns")
    return int(start.min()), int((start + job.column("dur_ns")).max())


def _rejection(row: dict[str, Any], cfg: FleetConfig) -> str | None:
    fid = row["replay_fidelity"]
    if fid is None:
        return "replay fidelity is not a number (empty steps?)"
    if fid < cfg.min_fidelity:
        return (f"replay fidelity {fid:.3f} < {cfg.min_fidelity}: the replay takes longer than the trace; "
                "its dependency graph does not fit (clock skew, missing dependencies)")
    if fid > cfg.max_fidelity:
        return f"replay fidelity {fid:.3f} > {cfg.max_fidelity}: most of each step is untraced time"
    return None


@contextlib.contextmanager
def _local_copy(spec: JobSpec) -> Iterator[Path]:
    """The job on the local disk: its own path, or a temporary copy of a remote job."""
    if spec.protocol is None:
        yield Path(spec.path)
        return
    import fsspec

    fs, _ = fsspec.core.url_to_fs(spec.url)
    with tempfile.TemporaryDirectory(prefix="laggard-fleet-") as tmp:
        name = spec.path.rstrip("/").rsplit("/", 1)[-1] or "job"
        target = Path(tmp) / name
        try:
            if fs.isdir(spec.path):
                fs.get(spec.path.rstrip("/") + "/", str(target) + "/", recursive=True)
            else:
                fs.get(spec.path, str(target))
            for extra in spec.extra_files:
                fs.get(extra, str(Path(tmp) / extra.rsplit("/", 1)[-1]))
        except OSError as e:
            raise LaggardError(f"{spec.job}: cannot fetch ({e})") from None
        yield target
