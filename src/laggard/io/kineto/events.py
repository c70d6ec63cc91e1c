"""Decode one PyTorch-profiler (Kineto) Chrome-trace file into compact event columns.

The file (plain or gzipped JSON) is read as a stream: it is decompressed block by block, the
``traceEvents`` array is cut into chunks at event boundaries and each chunk is decoded with
msgspec straight into small typed records holding only the fields laggard uses (unknown keys,
and events other than complete ones, are skipped by the decoder without building Python
objects). Each chunk becomes compact columns (``array.array``, label codes) before the next is
read, so a rank's raw JSON is never held whole. Files that are not laid out one event per
indented block (e.g. minified JSON) are decoded in one piece.

This module runs in the decode worker processes and imports neither numpy nor pyarrow (a
worker starts in milliseconds); ``RankEvents`` hands its columns to numpy in the parent.

Times stay in the trace's own units here (``ts``/``dur`` in microseconds, floats);
``base_ns`` (``baseTimeNanoseconds``, when present) puts them on the wall clock.
"""

from __future__ import annotations

import re
import time
import zlib
from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import compress, count, islice
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Union

import msgspec

from laggard.errors import LaggardError
from laggard.io.kineto.args import ATTENTION, event_meta
from laggard.io.kineto.repair import repair_names

if TYPE_CHECKING:
    import numpy as np


_BLOCK_BYTES = 2**20  # bytes read per step (compressed: a sixteenth of it)
_MIN_CHUNK_BYTES = 2**20  # events decoded per msgspec call (at least): bounds a worker's memory
_KEY = b'"traceEvents"'


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


class _Header(msgspec.Struct):
    """Top-level keys (events excluded) of a trace file."""

    traceEvents: list[_AnyEvent] | None = None
    distributedInfo: dict[str, Any] | None = None
    deviceProperties: list[Any] | None = None
    baseTimeNanoseconds: int | None = None
    host_name: str | None = None
    trace_id: str | None = None
    traceName: str | None = None
    schemaVersion: int | None = None


class _LooseHeader(_Header):
    traceEvents: list[_LooseEvent] | None = None  # type: ignore[assignment]


_DEC_EVENTS = msgspec.json.Decoder(list[_AnyEvent])
_DEC_LOOSE_EVENTS = msgspec.json.Decoder(list[_LooseEvent])
_DEC_HEADER = msgspec.json.Decoder(_Header)
_DEC_LOOSE_HEADER = msgspec.json.Decoder(_LooseHeader)
_DEC_ANY = msgspec.json.Decoder()

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


class _Columns:
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


# ---------------------------------------------------------------- streaming reader


