"""Order statistics per group without sorting the values: the k-th smallest of each group's values,
for the detectors' grouped medians (``spikes.group_median``, ``diagnose.context.peer_median``).

A sort by (group, value) costs O(n log n) and, on 64-bit floats, four radix passes
(``sorting.stable_order``); a median needs two of each group's order statistics. The groups' rows
are gathered by one sort of their group ids (narrow integers: numpy radix-sorts them), groups of the
same size stacked into a matrix, and ``np.partition`` selects the wanted positions of every row at
once (introselect: linear time). The groups of a trace window come in few sizes (every rank runs
the same ops per step), so this is a handful of partitions; where the sizes are many (a loop over
each would cost more than the sort) ``group_kth`` answers None and callers sort.

The values selected are the sorted order's, NaN last as numpy sorts them, so a median from them is
the sorted one to the bit."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# above this many distinct group sizes a partition per size costs more than one sort of the values
# (a partition's fixed cost is ~10-20 us: 64 sizes ~1 ms, against ~10 ms to sort 200,000 durations)
MAX_SIZES = 64


def group_rows(groups: np.ndarray) -> np.ndarray:
    """The rows in group order (a stable sort of the group ids, narrowed to 16 or 32 bits where their
    range allows: numpy radix-sorts 16-bit keys)."""
    g = groups
    if len(g) and g.dtype.kind in "iu":
        lo, hi = int(g.min()), int(g.max())
        if hi - lo < 2**16:
            g = (g - lo).astype(np.uint16)
        elif hi - lo < 2**31:
            g = (g - lo).astype(np.int32)
    return np.argsort(g, kind="stable")


def group_kth(values: np.ndarray, groups: np.ndarray, num_groups: int,
              kth: Callable[[int], list[int]], rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """For each group id (0..num_groups-1), its values' order statistics at the positions ``kth(size)``
    (0-based in the group's sorted values, each in ``[0, size)``; the same number for every size):
    (a num_groups x len(kth) array, 0 for empty groups; each group's size). None where the groups
    come in over ``MAX_SIZES`` sizes. ``rows``: ``group_rows(groups)`` where the caller has it (two
    statistics of the same groups: the sort once)."""
    sizes = np.bincount(groups, minlength=num_groups)
    distinct = np.unique(sizes[sizes > 0])
    if len(distinct) > MAX_SIZES:
        return None
    out = np.zeros((num_groups, len(kth(int(distinct[0]) if len(distinct) else 1))))
    if not len(distinct):
        return out, sizes
    v = values[group_rows(groups) if rows is None else rows]
    starts = np.cumsum(sizes) - sizes
    for size in distinct.tolist():
        gs = np.flatnonzero(sizes == size)
        ks = kth(size)
        block = v[starts[gs][:, None] + np.arange(size)]
        block.partition(sorted(set(ks)), axis=1)
        out[gs] = block[:, ks]
    return out, sizes


def nan_median(values: np.ndarray, axis: int) -> np.ndarray:
    """``np.nanmedian(values, axis=axis)`` to the bit (NaN where a row has no value, without its
    warning), from one ``np.median`` where nothing is NaN and else one sort along the axis (NaN last)
    and each row's middle order statistics. numpy's nanmedian goes through a masked array for short
    rows (a row at a time in Python for long ones): 1,024 workers x 3-8 steps 0.6-1.0 ms against
    0.1-0.3 ms here; a 1,024-worker window's diagnosis 3.8 -> 1.3 ms."""
    a = np.asarray(values)
    nan = np.isnan(a)
    if not nan.any():
        return np.median(a, axis=axis)
    s = np.sort(a, axis=axis)
    count = np.expand_dims(a.shape[axis] - nan.sum(axis=axis), axis)
    lo = np.take_along_axis(s, np.maximum(count - 1, 0) // 2, axis=axis)
    hi = np.take_along_axis(s, count // 2, axis=axis)  # (a row of no value: its first, replaced by NaN below)
    with np.errstate(invalid="ignore", over="ignore"):
        mid = np.where(count % 2 == 1, lo, (lo + hi) / 2)  # as np.median: the mean of the two middle ones
    return np.squeeze(np.where(count > 0, mid, np.nan), axis=axis)


__all__ = ["MAX_SIZES", "group_kth", "group_rows", "nan_median"]
