"""Rare long ops: an op far above what it should take: the median of its (rank, op type); for a
forward pass whose backward is in the trace, that backward's time times the rank's median
forward/backward ratio (``fwd_bwd_partner``). A long sequence makes both passes of its microbatch
long (attention cost), a GC pause or a host stall only the forward: judged against its own
backward, a forward is a spike only for the second, so sequence imbalance, a slow worker or a heavy
stage (which move both passes alike) neither hide stalls nor pass for them.

Shared by the GC detector (``laggard.diagnose.gc``: stalled forward passes) and the ``--despike``
and ``--even`` what-ifs (``laggard.whatif.custom``), so that the diagnosis's GC fix is a what-if a
user can run. So are the grouped statistics (``group_median``, ``group_mean``) the what-ifs and the
detectors both use.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from laggard.engine.selection import group_kth, group_rows
from laggard.engine.sorting import stable_order
from laggard.optable.ops import fits_table, unique_inverse


@dataclass(kw_only=True, slots=True)
class SpikeConfig:
    mad: float = 8.0  # a spike is above median + 8 MADs (far outside a 3% jitter)
    rel: float = 0.3  # ...and at least 30% over its median (a tight op type has a tiny MAD)


def sort_by_group(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``np.lexsort((values, groups))`` (by group, then value, then position), the same permutation
    2-3x faster on millions of ops: a stable sort of the values (``stable_order``), then a stable sort
    of their groups, whose keys are narrowed to 16 bits where their range allows (numpy radix-sorts
    those: ``selection.group_rows``)."""
    order = stable_order(values)
    return order[group_rows(groups[order])]


