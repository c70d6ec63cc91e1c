"""The grouped statistics shared by the what-ifs and the detectors (``laggard.engine.spikes``)."""

import numpy as np

from laggard.engine.sorting import stable_order
from laggard.engine.spikes import group_mean, group_median, sort_by_group


def test_sort_by_group_is_lexsort():
    rng = np.random.default_rng(3)
    for n, num_groups, lo in [(0, 1, 0), (1, 1, 0), (1000, 7, 0), (5000, 70_000, -5), (3000, 2**40, 2**33)]:
        v = rng.integers(0, 20, n).astype(float)  # many ties: the order of equal values counts
        v[rng.random(n) < 0.05] = np.nan
        g = rng.integers(lo, lo + num_groups, n) if n else np.zeros(0, dtype=np.int64)
        assert np.array_equal(sort_by_group(v, g), np.lexsort((v, g)))


def test_stable_order_is_numpys_stable_argsort():
    """The radix passes give numpy's stable permutation: ties in position order, -0.0 equal to 0.0,
    infinities in place, every NaN last; durations (non-negative), signed floats, 64-bit integers
    over their whole range, narrow ranges whose high digits never change, other dtypes as they are."""
    rng = np.random.default_rng(5)
    n = 20_000
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 5e-324, -5e-324] * 50)
    cases = [rng.lognormal(-7, 1, n), np.round(rng.normal(0, 1, n), 1), np.concatenate([rng.normal(0, 1, n), special]),
             np.concatenate([rng.lognormal(0, 1, n), [0.0, -0.0, np.inf] * 40]),
             rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64), rng.integers(0, 300, n).astype(np.int64),
             rng.integers(0, 300, n).astype(np.int32), np.full(n, 2.5), np.arange(10.0)[::-1]]
    for v in cases:
        assert np.array_equal(stable_order(v), np.argsort(v, kind="stable")), v.dtype


def test_group_median_and_mean():
    v = np.array([5.0, 1.0, 3.0, 2.0, 4.0, 10.0])
    g = np.array([0, 0, 0, 2, 2, 2])
    assert np.array_equal(group_median(v, g, 4), [3.0, 0.0, 4.0, 0.0])
    mean, ok = group_mean(v, np.array([True, True, False, True, True, True]), [g])
    assert np.allclose(mean, [3.0, 3.0, 3.0, 16 / 3, 16 / 3, 16 / 3]) and ok.all()
