"""A relay's pack (``laggard.wire.pack``): its parts come back as the batches they were, checked as
``decode_batch`` checks each, and a bad pack is one line naming the part at fault."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from laggard.optable.ops import OP_SCHEMA, make_table
from laggard.wire.batch import BadBatch, PackSlice, decode_batch, encode_batch, encode_table, read_bodies
from laggard.wire.pack import decode_pack, encode_pack

META = {"name": "t", "source": "test", "dp": 4, "pp": 1, "tp": 1}


def _ops(rank: int, seq: int, n: int, dur_ns: int = 500, name: str = "fwd") -> pa.Table:
    steps = np.arange(n) // 2 + 3 * seq
    return make_table({"rank": np.full(n, rank, np.int32), "dp_rank": np.full(n, rank, np.int32), "step": steps,
                       "name": [f"{name}{rank}"] * n, "kind": ["compute"] * n,
                       "start_ns": np.arange(n) * 1000, "dur_ns": np.full(n, dur_ns)})


def _bodies() -> list[bytes]:
    """Four tracers' batches of different lengths and names (each its own dictionary), one with the meta."""
    return [encode_batch(_ops(r, 1, 2 + 3 * r), job_id="j", rank=r, seq=1, meta=META if r == 2 else None)
            for r in range(4)]


def test_a_packs_parts_are_the_batches_that_went_in() -> None:
    bodies = _bodies()
    want = [decode_batch(b) for b in bodies]
    got = decode_pack(encode_pack(want))
    assert len(got) == 4
    for g, w in zip(got, want, strict=True):
        assert (g.job_id, g.rank, g.seq, g.min_step, g.max_step) == (w.job_id, w.rank, w.seq, w.min_step, w.max_step)
        assert g.table.schema.equals(OP_SCHEMA) and g.table.to_pylist() == w.table.to_pylist()
    # the meta one part carried is the job's for every part of it
    assert all(g.meta == META for g in got)


def test_slices_of_a_pack_read_as_the_bodies_they_came_from() -> None:
    """A collector's window holds a pack's parts as slices of its body: read (in any runs, with
    other bodies between), the rows are those of the batches' own bodies."""
    bodies = _bodies()
    pack = encode_pack([decode_batch(b) for b in bodies])
    rows = [2 + 3 * r for r in range(4)]
    starts = np.concatenate([[0], np.cumsum(rows)[:-1]]).tolist()
    sl = [PackSlice(pack, a, n) for a, n in zip(starts, rows, strict=True)]
    assert read_bodies(sl).to_pylist() == read_bodies(bodies).to_pylist()
    mixed = [sl[0], bodies[1], sl[2], sl[3]]  # part 1 came alone; parts 2 and 3 read as one run
    assert read_bodies(mixed).to_pylist() == read_bodies(bodies).to_pylist()
    # a part left out between two (a duplicate the collector did not hold): not read with them
    assert read_bodies([sl[0], sl[2]]).to_pylist() == read_bodies([bodies[0], bodies[2]]).to_pylist()
    cache: dict = {}
    assert read_bodies(sl[1:3], cache).to_pylist() == read_bodies(bodies[1:3]).to_pylist()
    assert list(cache) == [pack]  # the pack read once, kept once


def _pack_of(table: pa.Table, head: object) -> bytes:
    return encode_table(table.replace_schema_metadata({b"laggard.pack": json.dumps(head).encode()}))


@pytest.mark.parametrize("make, says", [
    (lambda: b"", "pack: empty body"),
    (lambda: b"not arrow", "pack: body is not an Arrow IPC stream"),
    (lambda: encode_table(_ops(0, 0, 2)), "pack: schema metadata lacks laggard.pack"),
    (lambda: _pack_of(_ops(0, 0, 2), {"parts": "x"}), "pack: expected 1-4096 parts"),
    (lambda: _pack_of(_ops(0, 0, 2), {"parts": [["j", 0, 0]]}), r"pack part 0: expected \[job id, rank, seq, rows\]"),
    (lambda: _pack_of(_ops(0, 0, 2), {"parts": [["j", 0, 0, 3]]}), "pack: its parts list 3 ops, the table holds 2"),
    (lambda: _pack_of(_ops(0, 0, 2), {"parts": [["j", -1, 0, 2]]}),
     "pack part 0: rank -1 / seq 0 must be non-negative"),
    (lambda: _pack_of(_ops(0, 0, 2), {"parts": [["bad id!", 0, 0, 2]]}), "pack part 0: job id 'bad id!'"),
    (lambda: _pack_of(_ops(0, 0, 2), {"parts": [["j", 0, 0, 2]], "metas": {"j": {"world_size": "a"}}}),
     "pack: meta of job 'j': schema metadata laggard.meta"),
    (lambda: _pack_of(pa.concat_tables([_ops(0, 0, 2), _ops(5, 0, 2)]), {"parts": [["j", 0, 0, 2], ["j", 1, 0, 2]]}),
     r"pack part 1: batch of rank 1 holds ops of rank\(s\) \[5\]"),
    (lambda: _pack_of(pa.concat_tables([_ops(0, 0, 2), _ops(1, 0, 2, dur_ns=-5)]),
                      {"parts": [["j", 0, 0, 2], ["j", 1, 0, 2]]}), "pack part 1: 2 op"),
])
def test_a_bad_pack_is_one_line_naming_the_part(make, says) -> None:
    with pytest.raises(BadBatch, match=says) as e:
        decode_pack(make())
    assert "\n" not in str(e.value)


def test_a_pack_holds_one_to_max_parts() -> None:
    with pytest.raises(ValueError, match="1-4096"):
        encode_pack([])
