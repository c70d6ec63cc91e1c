"""An event's metadata from its profiler args: a collective's process group, ranks, sequence number,
payload size (from the element count and dtype, or the first tensor argument's shape), a gloo
point-to-point call's peer (``c10d::send`` / ``c10d::recv_``: its third concrete input), and the
sequences an attention call attends over (``scaled_dot_product_attention`` and its kernels, forward
and backward, with ``record_shapes=True``: the query's, or the output gradient's, [batch, heads,
length, head dim])."""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

_C10D_P2P = re.compile(r"^c10d::(send|recv)")
# PyTorch's attention entry point and the kernels it dispatches to (flash, efficient, cuDNN, math,
# the CPU flash kernel), forward and backward: each takes its query (backward: the output's
# gradient) first, laid out [batch, heads, length, head dim]. (flash-attn's own ops lay it out
# [batch, length, heads, head dim], and its varlen ones pack the batch: not read.)
ATTENTION = re.compile(r"^aten::_?scaled_dot_product_")
_DEC_ANY = msgspec.json.Decoder()


_DTYPE_BYTES = {
    "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "bf16": 2, "double": 8, "float64": 8,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "long int": 8, "short": 2, "int16": 2, "char": 1, "int8": 1,
    "signed char": 1, "unsigned char": 1, "uint8": 1, "byte": 1, "bool": 1, "c10::half": 2, "c10::bfloat16": 2,
}


def dtype_bytes(name: str | None) -> int | None:
    if not name:
        return None
    return _DTYPE_BYTES.get(name.strip().lower().removeprefix("torch."))


def event_meta(a: Any, name: str) -> dict[str, Any]:  # a: the event's args (events._Args)
    m: dict[str, Any] = {}
    if ATTENTION.match(name):
        seqs = _attention_seqs(a.in_dims)
        if seqs is not None:
            m["attn_seqs"] = seqs
        return m
    if _C10D_P2P.match(name):
        peer = _c10d_peer(a.concrete)
        if peer is not None:
            m["c10d_peer"] = peer
        return m
    if a.coll is not None:
        m["coll"] = a.coll
    if a.pg_name is not None:
        m["pg_name"] = str(a.pg_name)
    if a.pg_desc is not None:
        m["pg_desc"] = a.pg_desc
    if a.pg_ranks is not None:
        ranks = a.pg_ranks
        if isinstance(ranks, str):
            try:
                ranks = _DEC_ANY.decode(ranks.encode())
            except msgspec.DecodeError:
                ranks = None
        if isinstance(ranks, list) and all(isinstance(r, int) for r in ranks):
            m["pg_ranks"] = ranks
    if a.group_size is not None:
        m["group_size"] = a.group_size
    elem = dtype_bytes(a.dtype)
    nelems = a.in_nelems if a.in_nelems is not None else a.out_nelems
    if nelems is not None and a.out_nelems is not None:
        nelems = max(nelems, a.out_nelems)
    if nelems is not None and elem is not None:
        m["size_bytes"] = int(nelems) * elem
    if a.seq is not None:
        try:
            m["seq"] = int(a.seq)
        except ValueError:
            pass
    if a.src is not None:
        m["src"] = a.src
    if a.dst is not None:
        m["dst"] = a.dst
    if "size_bytes" not in m and len(a.in_dims) and len(a.in_type):
        size = _shape_bytes(a.in_dims, a.in_type)
        if size is not None:
            m["size_bytes"] = size
    return m


def _decoded(raw: msgspec.Raw) -> Any:
    """An undecoded args value (``Input Dims``, ``Concrete Inputs``), decoded; None if absent or corrupt."""
    if not len(raw):
        return None
    try:
        return _DEC_ANY.decode(raw)
    except msgspec.DecodeError:
        return None


def _c10d_peer(raw: msgspec.Raw) -> int | None:
    """The peer rank (within the call's process group) of a c10d::send / c10d::recv_ call."""
    args = _decoded(raw)
    if isinstance(args, list) and len(args) >= 3 and isinstance(args[2], str) and args[2].isdigit():
        return int(args[2])
    return None


def _attention_seqs(raw: msgspec.Raw) -> tuple[int, int] | None:
    """(sequences, tokens each) an attention call attends over: its first input's batch and length."""
    dims = _decoded(raw)
    q = dims[0] if isinstance(dims, list) and dims else None
    if not isinstance(q, list) or len(q) != 4 or not all(isinstance(x, int) and x > 0 for x in q):
        return None
    return q[0], q[2]


def _shape_bytes(dims_raw: msgspec.Raw, type_raw: msgspec.Raw) -> int | None:
    """Bytes of the first tensor argument (gloo events: ``Input Dims`` [[n, ...]], ``Input type``)."""
    try:
        dims = _DEC_ANY.decode(dims_raw)
        types = _DEC_ANY.decode(type_raw)
    except msgspec.DecodeError:
        return None
    if not dims or not types or not isinstance(dims, list) or not isinstance(types, list):
        return None
    shape = dims[0]
    if isinstance(shape, list) and shape and isinstance(shape[0], list):  # TensorList: first tensor
        shape = shape[0]
    elem = dtype_bytes(str(types[0]))
    if not isinstance(shape, list) or elem is None or not all(isinstance(x, int) for x in shape):
        return None
    return math.prod(shape) * elem if shape else elem


__all__ = ["dtype_bytes", "event_meta"]
