"""The op table: one Arrow row per op on one worker, and the job metadata that travels with it.

Everything downstream (graph, replay, what-if, reports) reads only this table. Importers
(``laggard.io``) produce it; the native format stores it as ``job.json`` plus Parquet shards.

Schema (units in names; -1 means "not applicable" for integer ids):

========== ============== ===============================================================
column     type           meaning
========== ============== ===============================================================
op_id      int64          unique id of the op within the job (``deps`` refer to it)
rank       int32          global rank of the worker that ran the op
dp_rank    int32          data-parallel coordinate of the worker
pp_rank    int32          pipeline stage of the worker
tp_rank    int32          tensor-parallel coordinate (-1 when not traced per TP rank)
cp_rank    int32          context-parallel / other coordinate (-1 when unused)
vchunk     int32          virtual pipeline chunk (model chunk) the op belongs to, -1 if none
step       int64          training step
microbatch int32          microbatch id, -1 for per-step ops
name       string         op type, e.g. ``forward-compute``, ``grads-reduce-scatter``
kind       string         one of ``KINDS``: compute, collective, p2p_send, p2p_recv, other,
                          host (untraced host time between traced ops, see ``laggard.engine.gaps``)
stream     string         the worker-local stream the op ran on (ordered within a stream)
start_ns   int64          start time, ns, on a clock shared by all ranks of the job
dur_ns     int64          measured duration, ns (>= 0)
group      string|null    communication group: ops with equal (step, group, seq) are the
                          participants of one collective or the two ends of one p2p transfer
seq        int64          sequence number within ``group`` (-1 when ``group`` is null)
peer       int32          peer rank of a p2p op, -1 otherwise
size_bytes int64|null     payload size of a communication op
num_tokens int64|null     tokens processed by the op (compute ops of a microbatch)
seq_lens   list<int32>    sequence (document) lengths in the microbatch, or null
deps       list<int64>    op_ids this op waits for on its own worker; null means "the
                          previous op on the same stream" (inferred by ``laggard.engine.graph``)
========== ============== ===============================================================
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from laggard.errors import LaggardError
from laggard.util.ranges import parse_ranges

SCHEMA_VERSION = 1

KINDS = ("compute", "collective", "p2p_send", "p2p_recv", "other", "host")
COMM_KINDS = frozenset({"collective", "p2p_send", "p2p_recv"})
# op names of garbage-collection pauses (the tracer records each collection as an op "gc")
GC_OP_NAMES = frozenset({"gc", "python-gc", "gc-collect"})


def is_gc_name(name: str) -> bool:
    return name.lower() in GC_OP_NAMES

OP_SCHEMA = pa.schema(
    [
        pa.field("op_id", pa.int64(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("dp_rank", pa.int32(), nullable=False),
        pa.field("pp_rank", pa.int32(), nullable=False),
        pa.field("tp_rank", pa.int32(), nullable=False),
        pa.field("cp_rank", pa.int32(), nullable=False),
        pa.field("vchunk", pa.int32(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("microbatch", pa.int32(), nullable=False),
        pa.field("name", pa.dictionary(pa.int32(), pa.string()), nullable=False),
        pa.field("kind", pa.dictionary(pa.int8(), pa.string()), nullable=False),
        pa.field("stream", pa.dictionary(pa.int32(), pa.string()), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("dur_ns", pa.int64(), nullable=False),
        pa.field("group", pa.dictionary(pa.int32(), pa.string()), nullable=True),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("peer", pa.int32(), nullable=False),
        pa.field("size_bytes", pa.int64(), nullable=True),
        pa.field("num_tokens", pa.int64(), nullable=True),
        pa.field("seq_lens", pa.list_(pa.int32()), nullable=True),
        pa.field("deps", pa.list_(pa.int64()), nullable=True),
    ]
)
REQUIRED_COLUMNS = ("rank", "step", "name", "kind", "start_ns", "dur_ns")
# Columns a producer may leave out; they are filled with these defaults.
_DEFAULTS: dict[str, Any] = {
    "dp_rank": None,  # defaults to rank
    "pp_rank": 0,
    "tp_rank": -1,
    "cp_rank": -1,
    "vchunk": -1,
    "microbatch": -1,
    "stream": "main",
    "group": None,
    "seq": -1,
    "peer": -1,
    "size_bytes": None,
    "num_tokens": None,
    "seq_lens": None,
    "deps": None,
}


# ``JobMeta.extra`` key: the share of a step over which an importer took idle gaps out of compute ops
# (they are host time, before the op), absent where it did not (laggard.io.kineto.segments)
HOST_GAP_CUT_KEY = "host_gaps_cut_share"


@dataclass(kw_only=True, slots=True)
class JobMeta:
    """Job-wide metadata: the parallel layout and where the trace came from."""

    name: str = "job"
    world_size: int | None = None
    dp_size: int = 1
    pp_size: int = 1
    tp_size: int = 1
    cp_size: int = 1
    vpp_size: int = 1
    # Layout dimensions no trace sees (each worker in the trace stands for all of them): NDTimeline's
    # dsp (data-sequence parallel) and expert parallelism; like tp and cp they multiply the GPU
    # count, never the DP ranks.
    dsp_size: int = 1
    ep_size: int = 1
    gpus_per_worker: int = 1
    source: str = "native"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in ("dp_size", "pp_size", "tp_size", "cp_size", "vpp_size", "dsp_size", "ep_size", "gpus_per_worker"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise LaggardError(f"job metadata: {f} must be a positive integer, got {v!r}")
        if self.world_size is not None and (not isinstance(self.world_size, int) or self.world_size < 1):
            raise LaggardError(f"job metadata: world_size must be a positive integer, got {self.world_size!r}")

    @property
    def num_gpus(self) -> int:
        if self.world_size is not None:
            return self.world_size
        return self.dp_size * self.pp_size * self.tp_size * self.cp_size * self.dsp_size * self.ep_size

    def parallel_sizes(self) -> dict[str, int]:
        return {
            "dp": self.dp_size,
            "pp": self.pp_size,
            "tp": self.tp_size,
            "cp": self.cp_size,
            "dsp": self.dsp_size,
            "ep": self.ep_size,
            "vpp": self.vpp_size,
            "world_size": self.num_gpus,
        }

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["schema_version"] = SCHEMA_VERSION
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any], where: str = "job.json") -> JobMeta:
        if not isinstance(d, dict):
            raise LaggardError(f"{where}: expected a JSON object")
        version = d.get("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise LaggardError(f"{where}: schema_version {version} is not supported "
                               f"(this laggard reads {SCHEMA_VERSION})")
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        extra = {k: v for k, v in d.items() if k not in known and k != "schema_version"}
        kwargs.setdefault("extra", {}).update(extra)
        try:
            return cls(**kwargs)
        except TypeError as e:
            raise LaggardError(f"{where}: {e}") from None


def _dict_array(values: Any, index_type: pa.DataType) -> pa.Array:
    """Dictionary-encode strings (numpy/list) or re-type a dictionary array, without pyarrow.compute."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if isinstance(values, pa.DictionaryArray):
        if values.type.index_type == index_type and pa.types.is_string(values.type.value_type):
            return values
        idx = _indices(values)
        labels = [str(x) for x in values.dictionary.to_pylist()]
        return pa.DictionaryArray.from_arrays(
            pa.array(np.where(idx >= 0, idx, 0).astype(numpy_dtype(index_type)), mask=idx < 0),
            pa.array(labels, type=pa.string()),
        )
    if isinstance(values, pa.Array):
        values = values.to_numpy(zero_copy_only=False)
    arr = np.asarray(values, dtype=object)
    valid = np.array([v is not None for v in arr], dtype=bool) if arr.size else np.zeros(0, dtype=bool)
    labels, inv = np.unique(arr[valid].astype(str), return_inverse=True)
    idx = np.zeros(len(arr), dtype=numpy_dtype(index_type))
    idx[valid] = inv
    return pa.DictionaryArray.from_arrays(
        pa.array(idx, mask=~valid if not valid.all() else None), pa.array(labels.tolist(), type=pa.string())
    )


