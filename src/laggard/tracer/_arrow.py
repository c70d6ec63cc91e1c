"""Numpy columns as Arrow arrays built from their buffers, for the tracer's writer thread.

``pa.array`` looks for pandas objects on its first call, importing pandas to do so: ~0.4 s of CPU and
~100 MB in every traced process, spent by the writer thread on the first page while the training
thread competes with it for the GIL. Arrays built from buffers never ask. Values in null slots stay
as given (Arrow ignores them).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def _validity(valid: np.ndarray | None) -> tuple[pa.Buffer | None, int]:
    """The validity bitmap (None: no nulls) and the null count."""
    if valid is None:
        return None, 0
    nulls = len(valid) - int(np.count_nonzero(valid))
    if not nulls:
        return None, 0
    return pa.py_buffer(np.packbits(valid, bitorder="little")), nulls


def ints(values: np.ndarray, typ: pa.DataType, valid: np.ndarray | None = None) -> pa.Array:
    """A signed integer column of Arrow type ``typ`` (``values`` cast to its width)."""
    assert pa.types.is_signed_integer(typ), typ
    data = np.ascontiguousarray(values, dtype=np.dtype(f"<i{typ.bit_width // 8}"))
    bitmap, nulls = _validity(valid)
    return pa.Array.from_buffers(typ, len(data), [bitmap, pa.py_buffer(data)], null_count=nulls)


def strings(labels: list[str]) -> pa.Array:
    data = [s.encode() for s in labels]
    offsets = np.zeros(len(data) + 1, dtype=np.int32)
    np.cumsum(np.fromiter((len(b) for b in data), dtype=np.int32, count=len(data)), out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])


def dictionary(codes: np.ndarray, labels: list[str], index_type: pa.DataType) -> pa.DictionaryArray:
    """Codes into ``labels`` (-1: null) as a dictionary array with ``index_type`` indices."""
    valid = codes >= 0
    idx = ints(np.where(valid, codes, 0), index_type, valid)
    return pa.DictionaryArray.from_arrays(idx, strings(labels if labels else [""]))


def lists(counts: np.ndarray, values: np.ndarray, valid: np.ndarray | None, value_type: pa.DataType) -> pa.Array:
    """Row i holds the next ``counts[i]`` of ``values`` (null where ``valid`` is False)."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    bitmap, nulls = _validity(valid)
    return pa.Array.from_buffers(pa.list_(value_type), len(counts), [bitmap, pa.py_buffer(offsets)],
                                 null_count=nulls, children=[ints(values, value_type)])
