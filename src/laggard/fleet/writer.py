"""Rows written as jobs finish: a crash loses nothing done, ``--resume`` skips what is there.

Each finished batch becomes one small Parquet part, its rows sorted by job (written to a temporary
name, then renamed: a part is whole or absent) in ``DIR/.fleet-parts/``, after the batch's JSON
documents. On the local engine the worker that analyzed the batch writes both
(``analyze_and_write``: the driver shares no cores' worth of serialising with the workers); on Ray
the task may run on another machine, so the driver writes what the task sends back.
``finalize`` merges the earlier ``fleet.parquet`` (on resume) and the parts into a new
``fleet.parquet`` sorted by job, one row per job (a crash between the rename and the clean-up
cannot duplicate rows), in row groups of bounded size, then removes the parts.
"""

from __future__ import annotations

import heapq
import itertools
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from laggard.errors import LaggardError
from laggard.fleet.config import FleetConfig
from laggard.fleet.discover import JobSpec
from laggard.fleet.rows import SCHEMA, to_table
from laggard.fleet.task import JobResult, run_batch

PARTS = ".fleet-parts"
FLEET = "fleet.parquet"
ROW_GROUP_ROWS = 8192  # rows per row group of the merged file: ~MBs of memory, reads stay columnar
_PART_SEQ = itertools.count(1)  # part names: time, process id and this process's sequence number


def write_docs(out_dir: Path, results: list[JobResult]) -> None:
    """Each result's JSON document beside the rows (before them: a row on disk has its document)."""
    made: set[Path] = set()
    for r in results:
        if r.doc is not None and r.row.get("json"):
            p = out_dir / r.row["json"]
            if p.parent not in made:
                p.parent.mkdir(parents=True, exist_ok=True)
                made.add(p.parent)
            try:
                p.write_bytes(r.doc + b"\n")
            except OSError as e:
                raise LaggardError(f"{p}: cannot write the job's analysis ({e.strerror or e})") from None


def write_part(parts_dir: Path, rows: list[dict]) -> None:
    """One atomic Parquet part holding ``rows``, sorted by job."""
    if not rows:
        return
    rows = sorted(rows, key=lambda r: r["job"])
    name = f"part-{time.time_ns():020d}-{os.getpid()}-{next(_PART_SEQ):06d}.parquet"
    tmp = parts_dir / (name + ".tmp")
    try:
        pq.write_table(to_table(rows), tmp)
        os.replace(tmp, parts_dir / name)
    except OSError as e:
        raise LaggardError(f"{parts_dir}: cannot write rows ({e.strerror or e})") from None


def analyze_and_write(specs: list[JobSpec], cfg: FleetConfig, out_dir: str) -> list[JobResult]:
    """The worker's side of a local batch: analyze, write documents and rows, send back the rows only."""
    results = run_batch(specs, cfg)
    out = Path(out_dir)
    write_docs(out, results)
    write_part(out / PARTS, [r.row for r in results])
    for r in results:
        r.doc, r.written = None, True
    return results


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
        self.num_rows = 0

    def done_jobs(self) -> set[str]:
        """Jobs that already have a row (in fleet.parquet or in a part)."""
        done: set[str] = set()
        for path in self._sources():
            for batch in _read(path, columns=["job"]):
                done.update(batch.column(0).to_pylist())
        return done

    def write(self, results: list[JobResult]) -> None:
        """Write what the worker did not (JSON documents first, then the rows)."""
        todo = [r for r in results if not r.written]
        write_docs(self.out_dir, todo)
        write_part(self.parts_dir, [r.row for r in todo])
        self.num_rows += len(results)

    def finalize(self) -> Path:
        """Merge everything into fleet.parquet (sorted by job, one row per job) and remove the parts."""
        tmp = self.out_dir / (FLEET + ".tmp")
        buf: list[pa.RecordBatch] = []
        buffered = 0
        with pq.ParquetWriter(tmp, SCHEMA) as w:
            for batch in _merge_runs(_runs(list(self._sources()))):
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