class _Reader:
    """Decompressed bytes of a file, block by block; one-line errors for corrupt input."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.f = open(path, "rb")  # noqa: SIM115 (closed in close())
        except OSError as e:
            raise LaggardError(f"{path}: cannot read ({e.strerror or e})") from None
        magic = self.f.read(2)
        self.f.seek(0)
        self.gz = zlib.decompressobj(wbits=47) if magic == b"\x1f\x8b" else None
        self.done = False
        self.num_bytes = 0

    def read(self) -> bytes:
        """The next block of decompressed bytes; b"" at the end."""
        out = b""
        while not out and not self.done:
            raw = self.f.read(_BLOCK_BYTES if self.gz is None else _BLOCK_BYTES // 16)
            if self.gz is None:
                self.done = not raw
                out = raw
                continue
            try:
                if not raw:
                    if not self.gz.eof:
                        raise LaggardError(f"{self.path}: truncated gzip file (the compressed stream ends early)")
                    self.done = True
                    break
                out = self.gz.decompress(raw)
                while self.gz.eof and self.gz.unused_data.strip(b"\x00"):
                    # concatenated gzip members: go on with a fresh decompressor
                    rest = self.gz.unused_data
                    self.gz = zlib.decompressobj(wbits=47)
                    out += self.gz.decompress(rest)
            except zlib.error as e:
                raise LaggardError(f"{self.path}: corrupt gzip data ({e})") from None
        self.num_bytes += len(out)
        return out

    def close(self) -> None:
        self.f.close()


def _json_error(path: Path, e: Exception) -> Exception:
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    if isinstance(e, msgspec.ValidationError):
        return LaggardError(f"{path}: not a PyTorch profiler trace ({msg})")
    return LaggardError(f"{path}: not valid JSON ({msg})")


def decode_file(path: str) -> RankEvents:
    """``read_events`` with its CPU time (the unit of work of a decode worker process)."""
    t0 = time.process_time()
    ev = read_events(path)
    ev.cpu_s = time.process_time() - t0
    return ev


def read_events(path: str | Path) -> RankEvents:
    """Decode the events of one Kineto trace file (see the module docstring)."""
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            raise LaggardError(f"{path}: empty file (0 bytes), not a PyTorch profiler trace")
    except OSError as e:
        raise LaggardError(f"{path}: cannot read ({e.strerror or e})") from None
    rd = _Reader(path)
    try:
        return _read(path, rd)
    finally:
        rd.close()


def _read(path: Path, rd: _Reader) -> RankEvents:
    cols = _Columns()
    buf = b""
    # 1. the header: everything before the "traceEvents" key
    while True:
        block = rd.read()
        buf += block
        k = buf.find(_KEY)
        if k >= 0:
            br = buf.find(b"[", k + len(_KEY))
            if br >= 0 or not block:
                break
        if not block:
            break
        if len(buf) > 256 * 2**20:  # no events key in the first 256 MiB: decode the whole thing below
            break
    if not buf.strip():
        raise LaggardError(f"{path}: empty file (no JSON), not a PyTorch profiler trace")
    k = buf.find(_KEY)
    br = buf.find(b"[", k + len(_KEY)) if k >= 0 else -1
    if k < 0 or br < 0 or buf[k + len(_KEY) : br].strip() != b":":
        # not laid out as expected: read all and decode in one piece (reports the right error)
        while True:
            block = rd.read()
            if not block:
                break
            buf += block
        return _whole(path, buf, rd.num_bytes, cols)
    head = buf[:k].rstrip()
    header = _decode_header(path, head + (b"" if head.endswith((b"{", b",")) else b",") + b'"traceEvents": []}')
    buf = bytearray(buf[br:])  # buf[0] is the array's '['
    # 2. the events, in chunks cut after an event that ends a line at the events' indentation;
    # the chunk is decoded in place: its leading '[' or ',' and its trailing ',' become brackets
    sep = _separator(bytes(buf[1:4096]))
    while True:
        block = rd.read()
        if not block:
            break
        buf += block
        if sep is None:
            sep = _separator(bytes(buf[1:4096]))
            continue
        if len(buf) < _MIN_CHUNK_BYTES:
            continue
        cut = buf.rfind(sep)
        if cut <= 0:
            continue
        end = cut + len(sep) - 1  # the ',' after the last whole event
        buf[0], buf[end] = ord("["), ord("]")
        try:
            events = _decode_events(memoryview(buf)[: end + 1])
        except (msgspec.DecodeError, msgspec.ValidationError):
            events = _repaired(bytes(buf[: end + 1]), _decode_events, cols)
        if events is None:
            # the separator matched inside an event (unusual layout): stop chunking
            buf[0], buf[end] = ord(","), ord(",")
            sep = None
            continue
        cols.add(events)
        del events
        del buf[:end]  # keep the ',' as the next chunk's opening
    # 3. the last events and the keys after the array
    tail = _decode_tail(path, b'{"traceEvents":[' + bytes(buf[1:]), cols)
    cols.add(tail.traceEvents or [])
    for key in ("distributedInfo", "deviceProperties", "baseTimeNanoseconds", "host_name", "trace_id", "traceName"):
        v = getattr(tail, key)
        if v is not None and header.get(key) is None:
            header[key] = v
    return cols.finish(str(path), rd.num_bytes, header)


def _decode_tail(path: Path, data: bytes, cols: _Columns) -> _Header:
    """The trace's last events and the keys after them, name lines repaired where that is what
    was wrong (``laggard.io.kineto.repair``)."""
    try:
        return _decode_trace(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        if isinstance(e, msgspec.DecodeError) and "truncated" in str(e).lower():
            raise LaggardError(f"{path}: not valid JSON: the file ends in the middle of the trace "
                               "(truncated?)") from None
        tail = _repaired(data, _decode_trace, cols)
        if tail is None:
            raise _json_error(path, e) from None
        return tail


def _repaired(data: bytes, decode: Any, cols: _Columns) -> Any:
    """``decode(data)`` for data that failed to decode, with its names' quotes escaped
    (``laggard.io.kineto.repair``); None when that is not what was wrong with it."""
    fixed, n = repair_names(data)
    if not n:
        return None
    try:
        out = decode(fixed)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    cols.repaired_names += n
    return out


def _decode_events(data: bytes | memoryview) -> list[Any]:
    """Events of a chunk: the tagged fast path, or the generic one for unusual phases."""
    try:
        return _DEC_EVENTS.decode(data)
    except msgspec.ValidationError:
        return _DEC_LOOSE_EVENTS.decode(data)


def _decode_trace(data: bytes) -> _Header:
    try:
        return _DEC_HEADER.decode(data)
    except msgspec.ValidationError:
        return _DEC_LOOSE_HEADER.decode(data)


def _separator(buf: bytes) -> bytes | None:
    """The byte pattern between two events: newline, the events' indentation, '},'."""
    m = re.match(rb"\s*\n([ \t]*)\{", buf[:4096])
    if m is None:
        return None
    return b"\n" + m.group(1) + b"},"


