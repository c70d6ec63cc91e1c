"""Op batches on the wire (``laggard.wire.batch``): what the collector accepts and refuses when the
sender used the op schema itself (the tracer's fast path) or another one (``conform``)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from laggard.optable.ops import OP_SCHEMA
from laggard.wire.batch import BadBatch, decode_batch, encode_batch

META = {"name": "t", "source": "test", "dp": 1, "pp": 1, "tp": 1}


def _table(n: int = 4, **override: pa.Array) -> pa.Table:
    """``n`` compute ops of rank 0, one per step, in the op schema itself (the tracer's batches)."""
    given = {"step": pa.array(range(n)), "start_ns": pa.array([i * 1000 for i in range(n)]),
             "dur_ns": pa.array([500] * n), **override}
    arrays = []
    for f in OP_SCHEMA:
        if f.name in given:
            arrays.append(given[f.name].cast(f.type))
        elif pa.types.is_dictionary(f.type):
            arrays.append(pa.array(["compute" if f.name == "kind" else "op"] * n).dictionary_encode().cast(f.type))
        elif f.nullable:
            arrays.append(pa.nulls(n, f.type))
        else:
            arrays.append(pa.array([0] * n).cast(f.type))
    return pa.Table.from_arrays(arrays, schema=OP_SCHEMA)


def _body(table: pa.Table) -> bytes:
    return encode_batch(table, job_id="j", rank=0, seq=0, meta=META)


def test_a_batch_in_the_op_schema_comes_back_as_sent() -> None:
    t = _table()
    b = decode_batch(_body(t))
    assert b.table.schema.equals(OP_SCHEMA) and b.table.equals(t)
    assert (b.job_id, b.rank, b.seq, b.min_step, b.max_step) == ("j", 0, 0, 0, 3)


def test_the_op_schema_fast_path_still_refuses_nulls_and_unknown_kinds() -> None:
    """The schema matches, so ``conform`` does not run: the fast path's own checks must hold."""
    with pytest.raises(BadBatch, match=r"column dur_ns has 1 null value\(s\)"):
        decode_batch(_body(_table(dur_ns=pa.array([500, None, 500, 500], pa.int64()))))
    kinds = pa.array(["compute", "teleport", "compute", "compute"]).dictionary_encode()
    t = _table()
    t = t.set_column(OP_SCHEMA.get_field_index("kind"), OP_SCHEMA.field("kind"),
                     kinds.cast(OP_SCHEMA.field("kind").type))
    with pytest.raises(BadBatch, match=r"unknown op kind\(s\) \['teleport'\]"):
        decode_batch(_body(t))


def _ipc(table: pa.Table, compression: str | None) -> bytes:
    """``table`` as a bare Arrow IPC stream with the batch metadata (what senders before the LZ4
    frame wrote: Arrow's own buffer compression, or none)."""
    t = table.replace_schema_metadata({b"laggard.job": b"j", b"laggard.rank": b"0", b"laggard.seq": b"0"})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


def test_a_body_is_one_lz4_frame_and_bare_arrow_streams_still_read() -> None:
    """``encode_batch`` writes the stream in one LZ4 frame (smaller than Arrow's per-buffer LZ4, which
    also costs a decompression per column buffer on every read); bodies stored by earlier senders,
    a bare stream with any codec or none, read as before."""
    from laggard.wire.batch import FRAME_MAGIC, read_bodies

    t = _table(64)
    framed = _body(t)
    assert framed.startswith(FRAME_MAGIC) and len(framed) < len(_ipc(t, "lz4"))
    assert decode_batch(framed).table.equals(t) and read_bodies([framed]).equals(t)
    for codec in ("lz4", "zstd", None):
        body = _ipc(t, codec)
        assert decode_batch(body).table.equals(t) and read_bodies([body]).equals(t), codec


def test_many_bodies_read_as_one_table_as_when_read_one_by_one() -> None:
    """``read_bodies`` (a collector's window: a body per rank and flush) joins the bodies' record
    batches at once, each kind of body, tables and bodies in another schema among them, to the
    table read body by body and joined with promoted schemas, dictionaries unified: one chunk."""
    from laggard.wire.batch import read_bodies

    kinds = pa.array(["collective"] * 3 + ["compute"] * 2).dictionary_encode().cast(OP_SCHEMA.field("kind").type)
    other = _table(5, step=pa.array(range(5, 10)))
    other = other.set_column(OP_SCHEMA.get_field_index("kind"), OP_SCHEMA.field("kind"), kinds)
    parts = [_body(_table(4)), _ipc(other, "zstd"), _body(other), _table(3)]
    want = pa.concat_tables([decode_batch(p).table if isinstance(p, bytes) else p for p in parts]).unify_dictionaries()
    got = read_bodies(parts)
    assert got.equals(want.combine_chunks()) and got.num_rows == 17
    assert {got.column(i).num_chunks for i in range(got.num_columns)} == {1}
    assert got.column("kind").chunk(0).dictionary.to_pylist() == ["compute", "collective"]
    # a body in another schema (a hand-made sender's, accepted through conform): schemas promoted
    odd = _ipc(_table(2).drop_columns(["vchunk"]), None)
    mixed = read_bodies(parts + [odd])
    assert mixed.num_rows == 19 and mixed.column("vchunk").null_count == 2
    assert read_bodies([]) is None


def test_a_bad_lz4_frame_is_one_line() -> None:
    from laggard.wire.batch import FRAME_MAGIC

    good = _body(_table(64))
    head = len(FRAME_MAGIC) + 8
    size = int.from_bytes(good[len(FRAME_MAGIC):head], "big")
    cases = {
        "cut off before its frame": good[:head],
        r"declares 1099511627776 bytes for a \d+-byte frame": FRAME_MAGIC + (1 << 40).to_bytes(8, "big") + good[head:],
        "does not decompress": FRAME_MAGIC + size.to_bytes(8, "big") + b"\x00" * 200,
        "does not decompress|not an Arrow IPC stream": good[:-20],  # the frame cut short
        "does not decompress ": FRAME_MAGIC + (size - 1).to_bytes(8, "big") + good[head:],  # a size too small
    }
    for why, body in cases.items():
        with pytest.raises(BadBatch, match=why):
            decode_batch(body)


def test_a_window_read_through_the_cache_is_the_window_read_afresh() -> None:
    """``read_bodies`` with a cache (a monitor job's windows in its analysis process): each of three
    sliding windows of bodies, read through the cache the window before left, is the table read
    without one; the cache then holds exactly that window's bodies, and what it holds is what is
    read (a body's batches put there by hand come back instead of the body's own)."""
    from laggard.wire.batch import read_bodies

    bodies = [_body(_table(3, step=pa.array(range(3 * k, 3 * k + 3)), rank=pa.array([k % 2] * 3)))
              for k in range(6)]
    cache: dict = {}
    for first in range(3):
        window = bodies[first:first + 3]  # two of its bodies were in the window before
        got = read_bodies(window, cache)
        assert got.equals(read_bodies(window)) and got.num_rows == 9
        assert list(cache) == window
    planted = read_bodies([bodies[0]]).to_batches()
    cache[bodies[3]] = planted
    assert read_bodies([bodies[3]], cache).equals(read_bodies([bodies[0]]))
