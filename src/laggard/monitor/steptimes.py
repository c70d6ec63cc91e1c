"""Each rank's time in each step of a window: its ops' span and its own work (the union of its ops that
are not communication). ``laggard top`` shows them per rank; the collector computes them beside each
window's analysis (``monitor.analyzer``) and serves them in the job's detail (``rank_steps``), so that a
client reads the same numbers for the steps the collector held whole.

A rank that holds the others back does more of its own work per step than they do, while every rank's
span is the slowest one's: the time the others waited for it is inside their communication ops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from laggard.optable.ops import COMM_KINDS, to_numpy, unique_inverse


@dataclass(kw_only=True, slots=True)
class RankTimes:
    """Per (rank, step) of an op table, in ms (NaN where the rank has no ops in the step)."""

    ranks: np.ndarray  # sorted
    steps: np.ndarray  # sorted
    dp: np.ndarray  # per rank
    stage: np.ndarray
    span_ms: np.ndarray  # (ranks, steps): first op start to last op end
    busy_ms: np.ndarray  # (ranks, steps): the union of its ops that are not communication


def _comm_mask(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Whether each op is communication (``kind`` dictionary-encoded, as tables are, or plain strings)."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    out = []
    for ch in chunks:
        if pa.types.is_dictionary(ch.type):
            labels = np.array([x in COMM_KINDS for x in ch.dictionary.to_pylist()] + [False], dtype=bool)
            idx = ch.indices.fill_null(len(labels) - 1).to_numpy(zero_copy_only=False)
            out.append(labels[idx])
        else:
            out.append(np.array([x in COMM_KINDS for x in ch.to_pylist()], dtype=bool))
    return np.concatenate(out) if out else np.zeros(0, dtype=bool)


def _union_ms(cell: np.ndarray, start: np.ndarray, end: np.ndarray, size: int) -> np.ndarray:
    """Per cell, the time covered by at least one of its intervals (ms): overlapping ops on several
    streams (a GPU stream and the host's data waits) count once."""
    if not len(cell):
        return np.zeros(size)
    # into cell order (stable: a window's table is in step order, and a rank's ops in a step mostly
    # in start order already), then by start within each cell where they are not (ops of several
    # streams): one sort of a packed key, since sorting a million random starts with lexsort took ~0.4 s
    o = np.argsort(cell, kind="stable")
    c, s, e = cell[o], start[o], end[o]
    new = np.r_[True, c[1:] != c[:-1]]
    seg = np.cumsum(new) - 1
    base = np.minimum.reduceat(s, np.flatnonzero(new))[seg]  # each cell's first start: times relative to it are small
    rs, re = s - base, e - base
    big = int(re.max()) + 1
    if (int(seg[-1]) + 1) * big >= 1 << 62:  # cells of many hours each: the packed keys below in µs
        rs, re = rs // 1000, re // 1000
        big = int(re.max()) + 1
        scale = 1e3
    else:
        scale = 1e6
    if ((rs[1:] < rs[:-1]) & ~new[1:]).any():
        o = np.argsort(seg * big + rs)  # keeps each cell where it is (seg leads), its ops by start
        rs, re = rs[o], re[o]
    run = np.maximum.accumulate(re + seg * big) - seg * big
    prior = np.r_[0, run[:-1]]
    prior[new] = rs[new]
    covered = np.maximum(0, re - np.maximum(rs, prior))
    return np.bincount(c, weights=covered.astype(np.float64), minlength=size) / scale


def rank_times(table: pa.Table) -> RankTimes | None:
    """Each rank's span and own work in each step of ``table`` (columns rank, step, dp_rank, pp_rank,
    kind, start_ns, dur_ns); None for no rows."""
    if table.num_rows == 0:
        return None
    rank = to_numpy(table.column("rank")).astype(np.int64)
    step = to_numpy(table.column("step")).astype(np.int64)
    start = to_numpy(table.column("start_ns")).astype(np.int64)
    end = start + to_numpy(table.column("dur_ns")).astype(np.int64)
    comm = _comm_mask(table.column("kind"))
    ranks, ri = unique_inverse(rank)
    steps, si = unique_inverse(step)
    size = len(ranks) * len(steps)
    # cells step by step, as a window's table runs: its sorts below find it (nearly) in order
    cell = si.astype(np.int64) * len(ranks) + ri
    o = np.argsort(cell, kind="stable")
    c = cell[o]
    first = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
    span = np.full(size, np.nan)
    span[c[first]] = (np.maximum.reduceat(end[o], first) - np.minimum.reduceat(start[o], first)) / 1e6
    busy = _union_ms(cell[~comm], start[~comm], end[~comm], size)
    busy[np.isnan(span)] = np.nan
    dp = np.zeros(len(ranks), dtype=np.int64)
    stage = np.zeros(len(ranks), dtype=np.int64)
    dp[ri] = to_numpy(table.column("dp_rank"))
    stage[ri] = to_numpy(table.column("pp_rank"))
    shape = (len(steps), len(ranks))
    return RankTimes(ranks=ranks, steps=steps, dp=dp, stage=stage, span_ms=span.reshape(shape).T.copy(),
                     busy_ms=busy.reshape(shape).T.copy())


def to_json(t: RankTimes) -> dict[str, Any]:
    """The JSON form (ms rounded to the µs; null where a rank has no ops in a step)."""
    def cells(m: np.ndarray) -> list[list[float | None]]:
        return [[None if math.isnan(x) else round(float(x), 3) for x in row] for row in m]

    return {"steps": t.steps.tolist(), "ranks": t.ranks.tolist(), "dp": t.dp.tolist(), "stage": t.stage.tolist(),
            "span_ms": cells(t.span_ms), "busy_ms": cells(t.busy_ms)}


def from_json(d: Any) -> RankTimes | None:
    """``to_json``'s form read back; None for anything else (an older collector sends none)."""
    try:
        ranks = np.asarray(d["ranks"], dtype=np.int64)
        steps = np.asarray(d["steps"], dtype=np.int64)
        shape = (len(ranks), len(steps))

        def grid(k: str) -> np.ndarray:
            m = np.array([[np.nan if x is None else float(x) for x in row] for row in d[k]], dtype=np.float64)
            return m.reshape(shape)

        out = RankTimes(ranks=ranks, steps=steps, dp=np.asarray(d["dp"], dtype=np.int64).reshape(len(ranks)),
                        stage=np.asarray(d["stage"], dtype=np.int64).reshape(len(ranks)),
                        span_ms=grid("span_ms"), busy_ms=grid("busy_ms"))
    except (KeyError, TypeError, ValueError):
        return None
    return out if len(ranks) and len(steps) else None


__all__ = ["RankTimes", "from_json", "rank_times", "to_json"]