def _decode_header(path: Path, data: bytes) -> dict[str, Any]:
    try:
        h = _DEC_HEADER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise _json_error(path, e) from None
    return {k: getattr(h, k) for k in _Header.__struct_fields__ if k != "traceEvents" and getattr(h, k) is not None}


def _whole(path: Path, data: bytes, num_bytes: int, cols: _Columns) -> RankEvents:
    try:
        obj = _DEC_ANY.decode(data) if not data.lstrip().startswith(b"{") else None
    except msgspec.DecodeError as e:
        raise _json_error(path, e) from None
    if obj is not None:
        kind = type(obj).__name__
        raise LaggardError(f"{path}: not a PyTorch profiler trace (a JSON {kind}, expected an object with traceEvents)")
    try:
        h = _decode_trace(data)
    except msgspec.DecodeError as e:
        if "truncated" in str(e).lower():
            raise LaggardError(f"{path}: not valid JSON: the file ends in the middle of the trace "
                               "(truncated?)") from None
        raise _json_error(path, e) from None
    except msgspec.ValidationError as e:
        raise _json_error(path, e) from None
    if h.traceEvents is None:
        raise LaggardError(f"{path}: not a PyTorch profiler trace (no traceEvents in the JSON object)")
    cols.add(h.traceEvents)
    header = {k: getattr(h, k) for k in _Header.__struct_fields__ if k != "traceEvents" and getattr(h, k) is not None}
    return cols.finish(str(path), num_bytes, header)


def peek(path: Path, num_bytes: int = 65536) -> bytes:
    """The first decompressed bytes of a file (format detection); b'' when unreadable."""
    try:
        with open(path, "rb") as f:
            raw = f.read(num_bytes)
        if raw[:2] == b"\x1f\x8b":
            return zlib.decompressobj(wbits=47).decompress(raw, num_bytes)
        return raw
    except (OSError, zlib.error):
        return b""
