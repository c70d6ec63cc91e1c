"""Op batches on the wire: an Arrow IPC stream of op-table rows (``laggard.optable.ops.OP_SCHEMA``), in one LZ4 frame.

The schema's metadata says whose ops they are: ``laggard.job`` (job id), ``laggard.rank`` and
``laggard.seq`` (the sender's batch counter on that rank: a batch is identified by (job, rank,
seq), so a retried or reordered batch is stored once), and ``laggard.meta`` (the job's ``JobMeta``
as JSON; needed on a job's first batch). ``encode_batch`` and ``decode_batch`` are the two ends.
"""

from __future__ import annotations

import functools
import json
import re
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from laggard.errors import LaggardError
from laggard.optable.ops import KINDS, OP_SCHEMA, JobMeta, conform, to_numpy

CONTENT_TYPE = "application/vnd.apache.arrow.stream"
# A body is an Arrow IPC stream, or (what ``encode_batch`` writes) an uncompressed one in a single LZ4
# frame behind FRAME_MAGIC and its size (8 bytes, big-endian). One frame instead of Arrow's LZ4 buffer
# compression: a tracer's 99-op batch is 3.7 KB instead of 6.9 KB and reads in ~30 us instead of ~73
# (one decompression instead of one per column buffer), and both the collector's ingest and every
# window build read each body. Readers take either, with any Arrow codec inside (bodies stored by
# earlier versions). Single-threaded: Arrow's thread pool costs more than it saves on one small batch.
FRAME_MAGIC = b"LAGGARD-LZ4 1\n"
_SIZE = struct.Struct(">Q")
# a frame may not declare more than this many times its own size (LZ4 expands at most ~255x) nor more
# than MAX_FRAME_BYTES: the size is read before anything is decompressed into a buffer of that size
_MAX_FRAME_RATIO = 256
MAX_FRAME_BYTES = 1 << 30
_LZ4 = pa.Codec("lz4") if pa.Codec.is_available("lz4") else None
_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(compression=None, use_threads=False)
_READ_OPTIONS = pa.ipc.IpcReadOptions(use_threads=False)
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class BadBatch(LaggardError):
    """A batch the collector refuses (answered with 400/422 and this message)."""


@dataclass(kw_only=True, slots=True)
class Batch:
    job_id: str
    rank: int
    seq: int
    meta: dict[str, Any] | None
    table: pa.Table
    min_step: int
    max_step: int


@dataclass(frozen=True, slots=True)
class PackSlice:
    """One part of a relay's pack (``laggard.wire.pack``) as the collector holds it: the pack's body,
    shared by all its parts, and the part's rows in it."""

    body: bytes = field(repr=False)
    row0: int
    num_rows: int

    def __reduce__(self) -> tuple[type[PackSlice], tuple[bytes, int, int]]:
        """Pickled as its three fields (a window's 2,048 parts go to an analysis process each refresh:
        a slotted dataclass's own state walks ``fields()`` per object, 18% of the collector's
        interpreter time under the bench's load); the pack's body once, shared by its parts."""
        return PackSlice, (self.body, self.row0, self.num_rows)


