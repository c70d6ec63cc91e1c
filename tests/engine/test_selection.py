"""Grouped order statistics by selection (``laggard.engine.selection``) against a sort of each group
done here: the detectors' medians (``group_median``, ``peer_median``) must be the sorted ones to the
bit, by selection and where they fall back to sorting (too many group sizes)."""

import warnings

import numpy as np
import pytest

from laggard.diagnose.context import peer_median
from laggard.engine import selection
from laggard.engine.spikes import group_median


def _values(rng: np.random.Generator, n: int, kind: int) -> np.ndarray:
    if kind == 0:
        return rng.lognormal(-7, 1, n)
    if kind == 1:
        return rng.integers(0, 4, n).astype(float)  # ties
    if kind == 2:
        return rng.choice([0.0, -0.0, 1.0, 2.5, np.inf, -np.inf], n)
    v = rng.random(n)
    v[rng.random(n) < 0.2] = np.nan
    return v


def _sorted_median(v: np.ndarray) -> float:
    s = np.sort(v)  # NaN last, as numpy sorts
    return 0.5 * (s[(len(s) - 1) // 2] + s[len(s) // 2]) if len(s) else 0.0


@pytest.fixture(params=["selection", "sort"])
def path(request, monkeypatch) -> str:
    if request.param == "sort":  # every group size too many: the callers' sort
        monkeypatch.setattr(selection, "MAX_SIZES", 0)
    return request.param


def test_group_median_is_the_sorted_median(path: str) -> None:
    rng = np.random.default_rng(7)
    for trial in range(400):
        n, num_groups = int(rng.integers(1, 200)), int(rng.integers(1, 30))
        v, g = _values(rng, n, trial % 4), rng.integers(0, num_groups, n)
        got = group_median(v, g, num_groups)
        want = [_sorted_median(v[g == k]) for k in range(num_groups)]
        assert np.array_equal(got, want, equal_nan=True), (trial, v, g)
        # the groups' rows handed in (two statistics of the same groups: spikes' median and MAD)
        assert np.array_equal(group_median(v, g, num_groups, selection.group_rows(g)), want, equal_nan=True)


def test_group_median_of_equal_sized_groups_and_of_none() -> None:
    """The window's case (every rank the same ops: one size, one partition) and empty input."""
    rng = np.random.default_rng(8)
    v = rng.lognormal(0, 1, 64 * 96)
    g = np.repeat(np.arange(64), 96)[rng.permutation(64 * 96)]
    assert np.array_equal(group_median(v, g, 66), [_sorted_median(v[g == k]) for k in range(66)])
    assert np.array_equal(group_median(np.zeros(0), np.zeros(0, np.int64), 3), [0.0, 0.0, 0.0])


def test_peer_median_is_the_median_of_the_others(path: str) -> None:
    rng = np.random.default_rng(9)
    for trial in range(300):
        n = int(rng.integers(1, 60))
        v = _values(rng, n, trial % 3)  # (no NaN: np.median of others is NaN where the sorted pick is not)
        g = rng.integers(0, int(rng.integers(1, 8)), n) * int(rng.choice([1, 3]))  # ids with gaps too
        got = peer_median(v, g)
        want = [_sorted_median(v[(g == g[i]) & (np.arange(n) != i)]) for i in range(n)]  # (0 when alone)
        assert np.array_equal(got, want, equal_nan=True), (trial, v, g)  # (inf + -inf: NaN both ways)


def test_peer_median_with_nan_or_wide_ids_sorts() -> None:
    """NaN values and group ids no table holds take the sort; the answers are the sorted ones."""
    v = np.array([1.0, np.nan, 3.0, 2.0, 5.0, 4.0])
    for g in (np.array([0, 0, 0, 1, 1, 1]), np.array([0, 0, 0, 2**40, 2**40, 2**40])):
        got = peer_median(v, g)
        # [1, nan, 3]: the others of 1 sort as [3, nan], their mean of the middle two is NaN
        assert np.array_equal(got, [np.nan, 2.0, np.nan, 4.5, 3.0, 3.5], equal_nan=True), got


@pytest.mark.parametrize("axis", [0, 1])
def test_nan_median_is_numpys_nanmedian_to_the_bit(axis: int) -> None:
    # numpy's own nanmedian is the reference: rows with NaN, all-NaN rows, infinities, ties
    rng = np.random.default_rng(7)
    for trial in range(400):
        shape = (int(rng.integers(1, 30)), int(rng.integers(1, 10)))
        a = rng.lognormal(-7, 1, shape) if trial % 3 else np.round(rng.random(shape), 1)
        for share, v in ((0.2, np.nan), (0.03, np.inf), (0.03, -np.inf)):
            if rng.random() < 0.6:
                a[rng.random(shape) < share] = v
        if trial % 10 == 0:
            a[int(rng.integers(0, shape[0]))] = np.nan
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = np.nanmedian(a, axis=axis)
            got = selection.nan_median(a, axis)
        assert got.shape == want.shape and np.array_equal(got, want, equal_nan=True), (a, want, got)
