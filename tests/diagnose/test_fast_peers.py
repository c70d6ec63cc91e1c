"""The fast-peer references (``diagnose.context``) computed from one sort equal their per-entry
definitions bit for bit: ties, inf and NaN values, zeros, groups of one, columns with NaN cells."""

from __future__ import annotations

import numpy as np
import pytest

from laggard.diagnose.context import fast_peer_ref, fast_peer_row_median, fast_peers
from laggard.diagnose.noise import row_median


def _peers(values: np.ndarray, groups: np.ndarray, within: float) -> list[np.ndarray]:
    out = [np.zeros(0, dtype=np.int64)] * len(values)
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        for j, i in enumerate(idx):
            if len(idx) > 1:
                others, ov = np.delete(idx, j), np.delete(values[idx], j)
                out[i] = others[ov <= within * ov.min()]
    return out


def _values(rng: np.random.Generator, n: int, case: int) -> np.ndarray:
    v = rng.lognormal(0.0, 0.3, n) if case % 2 else rng.integers(0, 4, n).astype(float)  # ties, zeros
    if case % 3 == 0:
        v[rng.random(n) < 0.2] = np.inf
    if case % 5 == 0:
        v[rng.random(n) < 0.2] = np.nan
    return v


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all((a.view(np.int64) == b.view(np.int64)) | (np.isnan(a) & np.isnan(b))))


@pytest.mark.parametrize("within", [1.0, 1.25, 3.0])
def test_fast_peers_and_ref_match_their_definition(within: float) -> None:
    rng = np.random.default_rng(7)
    for case in range(300):
        n = int(rng.integers(1, 40))
        v, g = _values(rng, n, case), rng.integers(0, 4, n)
        want = _peers(v, g, within)
        got = fast_peers(v, g, within)
        assert all(np.array_equal(x, y) for x, y in zip(got, want, strict=True))
        ref = np.array([float(np.median(v[p])) if len(p) else 0.0 for p in want])
        assert _same(fast_peer_ref(v, g, within), ref)


def test_fast_peer_row_median_matches_row_median_per_entry() -> None:
    rng = np.random.default_rng(8)
    for case in range(300):
        n = int(rng.integers(1, 40)) if case % 60 else 650  # np.nanmedian changes method at 600 rows
        v, g = _values(rng, n, case), rng.integers(0, 3, n)
        m = rng.lognormal(0.0, 0.2, (n, int(rng.integers(1, 7))))
        if case % 2:
            m[rng.random(m.shape) < (0.1, 0.5, 0.9)[case % 3]] = np.nan
        peers = _peers(v, g, 1.25)
        want = np.full(m.shape, np.nan)
        for i, p in enumerate(peers):
            if len(p):
                want[i] = row_median(m[p])
        got, num = fast_peer_row_median(v, m, g, 1.25)
        assert _same(got, want)
        assert num.tolist() == [len(p) for p in peers]