def valid_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise BadBatch(f"job id {job_id!r}: 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return job_id


def encode_batch(table: pa.Table, *, job_id: str, rank: int, seq: int, meta: JobMeta | dict[str, Any] | None) -> bytes:
    """The request body for one batch of ``rank``'s ops (its ``seq``-th batch)."""
    md = {b"laggard.job": job_id.encode(), b"laggard.rank": str(int(rank)).encode(),
          b"laggard.seq": str(int(seq)).encode()}
    if meta is not None:
        md[b"laggard.meta"] = json.dumps(meta.to_json() if isinstance(meta, JobMeta) else meta).encode()
    return encode_table(table.replace_schema_metadata(md))


def encode_table(table: pa.Table) -> bytes:
    """``table`` (its schema's metadata included) as a body: an IPC stream in one LZ4 frame, or the
    bare stream where this pyarrow has no LZ4 codec."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_WRITE_OPTIONS) as w:
        w.write_table(table)
    raw = sink.getvalue()
    if _LZ4 is None:
        return raw.to_pybytes()
    return FRAME_MAGIC + _SIZE.pack(raw.size) + _LZ4.compress(raw, asbytes=True)


def body_stream(body: bytes) -> pa.Buffer:
    """The Arrow IPC stream of a body: the body itself, or its LZ4 frame decompressed (``BadBatch``
    when that frame is cut off, declares an impossible size or does not decompress)."""
    if not body.startswith(FRAME_MAGIC):
        return pa.py_buffer(body)
    head = len(FRAME_MAGIC) + _SIZE.size
    if len(body) <= head:
        raise BadBatch(f"LZ4-framed body of {len(body)} bytes: cut off before its frame")
    (size,) = _SIZE.unpack_from(body, len(FRAME_MAGIC))
    if size == 0 or size > min(MAX_FRAME_BYTES, _MAX_FRAME_RATIO * (len(body) - head)):
        raise BadBatch(f"LZ4-framed body declares {size} bytes for a {len(body) - head}-byte frame")
    if _LZ4 is None:
        raise BadBatch("LZ4-framed body, but this pyarrow has no LZ4 codec")
    try:
        return _LZ4.decompress(memoryview(body)[head:], decompressed_size=size)
    except (pa.ArrowInvalid, OSError, ValueError) as e:
        raise BadBatch(f"LZ4-framed body does not decompress ({str(e).splitlines()[0]})") from None


_OP_TYPES = [(f.name, f.type) for f in OP_SCHEMA]
_NOT_NULL = [i for i, f in enumerate(OP_SCHEMA) if not f.nullable]
_KNOWN_KINDS = frozenset(KINDS)


def conform_ops(table: pa.Table) -> pa.Table:
    """The op schema: at no cost when the sender used it (as the tracer does), else ``laggard.optable.ops.conform``.
    The schema is compared in Arrow first (0.3 us; the field-by-field list in Python took 34 us of
    a batch's ~250 us of decoding on the collector)."""
    same = table.schema.equals(OP_SCHEMA)
    if same or [(f.name, f.type) for f in table.schema] == _OP_TYPES:
        for i in _NOT_NULL:
            n = table.column(i).null_count
            if n:
                raise BadBatch(f"batch: column {OP_SCHEMA[i].name} has {n} null value(s)")
        bad = _unknown_kinds(table)
        if bad:
            raise BadBatch(f"batch: unknown op kind(s) {sorted(bad)} (known: {', '.join(KINDS)})")
        return table if same else pa.Table.from_arrays(table.columns, schema=OP_SCHEMA)
    try:
        return conform(table, where="batch")
    except LaggardError as e:
        raise BadBatch(str(e)) from None


def _unknown_kinds(table: pa.Table) -> set[str]:
    """The op kinds of ``table`` (in the op schema) that laggard does not know."""
    return {k for ch in table.column("kind").chunks for k in ch.dictionary.to_pylist()} - _KNOWN_KINDS


def stream_reader(stream: pa.Buffer) -> pa.ipc.RecordBatchStreamReader:
    """A reader of one IPC stream, made directly: ``pa.ipc.open_stream``'s Python wrapper costs ~13 us
    a call, a third of reading a tracer's batch, and the collector reads one per batch and per window."""
    return pa.ipc.RecordBatchStreamReader(stream, options=_READ_OPTIONS)


def read_bodies(bodies: list[bytes | pa.Table | PackSlice],
                cache: dict[bytes, list[pa.RecordBatch]] | None = None) -> pa.Table | None:
    """The ops of bodies ``decode_batch`` or ``decode_pack`` accepted before (stored or held by the
    collector), read without checking again, or of tables, as one table: the schema's metadata
    dropped, one chunk per column, dictionaries unified; None for none. A pack is read once however
    many of its parts are asked for. Record batches joined at once where they share a schema (a
    collector's window: a batch per rank and flush, all from tracers), else tables joined with their
    schemas promoted (bodies of other senders). ``cache``: the record batches of bodies read before,
    by body (a monitor window shares two thirds of its bodies with the one before it); those of
    ``bodies`` are taken from it, and it is left holding exactly theirs."""
    kept: dict[bytes, list[pa.RecordBatch]] = {}
    batches = [b for p in _joined_slices(bodies) for b in _body_batches(p, cache, kept)]
    if cache is not None:
        cache.clear()
        cache.update(kept)
    if not batches:
        return None
    schema = batches[0].schema.remove_metadata()
    try:
        table = pa.Table.from_batches(batches, schema=schema)
    except pa.ArrowInvalid:  # the schemas differ
        table = pa.concat_tables([pa.Table.from_batches([b]).replace_schema_metadata(None) for b in batches],
                                 promote_options="default")
    return table.combine_chunks()  # (concatenating a dictionary column's chunks unifies their dictionaries)


def _joined_slices(parts: list[bytes | pa.Table | PackSlice]) -> list[bytes | pa.Table | PackSlice]:
    """``parts`` with each run of a pack's adjacent parts as one slice (a relay's parts arrive together:
    one slice per pack instead of one per rank)."""
    out: list[bytes | pa.Table | PackSlice] = []
    for p in parts:
        last = out[-1] if out else None
        if (isinstance(p, PackSlice) and isinstance(last, PackSlice) and last.body is p.body
                and last.row0 + last.num_rows == p.row0):
            out[-1] = PackSlice(p.body, last.row0, last.num_rows + p.num_rows)
        else:
            out.append(p)
    return out


def _body_batches(part: bytes | pa.Table | PackSlice, cache: dict[bytes, list[pa.RecordBatch]] | None,
                  kept: dict[bytes, list[pa.RecordBatch]]) -> list[pa.RecordBatch]:
    """A part's record batches: a table's, a body's from ``cache`` or read (and put in ``kept``), a
    pack slice's rows of its pack's; read for a cache, without their schema's metadata (the laggard.*
    keys: joining batches whose schemas are equal objects but for it costs ~2-4x more)."""
    if isinstance(part, pa.Table):
        return part.to_batches()
    body = part.body if isinstance(part, PackSlice) else part
    got = kept.get(body)
    if got is None:
        got = cache.get(body) if cache is not None else None
    if got is None:
        got = [b.replace_schema_metadata(None) for b in stream_reader(body_stream(body))]
    kept[body] = got
    return _rows(got, part.row0, part.num_rows) if isinstance(part, PackSlice) else got


def _rows(batches: list[pa.RecordBatch], row0: int, num_rows: int) -> list[pa.RecordBatch]:
    """Rows ``row0`` to ``row0 + num_rows`` of ``batches`` read as one table (zero-copy slices)."""
    out, at = [], 0
    for b in batches:
        lo, hi = max(row0 - at, 0), min(row0 + num_rows - at, b.num_rows)
        if hi > lo:
            out.append(b.slice(lo, hi - lo))
        at += b.num_rows
    return out


def decode_batch(body: bytes) -> Batch:
    """Parse and check a request body; every problem is a ``BadBatch`` with one line saying what."""
    return _checked(_head(body))


def decode_batches(bodies: list[bytes]) -> list[Batch]:
    """A bundle's bodies, each checked as ``decode_batch`` checks it (a problem is a ``BadBatch``
    saying which part). The column checks run once over all the parts' ops where every part is in
    the op schema itself (the tracer's), ~60 us a batch instead of ~170; the part at fault is then
    checked alone for its message."""
    heads = _each_part(_head, bodies)
    together = _checked_together(heads)
    return together if together is not None else _each_part(_checked, heads)


def _each_part(fn: Any, parts: list, what: str = "bundle") -> list[Batch]:
    """``fn`` of each part; its ``BadBatch`` says which part (``what part N: ...``)."""
    out = []
    for i, p in enumerate(parts):
        try:
            out.append(fn(p))
        except BadBatch as e:
            raise BadBatch(f"{what} part {i}: {e}") from None
    return out


def read_table(body: bytes, where: str = "") -> pa.Table:
    """A body's table, its schema's metadata included, unchecked; ``BadBatch`` (its message after
    ``where``) when it is empty or not an Arrow IPC stream."""
    if not body:
        raise BadBatch(f"{where}empty body: expected an Arrow IPC stream of ops")
    try:
        return stream_reader(body_stream(body)).read_all()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, ValueError) as e:
        raise BadBatch(f"{where}body is not an Arrow IPC stream ({str(e).splitlines()[0]})") from None


def _head(body: bytes) -> Batch:
    """The body read and its metadata checked; the ops not yet (``_checked``)."""
    table = read_table(body)
    md = table.schema.metadata or {}
    try:
        job_id = md[b"laggard.job"].decode()
        rank = int(md[b"laggard.rank"])
        seq = int(md[b"laggard.seq"])
    except KeyError as e:
        raise BadBatch(f"schema metadata lacks {e.args[0].decode()} (job id, rank and batch sequence number)") from None
    except (ValueError, UnicodeDecodeError):
        raise BadBatch("schema metadata laggard.rank / laggard.seq must be integers") from None
    valid_job_id(job_id)
    if rank < 0 or seq < 0:
        raise BadBatch(f"rank {rank} / seq {seq}: must be non-negative")
    meta = job_meta(md[b"laggard.meta"]) if b"laggard.meta" in md else None
    if table.num_rows == 0:
        raise BadBatch("the batch has no ops")
    return Batch(job_id=job_id, rank=rank, seq=seq, meta=meta, table=table.replace_schema_metadata(None),
                 min_step=0, max_step=0)


@functools.lru_cache(maxsize=256)
def job_meta(raw: bytes) -> dict[str, Any]:
    """A job's meta, parsed and checked once per distinct value (every batch of a job carries the
    same; 30 us of each batch's decoding). Shared: read it, never change it."""
    try:
        meta = json.loads(raw)
        JobMeta.from_json(meta, where="laggard.meta")
    except (ValueError, LaggardError) as e:
        raise BadBatch(f"schema metadata laggard.meta: {e}") from None
    return meta


def _checked(h: Batch) -> Batch:
    """``_head``'s batch with its ops checked: the op schema, its rank, no negative durations."""
    table = conform_ops(h.table)
    ranks = to_numpy(table.column("rank"))
    if (ranks != h.rank).any():
        raise BadBatch(f"batch of rank {h.rank} holds ops of rank(s) "
                       f"{sorted(set(np.unique(ranks).tolist()) - {h.rank})}")
    dur = to_numpy(table.column("dur_ns"))
    if (dur < 0).any():
        raise BadBatch(f"{int((dur < 0).sum())} op(s) have negative dur_ns")
    h.table = table
    return checked_batch(h)


def checked_batch(h: Batch, step_range: tuple[int, int] | None = None) -> Batch:
    """The checked batch: one chunk per column, its step range (``step_range`` where it is known)."""
    table = h.table if h.table.column(0).num_chunks == 1 else h.table.combine_chunks()
    if step_range is None:
        steps = to_numpy(table.column("step"))
        step_range = int(steps.min()), int(steps.max())
    return Batch(job_id=h.job_id, rank=h.rank, seq=h.seq, meta=h.meta, table=table,
                 min_step=step_range[0], max_step=step_range[1])


def _checked_together(heads: list[Batch]) -> list[Batch] | None:
    """The parts as ``_checked`` makes them, checked once over all their ops (``checked_parts``),
    where every part is in the op schema itself (the tracer's) without nulls or unknown kinds; None
    otherwise (each part is then conformed and checked alone). The parts' columns are read joined,
    not one by one, and so are their step ranges (32 parts a bundle: ~13 us of a batch's ~110 us of
    ingest CPU saved)."""
    try:
        ops = pa.concat_tables([h.table for h in heads])  # (raises when the parts' schemas differ)
    except pa.ArrowInvalid:
        return None
    if not ops.schema.equals(OP_SCHEMA) or any(ops.column(i).null_count for i in _NOT_NULL) or _unknown_kinds(ops):
        return None
    return checked_parts(heads, ops, "bundle")


def checked_parts(heads: list[Batch], ops: pa.Table, what: str) -> list[Batch]:
    """Parts of a bundle or pack as ``_checked`` makes them, their ops (in the op schema: ``ops``,
    the parts' joined in their order) checked once: each part's rank, no negative durations, and
    their step ranges read joined. Where a check fails each part is checked alone, so that the
    first part at fault names itself (``what part N: ...``)."""
    lens = np.array([h.table.num_rows for h in heads])
    ranks = to_numpy(ops.column("rank").combine_chunks())
    if (ranks != np.repeat(np.array([h.rank for h in heads]), lens)).any() or (
            to_numpy(ops.column("dur_ns").combine_chunks()) < 0).any():
        return _each_part(_checked, heads, what)
    steps = to_numpy(ops.column("step").combine_chunks())
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    lo, hi = np.minimum.reduceat(steps, starts).tolist(), np.maximum.reduceat(steps, starts).tolist()
    return [checked_batch(h, (a, b)) for h, a, b in zip(heads, lo, hi, strict=True)]
