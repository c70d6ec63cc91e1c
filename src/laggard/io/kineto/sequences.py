"""The sequences each forward and backward pass of a CPU rank attends over, read from its attention
calls' recorded shapes (``record_shapes=True``).

A trace from torch.profiler carries no sequence lengths, but every attention call records its
query's shape, [batch, heads, length, head dim] (``laggard.io.kineto.args``). A pass's layers all
attend over the same sequences, so a segment's first attention call tells them: ``batch`` sequences
of ``length`` tokens (a padded batch: every row as long as the longest). With them the diagnosis
tells a DP rank that drew longer sequences (its passes cost what their lengths predict) from a slow
one (its passes cost more than that), as it does with the Tracer's ``seq_lens``.

Where a pass is cut into several segments (a DDP rank's last backward, cut at its gradient
all-reduces), the pieces without an attention call of their own take the pass's sequences: each
piece is that microbatch's work. GPU ranks' segments are kernels (their microbatches are not told
apart): none is given sequences.
"""

from __future__ import annotations

import numpy as np

from laggard.io.kineto.events import RankEvents
from laggard.io.kineto.segments import PHASES, Segments, Streams


def segment_sequences(ev: RankEvents, st: Streams, seg: Segments, seg_mb: np.ndarray, *,
                      device: str) -> tuple[np.ndarray, np.ndarray]:
    """Per segment: (sequences, tokens each) of its pass's attention calls; -1 where none is known."""
    batch = np.full(seg.num, -1, np.int32)
    length = np.full(seg.num, -1, np.int32)
    calls = [(i, m["attn_seqs"]) for i, m in ev.meta.items() if "attn_seqs" in m]
    if device != "cpu" or not calls or not seg.num:
        return batch, length
    idx = np.array([i for i, _ in calls], dtype=np.int64)
    shape = np.array([s for _, s in calls], dtype=np.int64).reshape(-1, 2)
    t, key = ev.ts_us[idx], ev.tid[idx].astype(np.int64)
    seg_key = st.keys[seg.sid]
    for k in np.unique(seg_key):
        rows = np.flatnonzero(seg_key == k)
        rows = rows[np.argsort(seg.first_us[rows], kind="stable")]
        mine = np.flatnonzero(key == k)
        if not len(mine):
            continue
        mine = mine[np.argsort(t[mine], kind="stable")]
        at = np.searchsorted(seg.first_us[rows], t[mine], side="right") - 1
        ok = at >= 0
        # each segment's first call: the calls are in time order, so the first of each run of `at`
        at, mine = at[ok], mine[ok]
        first = np.r_[True, at[1:] != at[:-1]] if len(at) else np.zeros(0, bool)
        batch[rows[at[first]]] = shape[mine[first], 0]
        length[rows[at[first]]] = shape[mine[first], 1]
    _fill_passes(seg, seg_mb, batch, length)
    return batch, length


def _fill_passes(seg: Segments, seg_mb: np.ndarray, batch: np.ndarray, length: np.ndarray) -> None:
    """Pieces of a pass (same stream, step, phase and microbatch) without a call of their own take
    the pass's sequences, where its calls agree on them."""
    fwd, bwd = PHASES.index("forward"), PHASES.index("backward")
    rows = np.flatnonzero(((seg.phase == fwd) | (seg.phase == bwd)) & (seg_mb >= 0))
    if not len(rows):
        return
    cols = (seg.sid[rows], seg.step[rows], seg.phase[rows], seg_mb[rows])
    key = np.zeros(len(rows), np.int64)
    for c in cols:
        key = key * (int(c.max()) + 1) + c.astype(np.int64)
    _, inv = np.unique(key, return_inverse=True)
    known = batch[rows] >= 0
    if known.all() or not known.any():
        return
    n = int(inv.max()) + 1
    code = batch[rows].astype(np.int64) * (2**31) + length[rows]
    lo = np.full(n, np.iinfo(np.int64).max)
    hi = np.full(n, -1, np.int64)
    np.minimum.at(lo, inv[known], code[known])
    np.maximum.at(hi, inv[known], code[known])
    take = ~known & (hi[inv] >= 0) & (lo[inv] == hi[inv])
    batch[rows[take]] = (hi[inv[take]] // (2**31)).astype(np.int32)
    length[rows[take]] = (hi[inv[take]] % (2**31)).astype(np.int32)


__all__ = ["segment_sequences"]
