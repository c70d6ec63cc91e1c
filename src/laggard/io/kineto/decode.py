"""Read one PyTorch-profiler (Kineto) Chrome-trace file into ``RankEvents``, as a stream.

The file (plain or gzipped JSON) is decompressed block by block, the ``traceEvents`` array is cut
into chunks at event boundaries and each chunk is decoded into records and turned into columns
(``laggard.io.kineto.events``) before the next is read, so a rank's raw JSON is never held whole.
Files that are not laid out one event per indented block (e.g. minified JSON) are decoded in one
piece. Corrupt, truncated or foreign input ends in one line (``LaggardError``).

This module runs in the decode worker processes (``decode_file`` is their unit of work) and, like
``events``, imports neither numpy nor pyarrow.
"""

from __future__ import annotations

import re
import time
import zlib
from pathlib import Path
from typing import Any

import msgspec

from laggard.errors import LaggardError
from laggard.io.kineto.events import (
    Columns,
    Header,
    RankEvents,
    decode_events,
    decode_header,
    decode_trace,
    header_keys,
)
from laggard.io.kineto.repair import repair_names

_BLOCK_BYTES = 2**20  # bytes read per step (compressed: a sixteenth of it)
_MIN_CHUNK_BYTES = 2**20  # events decoded per msgspec call (at least): bounds a worker's memory
_KEY = b'"traceEvents"'


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
    cols = Columns()
    buf = _read_head(rd)
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
    rest = _read_chunks(rd, bytearray(buf[br:]), cols)
    # 3. the last events and the keys after the array
    tail = _decode_tail(path, b'{"traceEvents":[' + bytes(rest[1:]), cols)
    cols.add(tail.traceEvents or [])
    for key in ("distributedInfo", "deviceProperties", "baseTimeNanoseconds", "host_name", "trace_id", "traceName"):
        v = getattr(tail, key)
        if v is not None and header.get(key) is None:
            header[key] = v
    return cols.finish(str(path), rd.num_bytes, header)


def _read_head(rd: _Reader) -> bytes:
    """1. The header: the bytes up to the ``[`` that opens the events (or all of them, up to 256 MiB,
    when there is no such key)."""
    buf = b""
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
    return buf


def _read_chunks(rd: _Reader, buf: bytearray, cols: Columns) -> bytearray:
    """2. The events, in chunks cut after an event that ends a line at the events' indentation, added
    to ``cols``; ``buf`` starts with the array's ``[``. Returns what is left after the last cut (its
    first byte the ``[`` or the ``,`` before its first event). Each chunk is decoded in place: its
    leading '[' or ',' and its trailing ',' become brackets."""
    sep = _separator(bytes(buf[1:4096]))
    while True:
        block = rd.read()
        if not block:
            return buf
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
            events = decode_events(memoryview(buf)[: end + 1])
        except (msgspec.DecodeError, msgspec.ValidationError):
            events = _repaired(bytes(buf[: end + 1]), decode_events, cols)
        if events is None:
            # the separator matched inside an event (unusual layout): stop chunking
            buf[0], buf[end] = ord(","), ord(",")
            sep = None
            continue
        cols.add(events)
        del events
        del buf[:end]  # keep the ',' as the next chunk's opening


def _decode_tail(path: Path, data: bytes, cols: Columns) -> Header:
    """The trace's last events and the keys after them, name lines repaired where that is what
    was wrong (``laggard.io.kineto.repair``)."""
    try:
        return decode_trace(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        if isinstance(e, msgspec.DecodeError) and "truncated" in str(e).lower():
            raise LaggardError(f"{path}: not valid JSON: the file ends in the middle of the trace "
                               "(truncated?)") from None
        tail = _repaired(data, decode_trace, cols)
        if tail is None:
            raise _json_error(path, e) from None
        return tail


def _repaired(data: bytes, decode: Any, cols: Columns) -> Any:
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


def _separator(buf: bytes) -> bytes | None:
    """The byte pattern between two events: newline, the events' indentation, '},'."""
    m = re.match(rb"\s*\n([ \t]*)\{", buf[:4096])
    if m is None:
        return None
    return b"\n" + m.group(1) + b"},"


def _decode_header(path: Path, data: bytes) -> dict[str, Any]:
    try:
        return decode_header(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise _json_error(path, e) from None


def _whole(path: Path, data: bytes, num_bytes: int, cols: Columns) -> RankEvents:
    try:
        obj = msgspec.json.decode(data) if not data.lstrip().startswith(b"{") else None
    except msgspec.DecodeError as e:
        raise _json_error(path, e) from None
    if obj is not None:
        kind = type(obj).__name__
        raise LaggardError(f"{path}: not a PyTorch profiler trace (a JSON {kind}, expected an object with traceEvents)")
    try:
        h = decode_trace(data)
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
    header = header_keys(h)
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