def make_table(columns: dict[str, Any], *, num_rows: int | None = None) -> pa.Table:
    """Build a schema-conforming op table from columns (numpy arrays, lists or Arrow arrays).

    Missing optional columns get their defaults; ``op_id`` defaults to 0..n-1.
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise LaggardError(f"op table: missing required column(s) {', '.join(missing)}")
    n = len(columns["rank"]) if num_rows is None else num_rows
    arrays = []
    for fld in OP_SCHEMA:
        name = fld.name
        if name in columns and columns[name] is not None:
            v = columns[name]
        elif name == "op_id":
            v = np.arange(n, dtype=np.int64)
        elif name == "dp_rank":
            v = columns["rank"]
        else:
            default = _DEFAULTS[name]
            if default is None:
                arrays.append(pa.nulls(n, type=fld.type))
                continue
            if isinstance(default, str):  # one label: its dictionary as _dict_array would make it, no n strings
                index = pa.array(np.zeros(n, dtype=numpy_dtype(fld.type.index_type)), type=fld.type.index_type)
                arrays.append(pa.DictionaryArray.from_arrays(index, pa.array([default], type=pa.string())))
                continue
            v = np.full(n, default)
        if pa.types.is_dictionary(fld.type):
            arrays.append(_dict_array(v, fld.type.index_type))
        elif isinstance(v, pa.ChunkedArray | pa.Array):
            arrays.append(v if v.type == fld.type else v.cast(fld.type))
        elif pa.types.is_list(fld.type):
            arrays.append(pa.array(v, type=fld.type))
        else:
            arrays.append(pa.array(np.asarray(v).astype(numpy_dtype(fld.type), copy=False), type=fld.type))
    return pa.Table.from_arrays(arrays, schema=OP_SCHEMA)


def conform(table: pa.Table, where: str) -> pa.Table:
    """Check a table read from disk against the schema; fill optional columns; one-line errors."""
    cols = set(table.column_names)
    missing = [c for c in REQUIRED_COLUMNS if c not in cols]
    if missing:
        raise LaggardError(f"{where}: missing required column(s) {', '.join(missing)}")
    data: dict[str, Any] = {}
    for fld in OP_SCHEMA:
        if fld.name not in cols:
            continue
        col = table.column(fld.name)
        if col.num_chunks == 1:  # as Parquet shards read: combine_chunks would copy it (0.9 s for 4M rows)
            col = col.chunk(0)
        elif table.num_rows:
            col = col.combine_chunks()
        if isinstance(col, pa.ChunkedArray):
            col = pa.concat_arrays(col.chunks) if col.num_chunks else pa.array([], type=col.type)
        if fld.name in REQUIRED_COLUMNS or not fld.nullable:
            if col.null_count:
                raise LaggardError(f"{where}: column {fld.name} has {col.null_count} null value(s)")
        try:
            if pa.types.is_dictionary(fld.type):
                data[fld.name] = col
            else:
                data[fld.name] = col.cast(fld.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise LaggardError(f"{where}: column {fld.name} has type {col.type}, expected {fld.type} ({e})") from None
    out = make_table(data, num_rows=table.num_rows)
    dur = to_numpy(out.column("dur_ns"))
    if out.num_rows and dur.min() < 0:
        neg = np.flatnonzero(dur < 0)
        row = out.slice(int(neg[0]), 1).select(["rank", "step", "name"]).to_pylist()[0]
        raise LaggardError(f"{where}: column dur_ns has {len(neg)} negative duration(s), e.g. {row['name']} on rank "
                           f"{row['rank']} in step {row['step']} ({int(dur[neg[0]])} ns)")
    bad = _unknown_kinds(out)
    if bad:
        raise LaggardError(f"{where}: unknown op kind(s) {sorted(bad)} (known: {', '.join(KINDS)})")
    return out


def _unknown_kinds(out: pa.Table) -> set[str]:
    """Op kinds the rows use that are not ``KINDS``: none when no dictionary holds another label
    (then no row can), else from the rows' codes."""
    col = out.column("kind")
    if not any(set(ch.dictionary.to_pylist()) - set(KINDS) for ch in col.chunks):
        return set()
    kind_code, kind_labels = Job(table=out, meta=JobMeta()).codes("kind")
    kinds = {kind_labels[c] for c in np.unique(kind_code)} if out.num_rows else set()
    return kinds - set(KINDS)


