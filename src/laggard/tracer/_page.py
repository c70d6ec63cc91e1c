"""Fixed-size pages of recorded ops (preallocated numpy records) and their conversion to op tables.

The training thread packs one record per op into a page with a single ``struct.pack_into`` call;
full pages go to the writer thread, which turns them into Arrow tables (vectorised) and Parquet
shards. Per-op strings (op type, kind, stream, group) are small integer codes into label lists.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from laggard.optable.ops import make_table
from laggard.tracer._arrow import dictionary, ints, lists

# one record per op, packed by the training thread with one struct.pack_into call; the fields
# communication ops add go to a second ("aux") record; the step is stored once per run of rows
RECORD_FIELDS: tuple[tuple[str, str], ...] = (
    ("start_ns", "q"),  # local clock; the writer adds the rank's clock offset
    ("dur_ns", "q"),
    ("num_tokens", "q"),  # -1: null
    ("optype", "i"),  # code of (name, kind, stream)
    ("microbatch", "i"),
    ("aux", "i"),  # row of the aux record, -1: none
)
AUX_FIELDS: tuple[tuple[str, str], ...] = (
    ("size_bytes", "q"),  # -1: null
    ("seq", "q"),
    ("group", "i"),  # code of the group label, -1: none
    ("peer", "i"),
    ("side", "i"),  # index into the page's side list, -1: none
)


def _struct(fields: tuple[tuple[str, str], ...]) -> tuple[struct.Struct, np.dtype]:
    st = struct.Struct("<" + "".join(c for _, c in fields))
    dt = np.dtype([(n, "<i8" if c == "q" else "<i4") for n, c in fields])
    assert dt.itemsize == st.size
    return st, dt


PACK, RECORD_DTYPE = _struct(RECORD_FIELDS)
AUX_PACK, AUX_DTYPE = _struct(AUX_FIELDS)
RECORD_BYTES = PACK.size
AUX_BYTES = AUX_PACK.size
# op ids are unique in the job: rank in the high bits, the rank's op counter below
RANK_SHIFT = 40


def op_id_base(rank: int) -> int:
    return rank << RANK_SHIFT


@dataclass(kw_only=True, slots=True)
class Side:
    """Rare per-op extras, kept out of the fixed record."""

    seq_lens: list[int] | None = None
    deps: list[int] | None = None  # explicit dependencies (the rank's local op counters)
    replace_chain: bool = False  # True: ``deps`` are all the dependencies (the op is off the stream chain)


@dataclass(kw_only=True, slots=True)
class FullPage:
    """A page handed to the writer: its records, side data and the labels its codes refer to."""

    records: np.ndarray  # RECORD_DTYPE, length num_rows (a view of the page)
    aux: np.ndarray  # AUX_DTYPE, the rows ``records["aux"]`` refers to
    steps: list[tuple[int, int]]  # (first row, step): the step of every row from there on
    first_op: int  # the rank's op counter at row 0
    side: list[Side]
    optypes: list[tuple[str, str, str]]  # code -> (name, kind, stream)
    groups: list[str]
    buffer: Any = None  # the (records, aux) buffers to give back to the pool once written
    sync: Any = None  # an Event to set when written (synchronous flushes)


@dataclass(kw_only=True, slots=True)
class Chain:
    """Carried from page to page: the last op of each stream, so chains continue across pages."""

    last: dict[str, tuple[int, int]] = field(default_factory=dict)  # stream -> (step, op id)


def last_step(page: FullPage) -> int:
    """The largest step of the page's rows (the ``step`` column's max; reading it back from Arrow with
    ``to_numpy`` would import pandas, see ``laggard.tracer._arrow``)."""
    n, bounds = len(page.records), page.steps
    ends = [b for b, _ in bounds[1:]] + [n]
    return max(s for (b, s), e in zip(bounds, ends, strict=True) if e > b)


def page_table(page: FullPage, *, rank: int, layout: tuple[int, int, int, int], offset_ns: int, chain: Chain,
               ) -> pa.Table:
    """The op table of one page (schema ``laggard.optable.ops.OP_SCHEMA``); updates ``chain``."""
    rec = page.records
    n = len(rec)
    first_id = op_id_base(rank) + page.first_op
    op_id = first_id + np.arange(n, dtype=np.int64)
    optype = rec["optype"].astype(np.int64)
    names = [t[0] for t in page.optypes]
    kinds = sorted({t[1] for t in page.optypes})
    streams = sorted({t[2] for t in page.optypes})
    kind_of = np.array([kinds.index(t[1]) for t in page.optypes] or [0], dtype=np.int64)
    stream_of = np.array([streams.index(t[2]) for t in page.optypes] or [0], dtype=np.int64)
    stream = stream_of[optype] if n else np.zeros(0, dtype=np.int64)
    bounds = np.array([b for b, _ in page.steps], dtype=np.int64)
    step_of = np.array([s for _, s in page.steps], dtype=np.int64)
    step = step_of[np.searchsorted(bounds, np.arange(n), side="right") - 1] if n else np.zeros(0, np.int64)
    aux_row = rec["aux"].astype(np.int64)
    has_aux = aux_row >= 0

    def aux_col(name: str, missing: int) -> np.ndarray:
        out = np.full(n, missing, dtype=page.aux.dtype[name])
        out[has_aux] = page.aux[name][aux_row[has_aux]]
        return out

    side_idx = aux_col("side", -1)

    # dependencies: the previous op on the same stream in the same step (in record order), plus
    # explicit extras; ops marked replace_chain carry only their explicit list
    side = _side_data(page, side_idx, n)
    prev = _chain_prev(op_id, stream, step, ~side.off_chain, streams, chain)
    has_prev = prev >= 0
    dep_rows = np.concatenate([np.flatnonzero(has_prev), np.asarray(side.extra_rows, dtype=np.int64)])
    dep_vals = np.concatenate([prev[has_prev], op_id_base(rank) + np.asarray(side.extra_vals, dtype=np.int64)])
    o = np.argsort(dep_rows, kind="stable")
    deps = lists(np.bincount(dep_rows, minlength=n), dep_vals[o], None, pa.int64())

    dp, pp, tp, cp = layout
    gcode = aux_col("group", -1).astype(np.int64)
    # every column built from its buffers (laggard.tracer._arrow: pa.array would import pandas)
    i32, i64 = pa.int32(), pa.int64()
    size_bytes, num_tokens = aux_col("size_bytes", -1), rec["num_tokens"]
    cols: dict[str, Any] = {
        "op_id": ints(op_id, i64),
        "rank": ints(np.full(n, rank), i32),
        "dp_rank": ints(np.full(n, dp), i32),
        "pp_rank": ints(np.full(n, pp), i32),
        "tp_rank": ints(np.full(n, tp), i32),
        "cp_rank": ints(np.full(n, cp), i32),
        "vchunk": ints(np.full(n, -1), i32),  # the op table's default: not an interleaved chunk
        "step": ints(step, i64),
        "microbatch": ints(rec["microbatch"], i32),
        "name": dictionary(optype, names, i32),
        "kind": dictionary(kind_of[optype] if n else optype, kinds, pa.int8()),
        "stream": dictionary(stream, streams, i32),
        "start_ns": ints(rec["start_ns"] + np.int64(offset_ns), i64),
        "dur_ns": ints(np.maximum(rec["dur_ns"], 0), i64),
        "group": dictionary(gcode, page.groups, i32),
        "seq": ints(aux_col("seq", -1), i64),
        "peer": ints(aux_col("peer", -1), i32),
        "size_bytes": ints(size_bytes, i64, size_bytes >= 0),
        "num_tokens": ints(num_tokens, i64, num_tokens >= 0),
        "seq_lens": lists(side.seq_counts, np.asarray(side.seq_vals, dtype=np.int32), side.seq_valid, i32),
        "deps": deps,
    }
    return make_table(cols, num_rows=n)


@dataclass(slots=True)
class _Side:
    """What a page's side records say, per op row."""

    off_chain: np.ndarray  # replace_chain: only the explicit dependencies
    extra_rows: list[int]  # explicit dependencies (row, op id within the rank)
    extra_vals: list[int]
    seq_valid: np.ndarray  # sequence lengths: which rows have them, how many, the values
    seq_counts: np.ndarray
    seq_vals: list[int]


