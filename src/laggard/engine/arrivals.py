"""Arrival skew at collectives: who arrives last, and how far behind the first arrival.

For every collective with at least two participants (ops sharing ``(step, group, seq)`` of kind
``collective``), a rank's *lag* is its start minus the earliest start among the participants
(clocks already aligned by the importer). Per rank: how many collectives it arrived last at
(``last_count``; ties at the maximum lag are not counted), and its mean and p99 lag, overall and
per process group. Vectorised over ops.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from laggard.engine.sorting import lex_order
from laggard.optable.ops import Job


def _instances(job: Job) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Participant rows (sorted by instance), instance id per row, and the group code per row."""
    gcode, glabels = job.codes("group")
    kcode, klabels = job.codes("kind")
    coll_kind = klabels.index("collective") if "collective" in klabels else -1
    rows = np.flatnonzero((gcode >= 0) & (kcode == coll_kind))
    if len(rows) == 0:
        z = np.zeros(0, np.int64)
        return z, z, z, z, glabels
    step = job.column("step")[rows]
    seq = job.column("seq")[rows]
    o = lex_order(step, gcode[rows], seq)
    r = rows[o]
    new = np.ones(len(r), bool)
    new[1:] = (step[o][1:] != step[o][:-1]) | (gcode[r][1:] != gcode[r][:-1]) | (seq[o][1:] != seq[o][:-1])
    inst = np.cumsum(new) - 1
    size = np.bincount(inst)
    keep = size[inst] >= 2
    r, inst = r[keep], inst[keep]
    _, inst = np.unique(inst, return_inverse=True)
    return r, inst, gcode[r], np.bincount(inst), glabels


def _stats(rank: np.ndarray, lag_s: np.ndarray, last: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per rank: num_collectives, last_count, mean_lag_s, p99_lag_s (vectorised)."""
    if len(rank) == 0:
        return {}
    ranks, inv = np.unique(rank, return_inverse=True)
    cnt = np.bincount(inv)
    mean = np.bincount(inv, weights=lag_s) / cnt
    lasts = np.bincount(inv, weights=last.astype(np.float64)).astype(np.int64)
    o = np.lexsort((lag_s, inv))
    sorted_lag = lag_s[o]
    start = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    pos = 0.99 * (cnt - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, cnt - 1)
    frac = pos - lo
    p99 = sorted_lag[start + lo] * (1 - frac) + sorted_lag[start + hi] * frac
    return {
        str(int(rk)): {
            "num_collectives": int(cnt[i]),
            "last_count": int(lasts[i]),
            "last_share": float(lasts[i] / cnt[i]),
            "mean_lag_s": float(mean[i]),
            "p99_lag_s": float(p99[i]),
        }
        for i, rk in enumerate(ranks.tolist())
    }


def arrivals(job: Job) -> dict[str, Any]:
    """``{"arrivals": {rank: {...}}, "arrivals_by_group": {group: {rank: {...}}}, "num_collectives": n}``."""
    rows, inst, g, size, glabels = _instances(job)
    if len(rows) == 0:
        return {"arrivals": {}, "arrivals_by_group": {}, "num_collectives": 0}
    start = job.column("start_ns")[rows].astype(np.int64)
    rank = job.column("rank")[rows].astype(np.int64)
    first = np.full(len(size), np.iinfo(np.int64).max)
    np.minimum.at(first, inst, start)
    latest = np.full(len(size), np.iinfo(np.int64).min)
    np.maximum.at(latest, inst, start)
    lag_s = (start - first[inst]) * 1e-9
    is_max = start == latest[inst]
    n_max = np.bincount(inst, weights=is_max.astype(np.float64))
    last = is_max & (n_max[inst] == 1)
    by_group = {}
    for code in np.unique(g).tolist():  # one pass per process group
        m = g == code
        by_group[glabels[code]] = _stats(rank[m], lag_s[m], last[m])
    return {"arrivals": _stats(rank, lag_s, last), "arrivals_by_group": by_group, "num_collectives": int(len(size))}


def job_extras(job: Job) -> dict[str, Any]:
    """Importer-specific results for ``Analysis.extras``: arrivals and clock offsets (Kineto jobs)."""
    if not job.meta.source.startswith("kineto"):
        return {}
    out = arrivals(job)
    out["clock_offsets_s"] = dict(job.meta.extra.get("clock_offsets_s", {}))
    return out


__all__ = ["arrivals", "job_extras"]
