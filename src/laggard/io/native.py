"""The native format: a directory with ``job.json`` and one or more ``*.parquet`` op shards."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from laggard.errors import LaggardError, LaggardWarning
from laggard.io.native_layout import infer_layout
from laggard.optable.ops import Job, JobMeta, conform
from laggard.optable.partial import note_missing
from laggard.optable.tracedir import JOB_FILE, STATE_GLOB, check_trace


def read_native(path: Path) -> Job:
    meta_path = path / JOB_FILE
    try:
        meta_obj = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise LaggardError(f"{path}: no job.json (not a native laggard trace)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LaggardError(f"{meta_path}: not valid JSON ({e})") from None
    meta = JobMeta.from_json(meta_obj, where=str(meta_path))
    shards = sorted(path.glob("*.parquet"))
    if not shards:
        raise LaggardError(f"{path}: job.json but no *.parquet op shards")
    tables = []
    skipped = []
    for shard in shards:
        try:
            t = pq.ParquetFile(shard).read()
        except (OSError, pa.ArrowException) as e:
            if shard.stat().st_size == 0 and len(shards) > 1:
                skipped.append(shard.name)
                continue
            raise LaggardError(f"{shard}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
        tables.append(conform(t, str(shard)))
    if skipped:
        warnings.warn(f"{path}: skipped {len(skipped)} empty shard(s): {', '.join(skipped)}", LaggardWarning,
                      stacklevel=2)
    table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
    if table.num_rows == 0:
        raise LaggardError(f"{path}: the trace has no ops")
    job = infer_layout(Job(table=table, meta=meta))
    for problem in _missing_ranks(path, job):
        warnings.warn(problem, LaggardWarning, stacklevel=2)
    note_missing(job.meta, _absent(job))
    return job


def _absent(job: Job) -> list[int]:
    """The ranks job.json's world size has that wrote no op (each worker's first rank)."""
    meta = job.meta
    if meta.world_size is None:
        return []
    import numpy as np

    have = set(np.unique(job.column("rank")).tolist())
    return [r for r in range(0, meta.world_size, max(meta.gpus_per_worker, 1)) if r not in have]


def _missing_ranks(path: Path, job: Job) -> list[str]:
    """Ranks the job should have but that wrote nothing (or died): the tracer's heartbeat files
    say so precisely; otherwise compare with the world size in job.json."""
    if list(path.glob(STATE_GLOB)):
        return [f"{path}: {line}" for line in check_trace(path)]
    meta = job.meta
    if meta.world_size is None:
        return []
    expected = meta.world_size // max(meta.gpus_per_worker, 1)
    import numpy as np

    have = np.unique(job.column("rank"))
    if len(have) >= expected:
        return []
    ranks = set(have.tolist())
    step = max(meta.gpus_per_worker, 1)
    missing = [r for r in range(0, meta.world_size, step) if r not in ranks]
    shown = ", ".join(str(r) for r in missing[:8]) + (" ..." if len(missing) > 8 else "")
    return [f"{path}: {len(missing)} of {expected} ranks have no ops (ranks {shown}); "
            "the analysis covers the others only"]
