"""The native format: a directory with ``job.json`` and one or more ``*.parquet`` op shards."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from laggard.ops import Job, JobMeta, LaggardError, LaggardWarning, conform


def read_native(path: Path) -> Job:
    meta_path = path / "job.json"
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
    return Job(table=table, meta=meta)
