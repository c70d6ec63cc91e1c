"""Rare long ops: an op far above the median of its (rank, op type).

Shared by the GC detector (``laggard.diagnose.gc``: stalled forward passes) and the ``--despike``
what-if (``laggard.whatif_custom``), so that the diagnosis's GC fix is a what-if a user can run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(kw_only=True, slots=True)
class SpikeConfig:
    mad: float = 8.0  # a spike is above median + 8 MADs (far outside a 3% jitter)
    rel: float = 0.3  # ...and at least 30% over its median (a tight op type has a tiny MAD)


def group_median(values: np.ndarray, groups: np.ndarray, num_groups: int) -> np.ndarray:
    """Median of ``values`` per group id (0..num_groups-1), vectorised; 0 for empty groups."""
    order = np.lexsort((values, groups))
    g = groups[order]
    starts = np.searchsorted(g, np.arange(num_groups))
    ends = np.searchsorted(g, np.arange(num_groups), side="right")
    lens = ends - starts
    nonempty = lens > 0
    lo = order[np.where(nonempty, starts + (lens - 1) // 2, 0)]
    hi = order[np.where(nonempty, starts + lens // 2, 0)]
    return np.where(nonempty, 0.5 * (values[lo] + values[hi]), 0.0)


def spikes(w: np.ndarray, key: np.ndarray, mask: np.ndarray, cfg: SpikeConfig | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Ops in ``mask`` far above the median of their ``key`` (e.g. rank x op type);
    returns (spike mask, each op's median)."""
    cfg = cfg or SpikeConfig()
    rows = np.flatnonzero(mask)
    med = np.zeros(len(w))
    out = np.zeros(len(w), dtype=bool)
    if len(rows) == 0:
        return out, med
    order = rows[np.lexsort((w[rows], key[rows]))]
    k = key[order]
    bounds = np.flatnonzero(np.diff(k)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.append(bounds, len(order))
    lens = ends - starts
    mid_lo = order[starts + (lens - 1) // 2]
    mid_hi = order[starts + lens // 2]
    m = 0.5 * (w[mid_lo] + w[mid_hi])
    seg = np.repeat(np.arange(len(starts)), lens)
    med[order] = m[seg]
    dev = np.abs(w[order] - med[order])
    mad = group_median(dev, seg, len(starts))
    thresh = med[order] + np.maximum(cfg.mad * 1.4826 * mad[seg], cfg.rel * med[order])
    out[order] = w[order] > thresh
    return out, med