@dataclass(kw_only=True, slots=True)
class Job:
    """An op table with its metadata and the warnings raised while reading it."""

    table: pa.Table
    meta: JobMeta
    warnings: list[str] = field(default_factory=list)
    # how it was loaded (``laggard.io.load_job``): path(s) and the flags a command needs to load it
    # the same way (a finding's `laggard whatif` command); empty for a job built in memory
    load_args: dict[str, Any] = field(default_factory=dict)

    @property
    def num_ops(self) -> int:
        return self.table.num_rows

    def __repr__(self) -> str:
        """One line: what the job is, not its Arrow schema (1.8 KB)."""
        import pyarrow.compute as pc

        m = self.meta
        src = self.load_args.get("path") or self.load_args.get("paths")
        nsteps = len(pc.unique(self.table.column("step"))) if self.table.num_rows else 0
        return (f"Job(name={m.name!r}, ops={self.num_ops:,}, ranks={m.world_size}, dp={m.dp_size}, pp={m.pp_size}, "
                f"tp={m.tp_size}, steps={nsteps}, warnings={len(self.warnings)}"
                + (f", source={src!r}" if src else "") + ")")

    def column(self, name: str) -> np.ndarray:
        """A numeric column as a numpy array (zero-copy where Arrow allows)."""
        return to_numpy(self.table.column(name))

    def codes(self, name: str) -> tuple[np.ndarray, list[str]]:
        """A dictionary column as (int32 codes, labels); null -> -1. Each chunk's indices are written
        into the codes as they are stored (int8 for op kinds), not widened to int64 first (two copies
        of every op's code: 94 -> 5 ms for the op kinds of 7.7M ops in two shards)."""
        col = self.table.column(name)
        chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
        if not chunks:
            return np.zeros(0, dtype=np.int32), []
        # chunks may carry different dictionaries: each is mapped onto one label list (no lookup where
        # a chunk's indices already are its labels')
        where: dict[str, int] = {}
        luts: list[np.ndarray | None] = []
        for ch in chunks:
            lut = [where.setdefault(v, len(where)) for v in ch.dictionary.to_pylist()]
            luts.append(None if lut == list(range(len(lut))) else np.array([*lut, -1], dtype=np.int32))
        labels = list(where)
        out = np.empty(sum(len(ch) for ch in chunks), dtype=np.int32)
        at = 0
        for ch, lut in zip(chunks, luts, strict=True):
            idx = _indices(ch, native=True)
            out[at : at + len(ch)] = idx if lut is None else lut[idx]
            at += len(ch)
        return out, labels