@dataclass(slots=True)
class _Source:
    path: Path
    first: str
    last: str
    ordered: bool  # jobs strictly increasing (every file this version writes)


def _source(path: Path) -> _Source | None:
    jobs = [j for b in _read(path, columns=["job"]) for j in b.column(0).to_pylist()]
    if not jobs:
        return None
    return _Source(path, jobs[0], jobs[-1], all(a < b for a, b in itertools.pairwise(jobs)))


def _runs(paths: list[Path]) -> list[list[_Source]]:
    """Chains of sources whose job ranges follow one another (each chain reads in job order).

    The parts of one run hold consecutive batches of the sorted job list and chain into one run;
    an earlier fleet.parquet (resume) interleaves with them and makes a second. A source that is
    not in job order (written by an older laggard) is a run of its own, sorted in memory."""
    sources = [s for p in paths if (s := _source(p)) is not None]
    runs: list[list[_Source]] = [[s] for s in sources if not s.ordered]
    chained: list[list[_Source]] = []
    for s in sorted((s for s in sources if s.ordered), key=lambda s: s.first):
        for run in chained:
            if run[-1].last < s.first:
                run.append(s)
                break
        else:
            chained.append([s])
    return chained + runs


def _run_batches(run: list[_Source]) -> Iterator[pa.RecordBatch]:
    for s in run:
        if s.ordered:
            yield from _read(s.path)
        else:
            t = pa.Table.from_batches(list(_read(s.path)), schema=SCHEMA)
            jobs = t.column("job").to_pylist()
            order = sorted(range(len(jobs)), key=jobs.__getitem__)
            yield from t.take(pa.array(order, type=pa.int64())).to_batches()


def _merge_runs(runs: list[list[_Source]]) -> Iterator[pa.RecordBatch]:
    """The runs' rows merged by job, the first row of a job kept (duplicates are adjacent)."""
    if len(runs) == 1 and runs[0][0].ordered:  # the usual case: one sorted chain, no row-level work
        yield from _run_batches(runs[0])
        return

    def keyed(run: list[_Source]) -> Iterable[tuple[str, pa.RecordBatch, int]]:
        for batch in _run_batches(run):
            for i, job in enumerate(batch.column(0).to_pylist()):
                yield job, batch, i

    last_job: str | None = None
    cur: pa.RecordBatch | None = None
    start = end = 0
    for job, batch, i in heapq.merge(*(keyed(r) for r in runs), key=lambda t: t[0]):
        if job == last_job:
            continue
        last_job = job
        if batch is cur and i == end:
            end += 1
            continue
        if cur is not None:
            yield cur.slice(start, end - start)
        cur, start, end = batch, i, i + 1
    if cur is not None:
        yield cur.slice(start, end - start)


# columns a fleet.parquet written by an earlier laggard may lack (read as null: --resume goes on)
ADDED_COLUMNS = frozenset({"hosts", "hang_verdict", "gpu_hours_hung", "gpu_hours_hung_traced", "gpu_hours_productive",
                           "goodput"})


def _read(path: Path, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    try:
        f = pq.ParquetFile(path)
        names = set(f.schema_arrow.names)
        wanted = columns or SCHEMA.names
        missing = [n for n in wanted if n not in names and n not in ADDED_COLUMNS]
        if missing:
            raise LaggardError(f"{path}: not a fleet result file (no column {missing[0]!r}); choose another --out")
        later = [n for n in wanted if n not in names]  # columns added since the file was written: null
        for batch in f.iter_batches(batch_size=ROW_GROUP_ROWS, columns=[n for n in wanted if n in names]):
            for n in later:
                batch = batch.append_column(SCHEMA.field(n), pa.nulls(batch.num_rows, SCHEMA.field(n).type))
            if columns is None and not batch.schema.equals(SCHEMA):
                yield from pa.Table.from_batches([batch]).select(SCHEMA.names).cast(SCHEMA).to_batches()
            else:
                yield batch
    except (OSError, pa.ArrowException) as e:
        raise LaggardError(f"{path}: cannot read earlier fleet results ({str(e).splitlines()[0]})") from None