def group_median(values: np.ndarray, groups: np.ndarray, num_groups: int, rows: np.ndarray | None = None) -> np.ndarray:
    """Median of ``values`` per group id (0..num_groups-1), vectorised; 0 for empty groups. The two
    middle values of each group by selection (``selection.group_kth``; ``rows``: the groups' rows
    in group order, ``selection.group_rows``, where the caller has them), or from one sort by (group,
    value) where the groups come in too many sizes; the same values either way."""
    picked = group_kth(values, groups, num_groups, lambda n: [(n - 1) // 2, n // 2], rows)
    if picked is not None:
        mid, sizes = picked
        return np.where(sizes > 0, 0.5 * (mid[:, 0] + mid[:, 1]), 0.0)
    order = sort_by_group(values, groups)
    g = groups[order]
    starts = np.searchsorted(g, np.arange(num_groups))
    ends = np.searchsorted(g, np.arange(num_groups), side="right")
    lens = ends - starts
    nonempty = lens > 0
    lo = order[np.where(nonempty, starts + (lens - 1) // 2, 0)]
    hi = order[np.where(nonempty, starts + lens // 2, 0)]
    return np.where(nonempty, 0.5 * (values[lo] + values[hi]), 0.0)


def group_mean(w: np.ndarray, mask_ref: np.ndarray, keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Mean of ``w`` over ``mask_ref`` per key tuple, for every op; and whether its key has any. The
    keys are packed into one integer, which indexes the sums directly where its range fits a table
    (``fits_table``: op types x stages x steps), else through its distinct values (``unique_inverse``)."""
    key = np.zeros(len(w), dtype=np.int64)
    for k in keys:
        k = k.astype(np.int64)
        key = key * (int(k.max()) + 2) + (k + 1)
    num = int(key.max()) + 1 if len(key) else 0
    if not fits_table(num, len(key)):
        uniq, key = unique_inverse(key)
        num = len(uniq)
    sums = np.bincount(key, weights=np.where(mask_ref, w, 0.0), minlength=num)
    # counted as weights, not as np.bincount(key[mask_ref]): compressing by a scattered mask costs 3x this
    cnt = np.bincount(key, weights=mask_ref.astype(np.float64), minlength=num)
    return (sums / np.maximum(cnt, 1)).take(key), (cnt > 0).take(key)


def fwd_bwd_partner(names: list[str], name_code: np.ndarray, compute: np.ndarray, rank: np.ndarray,
                    step: np.ndarray, microbatch: np.ndarray) -> np.ndarray:
    """For each forward pass (a compute op named ``*forward*`` with a microbatch), the row of the
    backward pass of the same (rank, step, microbatch); -1 for every other op, and where the key
    is not unique (interleaved chunks share microbatch numbers)."""
    low = np.array(["forward" in n.lower() for n in names] + [False], dtype=bool)
    bwd_names = np.array(["backward" in n.lower() for n in names] + [False], dtype=bool)
    has_mb = microbatch >= 0
    fwd = low[name_code] & compute & has_mb
    bwd = bwd_names[name_code] & compute & has_mb
    out = np.full(len(name_code), -1, dtype=np.int64)
    if not fwd.any() or not bwd.any():
        return out
    nm = int(microbatch.max()) + 2
    ns = int(step.max()) + 1
    key = (rank.astype(np.int64) * ns + step) * nm + microbatch + 1
    fk, bk = key[fwd], key[bwd]
    num_keys = int(key.max()) + 1
    if fits_table(num_keys, len(key)):  # a table per key, no sort
        f_count, b_count = np.bincount(fk, minlength=num_keys), np.bincount(bk, minlength=num_keys)
        b_row = np.zeros(num_keys, dtype=np.int64)
        b_row[bk] = np.flatnonzero(bwd)
        frows = np.flatnonzero(fwd)
        ok = (f_count[fk] == 1) & (b_count[fk] == 1)
        out[frows[ok]] = b_row[fk[ok]]
        return out
    uf, cf = np.unique(fk, return_counts=True)
    ub, cb = np.unique(bk, return_counts=True)
    once = np.intersect1d(uf[cf == 1], ub[cb == 1])
    frows, brows = np.flatnonzero(fwd), np.flatnonzero(bwd)
    fsel, bsel = np.isin(fk, once), np.isin(bk, once)
    f_sorted = frows[fsel][np.argsort(fk[fsel], kind="stable")]
    b_sorted = brows[bsel][np.argsort(bk[bsel], kind="stable")]
    out[f_sorted] = b_sorted
    return out


def spikes(w: np.ndarray, key: np.ndarray, mask: np.ndarray, cfg: SpikeConfig | None = None,
           partner: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Ops in ``mask`` far above what they should take: the median of their ``key`` (e.g. rank x op
    type); with ``partner`` (``fwd_bwd_partner``), an op that has one is judged by its time over its
    partner's against the median of that ratio in its key. Returns (spike mask, each op's expected
    time: the median, or the partner's time times the median ratio)."""
    cfg = cfg or SpikeConfig()
    if partner is not None and (partner[mask] >= 0).any():
        paired = mask & (partner >= 0)
        pw = w[np.maximum(partner, 0)]
        paired &= pw > 0
        ratio = np.where(paired, w / np.where(pw > 0, pw, 1.0), 0.0)
        hit_p, med_p = _spikes(ratio, key, paired, cfg)
        hit_o, med_o = _spikes(w, key, mask & ~paired, cfg)
        return hit_p | hit_o, np.where(paired, med_p * pw, med_o)
    return _spikes(w, key, mask, cfg)


def _spikes(w: np.ndarray, key: np.ndarray, mask: np.ndarray, cfg: SpikeConfig) -> tuple[np.ndarray, np.ndarray]:
    rows = np.flatnonzero(mask)
    med = np.zeros(len(w))
    out = np.zeros(len(w), dtype=bool)
    if len(rows) == 0:
        return out, med
    _, gid = unique_inverse(key[rows])
    num = int(gid.max()) + 1
    wr = w[rows]
    by_group = group_rows(gid)  # the median and the MAD group the same rows
    m = group_median(wr, gid, num, by_group)[gid]
    mad = group_median(np.abs(wr - m), gid, num, by_group)[gid]
    med[rows] = m
    out[rows] = wr > m + np.maximum(cfg.mad * 1.4826 * mad, cfg.rel * m)
    return out, med
