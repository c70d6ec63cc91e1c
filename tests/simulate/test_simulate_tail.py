"""Tail at scale: the Monte-Carlo against the textbook numbers and the closed forms."""

from __future__ import annotations

import numpy as np
import pytest

from laggard.errors import LaggardError
from laggard.simulate.dists import harmonic, parse_dist
from laggard.simulate.engine import chunk_sizes, run_chunked
from laggard.simulate.tail import barrier_times, tail_at_scale

TEXTBOOK_EMAX = {1: 1.744, 4: 2.546, 16: 3.770, 64: 5.475, 256: 7.775, 1024: 10.765}


@pytest.fixture(scope="module")
def textbook_result():
    return tail_at_scale(parse_dist("textbook"), list(TEXTBOOK_EMAX), num_trials=200_000, seed=2024)


def test_textbook_emax_within_one_and_a_half_percent(textbook_result) -> None:
    assert [r.num_workers for r in textbook_result.rows] == list(TEXTBOOK_EMAX)
    for row in textbook_result.rows:
        expected = TEXTBOOK_EMAX[row.num_workers]
        assert abs(row.mean / expected - 1) < 0.015, (row.num_workers, row.mean, expected)
        # and the simulation agrees with the numerical integral to a few standard errors
        assert abs(row.mean - row.exact_mean) < 5 * row.stderr + 1e-3


def test_textbook_slowdown_and_p99(textbook_result) -> None:
    rows = {r.num_workers: r for r in textbook_result.rows}
    assert rows[1].slowdown == 1.0
    assert rows[1024].slowdown == pytest.approx(10.765 / 1.744, rel=0.02)
    slowdowns = [r.slowdown for r in textbook_result.rows]
    assert slowdowns == sorted(slowdowns)
    for r in textbook_result.rows:
        assert r.p99 > r.mean
    # p99 of one worker: 1 + exp(-0.7 + 0.9 * z_0.99), z_0.99 = 2.3263
    assert rows[1].p99 == pytest.approx(1 + np.exp(-0.7 + 0.9 * 2.3263), rel=0.035)  # ~4 standard errors


@pytest.mark.parametrize("rate", [1.0, 4.0])
def test_exponential_matches_harmonic_closed_form(rate: float) -> None:
    res = tail_at_scale(parse_dist(f"exponential:rate={rate}"), [1, 8, 64, 512], num_trials=50_000, seed=3)
    for r in res.rows:
        exact = harmonic(r.num_workers) / rate
        assert r.exact_mean == pytest.approx(exact)
        assert abs(r.mean - exact) < 4 * r.stderr, (r.num_workers, r.mean, exact)


def test_light_tail_grows_slowly() -> None:
    res = tail_at_scale(parse_dist("gaussian:mean=1,std=0.05"), [1, 1024], num_trials=20_000, seed=1)
    # E[max of 1024 normals] is about mean + 3.2 std
    assert res.rows[1].mean == pytest.approx(1 + 0.05 * 3.24, abs=0.01)
    assert res.rows[1].slowdown < 1.2


def test_constant_has_no_tail() -> None:
    res = tail_at_scale(parse_dist("constant:value=2"), [1, 100], num_trials=1000, seed=0)
    assert [r.mean for r in res.rows] == [2.0, 2.0]
    assert [r.p99 for r in res.rows] == [2.0, 2.0]


def test_same_seed_same_numbers_any_thread_count() -> None:
    d = parse_dist("textbook")
    a = barrier_times(d, 64, 30_000, seed=9, threads=1, chunk_elems=1 << 16)
    b = barrier_times(d, 64, 30_000, seed=9, threads=2, chunk_elems=1 << 16)
    c = barrier_times(d, 64, 30_000, seed=10, threads=2, chunk_elems=1 << 16)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_chunking_bounds_memory_and_covers_all_trials() -> None:
    sizes = chunk_sizes(200_000, 1024, chunk_elems=1 << 21)
    assert sum(sizes) == 200_000
    assert max(sizes) * 1024 <= 1 << 21
    assert chunk_sizes(10, 10**9) == [1] * 10  # one trial per chunk at least
    seen = []

    def kernel(rng, n):
        seen.append(n)
        return {"x": np.full(n, 1.0), "y": np.zeros((n, 3))}

    out = run_chunked(kernel, 1000, 100, 0, threads=2, chunk_elems=30_000)
    assert out["x"].shape == (1000,) and out["y"].shape == (1000, 3)
    assert sorted(seen) == sorted(chunk_sizes(1000, 100, 30_000))
    assert len(seen) == 4


def test_adding_a_size_does_not_change_the_others() -> None:
    d = parse_dist("textbook")
    a = tail_at_scale(d, [4, 16], num_trials=2000, seed=5)
    b = tail_at_scale(d, [16, 4, 64], num_trials=2000, seed=5)
    assert a.rows[1].mean == b.rows[0].mean
    assert a.rows[0].mean == b.rows[1].mean


def test_json_shape() -> None:
    res = tail_at_scale(parse_dist("exponential:rate=1"), [1, 2], num_trials=500, seed=0)
    js = res.to_json()
    assert set(js["rows"][0]) >= {"workers", "mean", "p99", "slowdown"}
    assert js["rows"][1]["workers"] == 2


@pytest.mark.parametrize(
    ("workers", "trials", "fragment"),
    [([], 1000, "at least one"), ([0], 1000, "1.."), ([4, -1], 1000, "1.."), ([2.5], 1000, "integers"),
     ([4], 10, "at least 100 trials")],
)
def test_bad_arguments(workers, trials, fragment) -> None:
    with pytest.raises(LaggardError, match=fragment):
        tail_at_scale(parse_dist("textbook"), workers, num_trials=trials)
