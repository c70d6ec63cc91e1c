"""The complete events of one PyTorch-profiler (Kineto) trace file: the records msgspec decodes
them into and the compact columns they become (``RankEvents``).

msgspec decodes straight into small typed records holding only the fields laggard uses (unknown
keys, and events other than complete ones, are skipped by the decoder without building Python
objects). ``Columns`` turns each decoded chunk into compact columns (``array.array``, label codes)
before the next is read (``laggard.io.kineto.decode`` reads a file as a stream of such chunks).

This module runs in the decode worker processes and imports neither numpy nor pyarrow (a
worker starts in milliseconds); ``RankEvents`` hands its columns to numpy in the parent.

Times stay in the trace's own units here (``ts``/``dur`` in microseconds, floats);
``base_ns`` (``baseTimeNanoseconds``, when present) puts them on the wall clock.
"""

from __future__ import annotations

import re
from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import compress, count, islice
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any, ClassVar, Union

import msgspec

from laggard.io.kineto.args import ATTENTION, event_meta

if TYPE_CHECKING:
    import numpy as np


class _Args(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` keys laggard reads; the rest are skipped by the decoder."""

    corr: int = msgspec.field(default=-1, name="correlation")
    # collective metadata (record_param_comms and, in newer traces, the NCCL kernel itself)
    coll: str | None = msgspec.field(default=None, name="Collective name")
    pg_name: str | int | None = msgspec.field(default=None, name="Process Group Name")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: str | list[int] | None = msgspec.field(default=None, name="Process Group Ranks")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    dtype: str | None = None
    seq: int | str | None = msgspec.field(default=None, name="Seq")
    src: int | None = msgspec.field(default=None, name="Src Rank")
    dst: int | None = msgspec.field(default=None, name="Dst Rank")
    # shapes (record_shapes=True): kept undecoded, read only for the few collective events
    in_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    in_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    # c10d::send / c10d::recv_ (record_shapes=True): (tensors, group, peer rank in the group, tag)
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Concrete Inputs")


_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete event (``"ph": "X"``): the only kind laggard reads."""

    complete: ClassVar[bool] = True
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: _Args = _NO_ARGS


class _Other(msgspec.Struct, gc=False):
    """Any other event phase (flows, instants, metadata, ...): every key is skipped."""

    complete: ClassVar[bool] = False


# every Chrome-trace phase but "X" (a tagged union lets the decoder skip those events whole)
_PHASES = ("B", "E", "I", "i", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M", "V", "v", "R", "c", "(", ")")
_OTHERS = tuple(
    msgspec.defstruct(f"_Phase{i}", [], bases=(_Other,), tag_field="ph", tag=ph, gc=False)
    for i, ph in enumerate(_PHASES)
)
_AnyEvent = Union[(_Event, *_OTHERS)]  # noqa: UP007 (built from a tuple)


class _LooseEvent(msgspec.Struct, gc=False):
    """Fallback for events without a known ``ph``: decoded generically, filtered afterwards."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: _Args = _NO_ARGS


class Header(msgspec.Struct):
    """Top-level keys (events excluded) of a trace file."""

    traceEvents: list[_AnyEvent] | None = None
    distributedInfo: dict[str, Any] | None = None
    deviceProperties: list[Any] | None = None
    baseTimeNanoseconds: int | None = None
    host_name: str | None = None
    trace_id: str | None = None
    traceName: str | None = None
    schemaVersion: int | None = None


class _LooseHeader(Header):
    traceEvents: list[_LooseEvent] | None = None  # type: ignore[assignment]


_DEC_EVENTS = msgspec.json.Decoder(list[_AnyEvent])
_DEC_LOOSE_EVENTS = msgspec.json.Decoder(list[_LooseEvent])
_DEC_HEADER = msgspec.json.Decoder(Header)
_DEC_LOOSE_HEADER = msgspec.json.Decoder(_LooseHeader)


def decode_events(data: bytes | memoryview) -> list[Any]:
    """Events of a chunk: the tagged fast path, or the generic one for unusual phases."""
    try:
        return _DEC_EVENTS.decode(data)
    except msgspec.ValidationError:
        return _DEC_LOOSE_EVENTS.decode(data)


def decode_trace(data: bytes) -> Header:
    """A whole trace object (or its tail: the last events and the keys after them)."""
    try:
        return _DEC_HEADER.decode(data)
    except msgspec.ValidationError:
        return _DEC_LOOSE_HEADER.decode(data)


def decode_header(data: bytes) -> dict[str, Any]:
    """The top-level keys of a trace object whose events were cut off (the strict decoder: its
    errors are the caller's to word)."""
    return header_keys(_DEC_HEADER.decode(data))


def header_keys(h: Header) -> dict[str, Any]:
    """The keys a decoded trace holds, events excluded."""
    return {k: getattr(h, k) for k in Header.__struct_fields__ if k != "traceEvents" and getattr(h, k) is not None}

# names whose events carry the metadata build_rank reads: collectives and the calls launching them
_META_NAME = re.compile(r"^(nccl|rccl|gloo|record_param_comms|c10d::(send|recv))", re.IGNORECASE)
# ... and attention calls (the sequences they attend over: laggard.io.kineto.args)
_META_NAMES = (_META_NAME, ATTENTION)
_COMPLETE = attrgetter("complete")
_PH, _TS, _DUR, _CORR = (attrgetter(k) for k in ("ph", "ts", "dur", "args.corr"))
_CAT, _NAME, _PID, _TID = (attrgetter(k) for k in ("cat", "name", "pid", "tid"))


def _codebook() -> defaultdict[Any, int]:
    """A dict that gives every new key the next code: ``map(book.__getitem__, keys)`` factorises
    in C (codes in order of first appearance)."""
    book: defaultdict[Any, int] = defaultdict()
    book.default_factory = book.__len__
    return book


def _split(pairs: list[tuple[Any, Any]], k: int) -> tuple[array, list[str]]:
    """Element ``k`` of every pair as codes into its labels (in order of first appearance)."""
    book = _codebook()
    return array("i", map(book.__getitem__, map(itemgetter(k), pairs))), [str(x) for x in book]


@dataclass(kw_only=True, slots=True)
class RankEvents:
    """The complete events (``ph == "X"``) of one trace file as columns.

    Compact for the trip from a decode worker to the parent: ``array.array`` columns, and each
    event's (cat, name) and (pid, tid) as one code into the pairs seen. ``cat``, ``name``, ``pid``,
    ``tid`` (codes into ``cats``... ``tids``, labels in order of first appearance), ``ts_us``,
    ``dur_us`` and ``corr`` are the numpy columns (numpy is imported on first use).
    """

    path: str
    num_bytes: int  # uncompressed JSON bytes read
    header: dict[str, Any]
    cats: list[str]
    names: list[str]
    pids: list[str]  # pids and tids are labels: numbers or strings
    tids: list[str]
    what_codes: array  # C int per event: its (cat, name) pair
    what_cat: array  # per pair: code into cats
    what_name: array  # per pair: code into names
    where_codes: array  # C int per event: its (pid, tid) pair
    where_pid: array
    where_tid: array
    ts_col: array  # float64, µs
    dur_col: array
    corr_col: array  # int64 (``args.correlation``), -1 when absent
    meta: dict[int, dict[str, Any]] = field(default_factory=dict)  # event index -> metadata (laggard.io.kineto.args)
    cpu_s: float = 0.0  # CPU time spent decoding
    repaired_names: int = 0  # event names with unescaped quotes, escaped (laggard.io.kineto.repair)
    _cols: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def num_events(self) -> int:
        return len(self.ts_col)

    def _column(self, key: str) -> np.ndarray:
        col = self._cols.get(key)
        if col is None:
            import numpy as np

            def view(a: array, dtype: type) -> np.ndarray:
                return np.frombuffer(a, dtype=dtype) if len(a) else np.zeros(0, dtype=dtype)

            if key in ("cat", "name", "pid", "tid"):
                codes, lut = (self.what_codes, getattr(self, f"what_{key}")) if key in ("cat", "name") else (
                    self.where_codes, getattr(self, f"where_{key}"))
                col = view(lut, np.intc)[view(codes, np.intc)]
            else:
                col = view(getattr(self, key + "_col"), np.int64 if key == "corr" else np.float64)
            self._cols[key] = col
        return col

    # the numpy columns, one property each (built on first use)
    cat = property(lambda self: self._column("cat"), doc="code into cats")
    name = property(lambda self: self._column("name"), doc="code into names")
    pid = property(lambda self: self._column("pid"), doc="code into pids")
    tid = property(lambda self: self._column("tid"), doc="code into tids")
    ts_us = property(lambda self: self._column("ts"), doc="start, µs (float64)")
    dur_us = property(lambda self: self._column("dur"), doc="duration, µs (float64)")
    corr = property(lambda self: self._column("corr"), doc="args.correlation (int64), -1 when absent")


class Columns:
    """Columns grown chunk by chunk; labels are coded across chunks as they appear."""

    def __init__(self) -> None:
        self.whats = _codebook()  # (cat, name) -> code
        self.wheres = _codebook()  # (pid, tid) -> code
        self.what_codes = array("i")
        self.where_codes = array("i")
        self.ts = array("d")
        self.dur = array("d")
        self.corr = array("q")
        self.meta: dict[int, dict[str, Any]] = {}
        self.meta_codes: set[int] = set()  # (cat, name) codes whose events carry metadata
        self.num_checked = 0
        self.repaired_names = 0  # name lines whose quotes were escaped (laggard.io.kineto.repair)

    def add(self, events: list[Any]) -> None:
        """Append the complete events of a decoded chunk (C-level passes, no loop per event)."""
        if not events:
            return
        if isinstance(events[0], _LooseEvent):
            evs = list(compress(events, map("X".__eq__, map(_PH, events))))
        else:
            evs = list(filter(_COMPLETE, events))
        if not evs:
            return
        start = len(self.ts)
        # array.fromlist(list(map(...))): two C loops, as fast as numpy.fromiter
        whats = self.whats
        # (cat, name) and (pid, tid) pairs from zip, which reuses its tuple when the lookup
        # does not keep it: cheaper than a new tuple per event
        what_codes = list(map(whats.__getitem__, zip(map(_CAT, evs), map(_NAME, evs), strict=True)))
        self.what_codes.fromlist(what_codes)
        self.where_codes.fromlist(list(map(self.wheres.__getitem__, zip(map(_PID, evs), map(_TID, evs), strict=True))))
        self.ts.fromlist(list(map(_TS, evs)))
        self.dur.fromlist(list(map(_DUR, evs)))
        self.corr.fromlist(list(map(_CORR, evs)))
        if len(whats) > self.num_checked:  # one regex per new (cat, name), not per event
            new = islice(whats, self.num_checked, None)
            self.meta_codes.update(c for c, (_, s) in enumerate(new, self.num_checked)
                                   if any(p.match(s) for p in _META_NAMES))
            self.num_checked = len(whats)
        if self.meta_codes:  # metadata of the few events that need it: a loop over those only
            for i in compress(count(), map(self.meta_codes.__contains__, what_codes)):
                self.meta[start + i] = event_meta(evs[i].args, evs[i].name)

    def finish(self, path: str, num_bytes: int, header: dict[str, Any]) -> RankEvents:
        whats, wheres = list(self.whats), list(self.wheres)
        what_cat, cats = _split(whats, 0)
        what_name, names = _split(whats, 1)
        where_pid, pids = _split(wheres, 0)
        where_tid, tids = _split(wheres, 1)
        return RankEvents(
            path=path,
            num_bytes=num_bytes,
            header=header,
            cats=cats,
            names=names,
            pids=pids,
            tids=tids,
            what_codes=self.what_codes,
            what_cat=what_cat,
            what_name=what_name,
            where_codes=self.where_codes,
            where_pid=where_pid,
            where_tid=where_tid,
            ts_col=self.ts,
            dur_col=self.dur,
            corr_col=self.corr,
            meta=self.meta,
            repaired_names=self.repaired_names,
        )
