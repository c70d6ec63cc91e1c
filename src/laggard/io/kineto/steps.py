"""Steps across ranks: one numbering when the ranks' ProfilerStep#N numbers differ.

``ProfilerStep#N`` counts the steps since *that rank's* profiler started, so ranks whose profilers
started at different training steps label the same step differently. Each rank's offset from a
reference rank is read from what the ranks did together:

* **collective sequence numbers** (NCCL metadata): the same (process group, sequence number) is
  one collective, so its step on two ranks must be the same step;
* else, for ranks on one clock (same host): the collectives that end at the same moment.

Offsets are chained through ranks already placed (rank b can be placed from rank a when they
share a process group), and the most common difference wins (a few collectives straddling a step
boundary do not move it).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from laggard.io.kineto.comm import KIND_COLL, KIND_RECV, KIND_SEND
from laggard.io.kineto.rank import RankOps

# a difference is trusted when at least this share of the matched collectives / steps agree on it
_MIN_AGREEMENT = 0.5


def unify_steps(ranks: list[RankOps]) -> list[str]:
    """Shift each rank's steps into the first rank's numbering; returns what was done (warnings)."""
    if len(ranks) < 2:
        return []
    keys = [_seq_keys(r) for r in ranks]
    offset: dict[int, int] = {0: 0}
    how: dict[int, str] = {}
    todo = list(range(1, len(ranks)))
    while todo:
        placed = False
        for i in list(todo):
            for j in list(offset):
                d = _by_seq(keys[j], keys[i])
                src = "collective sequence numbers"
                if d is None and _same_clock(ranks[i], ranks[j]):
                    d, src = _by_time(ranks[j], ranks[i]), "collectives ending together"
                if d is not None:
                    offset[i], how[i] = offset[j] + d, src
                    todo.remove(i)
                    placed = True
                    break
        if not placed:
            break
    moved = {i: k for i, k in offset.items() if k}
    if not moved:
        return []
    for i, k in moved.items():
        ranks[i].step = ranks[i].step + k
    desc = ", ".join(f"rank {ranks[i].rank} by {k:+d}" for i, k in list(moved.items())[:6])
    srcs = sorted({how[i] for i in moved})
    return [f"ProfilerStep numbers differ between ranks (profilers started at different steps): renumbered "
            f"{desc}{' ...' if len(moved) > 6 else ''} to rank {ranks[0].rank}'s steps, "
            f"matched by {' and '.join(srcs)}"]


def _seq_keys(r: RankOps) -> dict[tuple[str, int], int]:
    """(process group, sequence number) -> step, for the rank's collectives that carry both."""
    rows = np.flatnonzero((r.meta_seq >= 0) & (r.group >= 0))
    out: dict[tuple[str, int], int] = {}
    for g, q, s in zip(r.group[rows].tolist(), r.meta_seq[rows].tolist(), r.step[rows].tolist(), strict=True):
        label = r.groups[g]
        if not label.startswith("p2p:"):
            out[(label, q)] = s
    return out


def _mode(diffs: list[int]) -> int | None:
    if not diffs:
        return None
    d, n = Counter(diffs).most_common(1)[0]
    return d if n >= _MIN_AGREEMENT * len(diffs) else None


def _by_seq(ref: dict[tuple[str, int], int], other: dict[tuple[str, int], int]) -> int | None:
    return _mode([ref[k] - s for k, s in other.items() if k in ref])


def _same_clock(a: RankOps, b: RankOps) -> bool:
    return a.host is not None and a.host == b.host and a.base_ns == b.base_ns


def _by_time(ref: RankOps, other: RankOps) -> int | None:
    """A collective ends at about the same moment on all its ranks: per collective of ``other``, the
    step of ``ref``'s collective ending nearest to it; the common difference. (Step windows would
    mislead: a straggler's window of step s reaches into the others' step s + 1.)"""
    def ends(r: RankOps) -> tuple[np.ndarray, np.ndarray]:
        rows = np.flatnonzero(np.isin(r.kind, (KIND_COLL, KIND_SEND, KIND_RECV)))  # the collectives
        e = r.start_ns[rows] + r.dur_ns[rows]
        o = np.argsort(e, kind="stable")
        return e[o], r.step[rows][o]

    e_r, s_r = ends(ref)
    e_o, s_o = ends(other)
    if not len(e_r) or not len(e_o):
        return None
    j = np.clip(np.searchsorted(e_r, e_o), 1, max(len(e_r) - 1, 1))
    left = np.maximum(j - 1, 0)
    j = np.minimum(j, len(e_r) - 1)
    near = np.where(np.abs(e_r[left] - e_o) <= np.abs(e_r[j] - e_o), left, j)
    return _mode((s_r[near] - s_o).tolist())
