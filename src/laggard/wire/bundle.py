"""Several op batches in one request: what a node's relay (``laggard monitor relay``) sends.

A bundle is the batches' bodies exactly as their tracers encoded them (``laggard.wire.batch``),
framed: the magic line ``LAGGARD-BUNDLE 1``, then per batch its length (4 bytes, big-endian) and its
bytes. The collector checks and stores each batch as if it had come alone (keyed by its own
(job, rank, seq)), so a relay adds no state of its own that a restart could lose; what a bundle
saves is the collector's per-request cost (HTTP, the commit), ~1 ms of CPU per batch on two cores.
"""

from __future__ import annotations

import struct

from laggard.wire.batch import BadBatch

BUNDLE_CONTENT_TYPE = "application/vnd.laggard.bundle"
MAGIC = b"LAGGARD-BUNDLE 1\n"
# batches per bundle: a relay on an 8-GPU node sends its ranks' batches of one flush together; the
# cap bounds what one request makes the collector decode before it answers
MAX_PARTS = 4096
_LEN = struct.Struct(">I")


def encode_bundle(bodies: list[bytes]) -> bytes:
    """One request body holding ``bodies`` (each an ``encode_batch`` body)."""
    if not bodies or len(bodies) > MAX_PARTS:
        raise ValueError(f"a bundle holds 1-{MAX_PARTS} batches, got {len(bodies)}")
    out = [MAGIC]
    for b in bodies:
        out += [_LEN.pack(len(b)), b]
    return b"".join(out)


def decode_bundle(body: bytes) -> list[bytes]:
    """The batch bodies of a bundle; ``BadBatch`` with one line saying what is wrong and where."""
    if not body.startswith(MAGIC):
        raise BadBatch(f"bundle: the body does not start with {MAGIC.strip().decode()!r}")
    parts, pos, end = [], len(MAGIC), len(body)
    while pos < end:
        if pos + _LEN.size > end:
            raise BadBatch(f"bundle: truncated at byte {pos} (a part's length is cut off)")
        (n,) = _LEN.unpack_from(body, pos)
        pos += _LEN.size
        if n == 0 or pos + n > end:
            raise BadBatch(f"bundle part {len(parts)}: {n} bytes declared at byte {pos - _LEN.size}, "
                           f"{end - pos} left in the body")
        parts.append(body[pos:pos + n])
        pos += n
        if len(parts) > MAX_PARTS:
            raise BadBatch(f"bundle: more than {MAX_PARTS} parts")
    if not parts:
        raise BadBatch("bundle: no parts")
    return parts