def _side_data(page: FullPage, side_idx: np.ndarray, n: int) -> _Side:
    out = _Side(off_chain=np.zeros(n, dtype=bool), extra_rows=[], extra_vals=[], seq_valid=np.zeros(n, dtype=bool),
                seq_counts=np.zeros(n, dtype=np.int64), seq_vals=[])
    for r in np.flatnonzero(side_idx >= 0).tolist():  # side data is rare (async ops, sequence metadata)
        s = page.side[side_idx[r]]
        if s.replace_chain:
            out.off_chain[r] = True
        if s.deps:
            out.extra_rows.extend([r] * len(s.deps))
            out.extra_vals.extend(s.deps)
        if s.seq_lens is not None:
            out.seq_valid[r] = True
            out.seq_counts[r] = len(s.seq_lens)
            out.seq_vals.extend(s.seq_lens)
    return out


def _chain_prev(op_id: np.ndarray, stream: np.ndarray, step: np.ndarray, on_chain: np.ndarray, streams: list[str],
                chain: Chain) -> np.ndarray:
    """Per row: the op id of the previous op on its stream in its step (-1: none), continuing the
    previous page's chain; updates ``chain`` with each stream's last op."""
    n = len(op_id)
    on = np.flatnonzero(on_chain)
    order = on[np.lexsort((on, step[on], stream[on]))]
    prev = np.full(n, -1, dtype=np.int64)
    if not len(order):
        return prev
    same = (stream[order][1:] == stream[order][:-1]) & (step[order][1:] == step[order][:-1])
    prev[order[1:][same]] = op_id[order[:-1][same]]
    # first op of each stream in this page continues the chain of the previous page
    first_of = np.ones(len(order), dtype=bool)
    first_of[1:] = stream[order][1:] != stream[order][:-1]
    last_of = np.ones(len(order), dtype=bool)
    last_of[:-1] = stream[order][1:] != stream[order][:-1]
    for r in order[first_of].tolist():
        carried = chain.last.get(streams[stream[r]])
        if carried is not None and carried[0] == step[r]:
            prev[r] = carried[1]
    for r in order[last_of].tolist():
        chain.last[streams[stream[r]]] = (int(step[r]), int(op_id[r]))
    return prev