def numpy_dtype(t: pa.DataType) -> np.dtype:
    """The numpy dtype of an integer or floating Arrow type, without ``DataType.to_pandas_dtype``:
    in pyarrow <= 25 that imports pandas and raises when it is not installed (or hidden)."""
    if pa.types.is_integer(t):
        return np.dtype(f"{'u' if pa.types.is_unsigned_integer(t) else 'i'}{t.bit_width // 8}")
    if pa.types.is_floating(t):
        return np.dtype(f"f{t.bit_width // 8}")
    raise TypeError(f"no numpy dtype for Arrow type {t}")


def _chunk_to_numpy(arr: pa.Array) -> np.ndarray:
    t = arr.type
    if (pa.types.is_integer(t) or pa.types.is_floating(t)) and arr.null_count == 0:
        # straight from the data buffer: zero-copy, and no pandas import (Array.to_numpy does one)
        dtype = numpy_dtype(t)
        buf = arr.buffers()[1]
        return np.frombuffer(buf, dtype=dtype, count=arr.offset + len(arr))[arr.offset :]
    return arr.to_numpy(zero_copy_only=False)


def to_numpy(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Arrow -> numpy, chunk by chunk, without importing pandas for numeric columns."""
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 1:
            return _chunk_to_numpy(col.chunk(0))
        if col.num_chunks == 0:
            return np.zeros(0, dtype=numpy_dtype(col.type))
        return np.concatenate([_chunk_to_numpy(ch) for ch in col.chunks])
    return _chunk_to_numpy(col)


def valid_mask(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """True where ``arr`` is not null (read from the validity bitmap; no pyarrow.compute)."""
    chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    parts = []
    for ch in chunks:
        if ch.null_count == 0:
            parts.append(np.ones(len(ch), dtype=bool))
            continue
        bitmap = ch.buffers()[0]
        bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
        parts.append(bits[ch.offset : ch.offset + len(ch)].astype(bool))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


def fits_table(num_keys: int, num_values: int) -> bool:
    """Whether counting ``num_values`` integer keys in a table of ``num_keys`` slots beats sorting
    them: the table costs O(num_keys) memory and time, a sort O(n log n); up to 4 slots per value
    (plus a small floor) the table is both cheaper and bounded by the column it replaces."""
    return num_keys <= 4 * num_values + 1024


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for integer columns (ranks, steps): a lookup
    table over their range instead of a sort where the range fits one (``fits_table``)."""
    values = np.asarray(values)
    if len(values) and values.dtype.kind in "iu":
        lo, hi = int(values.min()), int(values.max())
        if fits_table(hi - lo + 1, len(values)):
            rel = values.astype(np.int64, copy=False) - lo
            present = np.zeros(hi - lo + 1, dtype=bool)
            present[rel] = True
            code = np.cumsum(present, dtype=np.int64) - 1
            return (np.flatnonzero(present) + lo).astype(values.dtype, copy=False), code[rel]
    u, inv = np.unique(values, return_inverse=True)
    return u, inv.ravel().astype(np.int64, copy=False)


def unique_first(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_index=True)`` for integer labels (ranks, DP ranks, stages), as
    ``unique_inverse`` is for ``return_inverse``: a table over their range instead of a sort of every
    op (0.2 s each at 4,096 workers)."""
    if len(values) and values.dtype.kind in "iu":
        lo, hi = int(values.min()), int(values.max())
        if fits_table(hi - lo + 1, len(values)):
            first = np.full(hi - lo + 1, len(values), dtype=np.int64)
            np.minimum.at(first, values - lo, np.arange(len(values)))
            present = np.flatnonzero(first < len(values))
            return (present + lo).astype(values.dtype, copy=False), first[present]
    return np.unique(values, return_index=True)


def _indices(arr: pa.DictionaryArray, native: bool = False) -> np.ndarray:
    """Dictionary indices as int numpy, null -> -1 (the last slot of a lookup table): int64, or with
    ``native`` the stored signed width (zero-copy without nulls: read-only)."""
    idx = arr.indices
    keep = native and pa.types.is_signed_integer(idx.type)
    if idx.null_count == 0:
        return _chunk_to_numpy(idx) if keep else _chunk_to_numpy(idx).astype(np.int64, copy=False)
    # the data buffer as it is (a null's slot holds some index) and -1 where the validity bitmap says
    # null: Arrow's to_numpy of an integer array with nulls goes through float64 (0.2 s per 4M rows)
    raw = np.frombuffer(idx.buffers()[1], dtype=numpy_dtype(idx.type), count=idx.offset + len(idx))
    out = np.where(valid_mask(idx), raw[idx.offset :], np.array(-1, dtype=raw.dtype) if keep else -1)
    return out if keep else out.astype(np.int64, copy=False)


def write_native(job: Job, out_dir: str | Path, *, rows_per_shard: int = 4_000_000) -> Path:
    """Write the native format: ``job.json`` and ``ops-00000.parquet`` ... in ``out_dir``."""
    import pyarrow.parquet as pq

    from laggard.optable.tracedir import JOB_FILE

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("ops-*.parquet"):
        old.unlink()
    n = job.table.num_rows
    for i, start in enumerate(range(0, max(n, 1), rows_per_shard)):
        pq.write_table(job.table.slice(start, rows_per_shard), out / f"ops-{i:05d}.parquet", compression="zstd")
    (out / JOB_FILE).write_text(json.dumps(job.meta.to_json(), indent=2) + "\n")
    return out


def parse_steps(spec: str) -> set[int]:
    """'10-20,25' -> {10, ..., 20, 25} (the syntax: ``laggard.util.ranges``)."""
    out = parse_ranges(spec, flag="--steps", example="10-20,25")
    if not out:
        raise LaggardError("--steps: no step given")
    return out


def select_steps(job: Job, spec: str) -> Job:
    """Keep only the steps in ``spec``; error when none of them is in the trace. The ranges are
    compared with the trace's steps, never expanded: ``0-100000000`` costs what ``0-10`` does."""
    from laggard.util.ranges import parse_spans

    spans = parse_spans(spec, flag="--steps", example="10-20,25")
    if not spans:
        raise LaggardError("--steps: no step given")
    step = job.column("step")
    lim = np.iinfo(np.int64)
    keep = np.zeros(len(step), dtype=bool)
    for lo, hi in spans:  # (clamped: a bound past int64 covers every step on its side)
        keep |= (step >= max(lo, lim.min)) & (step <= min(hi, lim.max))
    table = job.table.filter(pa.array(keep))
    if table.num_rows == 0:
        have = np.unique(job.column("step"))
        raise LaggardError(
            f"--steps {spec}: none of these steps is in the trace (it has {len(have)} steps, {have[0]} to {have[-1]})"
        )
    return Job(table=table, meta=job.meta, warnings=list(job.warnings))
