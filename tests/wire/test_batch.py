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
    t = t.set_column(OP_SCHEMA.get_field_index("kind"), OP_SCHEMA.field("kind"), kinds.cast(OP_SCHEMA.field("kind").type))
    with pytest.raises(BadBatch, match=r"unknown op kind\(s\) \['teleport'\]"):
        decode_batch(_body(t))
