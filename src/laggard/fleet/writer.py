"""Rows written as jobs finish: a crash loses nothing done, ``--resume`` skips what is there.

Each finished batch becomes one small Parquet part (written to a temporary name, then renamed:
a part is whole or absent) in ``DIR/.fleet-parts/``, after the batch's JSON documents. ``finalize``
streams the earlier ``fleet.parquet`` (on resume) and the parts into a new ``fleet.parquet``, one
row per job (the first row of a job wins, so a crash between the rename and the clean-up cannot
duplicate rows), in row groups of bounded size, then removes the parts.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from laggard.errors import LaggardError
from laggard.fleet.rows import SCHEMA, to_table
from laggard.fleet.task import JobResult

PARTS = ".fleet-parts"
FLEET = "fleet.parquet"
ROW_GROUP_ROWS = 8192  # rows per row group of the merged file: ~MBs of memory, reads stay columnar


class RowWriter:
    def __init__(self, out_dir: Path, *, resume: bool) -> None:
        self.out_dir = out_dir
        self.parts_dir = out_dir / PARTS
        self.final = out_dir / FLEET
        if not resume and (self.final.exists() or (self.parts_dir.exists() and any(self.parts_dir.iterdir()))):
            raise LaggardError(f"{out_dir}: holds the results of an earlier fleet run; pass --resume to "
                               "continue it, or choose another --out")
        try:
            self.parts_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LaggardError(f"{out_dir}: cannot write the results there ({e.strerror or e})") from None
        self._seq = 0
        self.num_rows = 0

    def done_jobs(self) -> set[str]:
        """Jobs that already have a row (in fleet.parquet or in a part)."""
        done: set[str] = set()
        for path in self._sources():
            for batch in _read(path, columns=["job"]):
                done.update(batch.column(0).to_pylist())
        return done

    def write(self, results: list[JobResult]) -> None:
        """JSON documents first, then the rows: a row on disk always has its document beside it."""
        for r in results:
            if r.doc is not None and r.row.get("json"):
                p = self.out_dir / r.row["json"]
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(r.doc + b"\n")
        if not results:
            return
        self._seq += 1
        name = f"part-{time.time_ns():020d}-{os.getpid()}-{self._seq:06d}.parquet"
        tmp = self.parts_dir / (name + ".tmp")
        try:
            pq.write_table(to_table([r.row for r in results]), tmp)
            os.replace(tmp, self.parts_dir / name)
        except OSError as e:
            raise LaggardError(f"{self.parts_dir}: cannot write rows ({e.strerror or e})") from None
        self.num_rows += len(results)

    def finalize(self) -> Path:
        """Merge everything into fleet.parquet (one row per job) and remove the parts."""
        tmp = self.out_dir / (FLEET + ".tmp")
        seen: set[str] = set()
        buf: list[pa.RecordBatch] = []
        buffered = 0
        with pq.ParquetWriter(tmp, SCHEMA) as w:
            for path in self._sources():
                for batch in _read(path):
                    jobs = batch.column(0).to_pylist()
                    keep = [j not in seen for j in jobs]
                    seen.update(jobs)
                    if not all(keep):
                        batch = batch.filter(pa.array(keep))
                    buf.append(batch)
                    buffered += batch.num_rows
                    if buffered >= ROW_GROUP_ROWS:
                        w.write_table(pa.Table.from_batches(buf, schema=SCHEMA), row_group_size=ROW_GROUP_ROWS)
                        buf, buffered = [], 0
            if buf:
                w.write_table(pa.Table.from_batches(buf, schema=SCHEMA), row_group_size=ROW_GROUP_ROWS)
        os.replace(tmp, self.final)
        shutil.rmtree(self.parts_dir, ignore_errors=True)
        return self.final

    def _sources(self) -> Iterator[Path]:
        if self.final.exists():
            yield self.final
        if self.parts_dir.exists():
            yield from sorted(p for p in self.parts_dir.glob("part-*.parquet"))


def _read(path: Path, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    try:
        f = pq.ParquetFile(path)
        names = set(f.schema_arrow.names)
        missing = [n for n in (columns or SCHEMA.names) if n not in names]
        if missing:
            raise LaggardError(f"{path}: not a fleet result file (no column {missing[0]!r}); choose another --out")
        for batch in f.iter_batches(batch_size=ROW_GROUP_ROWS, columns=columns or SCHEMA.names):
            if columns is None and not batch.schema.equals(SCHEMA):
                yield from pa.Table.from_batches([batch]).cast(SCHEMA).to_batches()
            else:
                yield batch
    except (OSError, pa.ArrowException) as e:
        raise LaggardError(f"{path}: cannot read earlier fleet results ({str(e).splitlines()[0]})") from None
