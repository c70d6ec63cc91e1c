"""Bundles of batches (``laggard.wire.bundle``): what a relay sends and the collector takes apart."""

from __future__ import annotations

import pytest

from laggard.wire.batch import BadBatch
from laggard.wire.bundle import MAGIC, MAX_PARTS, decode_bundle, encode_bundle


def test_a_bundle_gives_back_its_bodies_byte_for_byte() -> None:
    bodies = [b"a" * 7, b"\x00\xff" * 1000, b"z"]
    assert decode_bundle(encode_bundle(bodies)) == bodies


@pytest.mark.parametrize(("body", "says"), [
    (b"", "does not start with"),
    (b"ARROW1" + b"\x00" * 20, "does not start with"),
    (MAGIC, "no parts"),
    (MAGIC + b"\x00\x00", "truncated at byte 17"),
    (MAGIC + b"\x00\x00\x00\x09abc", "bundle part 0: 9 bytes declared at byte 17, 3 left"),
    (MAGIC + b"\x00\x00\x00\x00", "bundle part 0: 0 bytes declared"),
    (encode_bundle([b"ok"]) + b"\x00\x00\x01\x00xx", "bundle part 1: 256 bytes declared"),
])
def test_a_broken_bundle_is_one_line_saying_where(body: bytes, says: str) -> None:
    with pytest.raises(BadBatch, match=says.replace("(", r"\(")):
        decode_bundle(body)


def test_a_bundle_holds_at_most_max_parts() -> None:
    with pytest.raises(ValueError, match="1-4096"):
        encode_bundle([b"x"] * (MAX_PARTS + 1))
    body = encode_bundle([b"x"] * MAX_PARTS) + b"\x00\x00\x00\x01x"
    with pytest.raises(BadBatch, match="more than 4096 parts"):
        decode_bundle(body)


def _ops(rank: int, n: int = 5, dur_ns: int = 100):
    import numpy as np

    from laggard.optable.ops import make_table

    return make_table({"rank": np.full(n, rank, np.int32), "step": np.arange(n) + rank, "name": ["fwd"] * n,
                       "kind": ["compute"] * n, "start_ns": np.arange(n) * 1000, "dur_ns": np.full(n, dur_ns)})


def _body(table, rank: int, seq: int = 0) -> bytes:
    from laggard.wire.batch import encode_batch

    return encode_batch(table, job_id="j", rank=rank, seq=seq, meta={"name": "j", "dp_size": 4})


def test_a_bundle_decodes_to_what_each_batch_decodes_to_alone() -> None:
    from laggard.wire.batch import decode_batch, decode_batches

    bodies = [_body(_ops(r, n=3 + r), r) for r in range(4)]
    for a, b in zip(decode_batches(bodies), [decode_batch(x) for x in bodies], strict=True):
        assert (a.job_id, a.rank, a.seq, a.min_step, a.max_step, a.meta) == (b.job_id, b.rank, b.seq, b.min_step,
                                                                              b.max_step, b.meta)
        assert a.table.equals(b.table)
    # a part in another schema (a hand-made sender) goes through conform, as it would alone
    other = _ops(1).drop_columns(["vchunk"])
    got = decode_batches([bodies[0], _body(other, 1)])
    assert got[1].table.schema.equals(bodies and decode_batch(bodies[1]).table.schema) and got[1].table.num_rows == 5


@pytest.mark.parametrize(("bad", "says"), [
    (lambda: _body(_ops(0), 2), "bundle part 2: batch of rank 2 holds ops of rank(s) [0]"),
    (lambda: _body(_ops(2, dur_ns=-3), 2), "bundle part 2: 5 op(s) have negative dur_ns"),
    (lambda: b"garbage", "bundle part 2: body is not an Arrow IPC stream"),
])
def test_the_part_at_fault_is_named_with_the_message_it_gets_alone(bad, says) -> None:
    from laggard.wire.batch import decode_batches

    bodies = [_body(_ops(r), r) for r in range(4)]
    bodies[2] = bad()
    with pytest.raises(BadBatch,
                       match=says.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        decode_batches(bodies)
