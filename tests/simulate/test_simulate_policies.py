"""Synchronisation policies: the textbook backup number, light tails, the SSP sweep, and each
kernel against an independent (slow, obvious) implementation or an exact result."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from laggard.errors import LaggardError
from laggard.simulate import kernels, theory
from laggard.simulate.dists import parse_dist
from laggard.simulate.policies import Policy, compare_policies, parse_policy, verdict

TEXTBOOK = parse_dist("textbook")
LIGHT = parse_dist("gaussian:mean=1,std=0.05")


def test_backups_cut_the_textbook_barrier_at_256_by_57_6_percent() -> None:
    res = compare_policies(TEXTBOOK, 256, ["bsp", "backup:1"], num_trials=200_000, seed=11)
    bsp, backup = res.row("bsp"), res.row("backup:1")
    assert bsp.mean == pytest.approx(7.775, rel=0.015)
    assert abs(backup.barrier_cut - 0.576) < 0.015, backup.barrier_cut
    assert backup.compute_multiplier == pytest.approx(2.0)
    assert bsp.compute_multiplier == 1.0
    # the numerical integral agrees
    exact_cut = 1 - theory.expected_max(TEXTBOOK, 256, copies=2) / theory.expected_max(TEXTBOOK, 256)
    assert exact_cut == pytest.approx(0.576, abs=0.002)
    assert "cuts the barrier by 58%" in backup.verdict and "2x compute" in backup.verdict


def test_light_tail_backups_barely_help_and_the_table_says_so() -> None:
    res = compare_policies(LIGHT, 256, ["bsp", "backup:1", "speculate"], num_trials=20_000, seed=2)
    heavy = compare_policies(TEXTBOOK, 256, ["bsp", "backup:1"], num_trials=20_000, seed=2)
    light_cut = res.row("backup:1").barrier_cut
    assert 0 < light_cut < 0.10  # about 5% for twice the compute
    assert heavy.row("backup:1").barrier_cut > 5 * light_cut
    assert res.row("backup:1").verdict.startswith("barely helps")
    assert "2x compute" in res.row("backup:1").verdict
    # speculation never fires: nothing runs past 1.5x the median
    spec = res.row("speculate:1.5,0.75")
    assert spec.extra["copies_per_step"] == 0
    assert spec.verdict == "no real gain"
    assert spec.mean == res.row("bsp").mean  # common random numbers: exactly the BSP draws


def test_ssp_sweep_falls_from_bsp_to_async() -> None:
    stal = [0, 1, 2, 4, 8, 16, 64]
    res = compare_policies(TEXTBOOK, 64, ["bsp", *[f"ssp:{s}" for s in stal], "async"], num_trials=6_000,
                           num_steps=60, seed=4)
    means = [res.row(f"ssp:{s}").mean for s in stal]
    # the same draws for every s: wall-clock can only fall as the bound loosens
    assert all(a >= b for a, b in zip(means, means[1:], strict=False))
    assert means[0] > 2 * means[-1]
    # s = 0 is BSP (different draws: statistical agreement), s >= steps is async (identical)
    bsp = res.row("bsp")
    assert means[0] == pytest.approx(bsp.mean, abs=4 * (bsp.stderr + res.row("ssp:0").stderr))
    assert res.row("ssp:64").mean == res.row("async").mean
    assert res.row("async").idle_fraction == 0.0
    assert res.row("ssp:0").idle_fraction == pytest.approx(bsp.idle_fraction, abs=0.01)
    idles = [res.row(f"ssp:{s}").idle_fraction for s in stal]
    assert all(a >= b for a, b in zip(idles, idles[1:], strict=False))
    # async over a long run tends to the mean worker time (plus the spread of the walks)
    assert TEXTBOOK.mean() < res.row("async").mean < 1.4 * TEXTBOOK.mean()
    assert res.row("async").staleness is None and res.row("ssp:4").staleness == 4


def test_ssp_progress_matches_a_plain_loop() -> None:
    rng = np.random.default_rng(0)
    t = rng.exponential(1.0, (3, 12, 5))
    for s in (0, 1, 3, None):
        done_all, wait = kernels.ssp_progress(t, s)
        for run in range(3):
            finish = np.zeros((12, 5))
            waited = 0.0
            for i in range(12):
                for w in range(5):
                    ready = finish[i - 1, w] if i else 0.0
                    start = ready
                    if s is not None and i - 1 - s >= 0:
                        start = max(ready, finish[i - 1 - s].max())
                    waited += start - ready
                    finish[i, w] = start + t[run, i, w]
            assert np.allclose(done_all[run], finish.max(axis=1))
            assert wait[run] == pytest.approx(waited)
    # BSP: each step adds the slowest worker's time
    done_all, _ = kernels.ssp_progress(t, 0)
    assert np.allclose(done_all[:, -1], t.max(axis=2).sum(axis=1))


def _greedy_by_heap(dur: np.ndarray, total: int) -> np.ndarray:
    """Reference list scheduler: the worker free first takes the next piece of its own stream."""
    length, k = dur.shape
    free = [(0.0, w) for w in range(k)]
    heapq.heapify(free)
    used = [0] * k
    finish = np.zeros(k)
    for _ in range(total):
        t, w = heapq.heappop(free)
        end = t + dur[used[w], w]
        used[w] += 1
        finish[w] = end
        heapq.heappush(free, (end, w))
    return finish


def test_overdecomposition_matches_a_heap_list_scheduler() -> None:
    rng = np.random.default_rng(1)
    for k, pieces in ((1, 3), (4, 1), (7, 4), (16, 8)):
        dur = rng.lognormal(-0.7, 0.9, (20, 3 * pieces + 8, k)) + 1
        got = kernels.greedy_finish(dur, k * pieces)
        assert got is not None
        for run in range(20):
            assert np.allclose(got[run], _greedy_by_heap(dur[run], k * pieces))
    # a stream that is too short is reported, not silently truncated
    assert kernels.greedy_finish(np.ones((1, 2, 1)), 3) is None


def test_overdecomposition_balances_load() -> None:
    res = compare_policies(TEXTBOOK, 128, ["bsp", "overdecomp:1", "overdecomp:4", "overdecomp:16"],
                           num_trials=3_000, seed=3)
    bsp = res.row("bsp")
    one = res.row("overdecomp:1")
    assert one.mean == pytest.approx(bsp.mean, abs=4 * (bsp.stderr + one.stderr))
    assert res.row("overdecomp:16").mean < res.row("overdecomp:4").mean < one.mean
    assert res.row("overdecomp:16").idle_fraction < bsp.idle_fraction
    # a constant worker time: p pieces of c/p on every worker, the step is exactly c
    const = compare_policies(parse_dist("constant:value=2"), 8, ["overdecomp:4"], num_trials=200)
    assert const.row("overdecomp:4").mean == pytest.approx(2.0)
    assert const.row("overdecomp:4").idle_fraction == pytest.approx(0.0, abs=1e-12)


def test_drop_matches_the_order_statistic() -> None:
    res = compare_policies(TEXTBOOK, 256, ["drop:2"], num_trials=40_000, seed=6)
    row = res.row("drop:2")
    exact = theory.expected_order_stat(TEXTBOOK, 256, 2)
    assert abs(row.mean - exact) < 4 * row.stderr
    assert row.gradient_lost == pytest.approx(2 / 256)
    assert row.compute_multiplier > 1.0  # the two dropped workers' partial work is wasted
    assert "of the gradient lost" in row.verdict
    exp = compare_policies(parse_dist("exponential:rate=1"), 16, ["drop:3"], num_trials=40_000, seed=6)
    exact_exp = sum(1.0 / j for j in range(4, 17))
    assert abs(exp.row("drop:3").mean - exact_exp) < 4 * exp.row("drop:3").stderr


def test_backup_matches_the_integral_and_counts_its_cost() -> None:
    d = parse_dist("exponential:rate=1")
    res = compare_policies(d, 32, ["backup:2"], num_trials=40_000, seed=8)
    row = res.row("backup:2")
    # the min of 3 Exp(1) is Exp(3)
    assert abs(row.mean - theory.expected_max_exponential(32, 3.0)) < 4 * row.stderr
    assert row.compute_multiplier == pytest.approx(3.0)


def test_speculation_on_a_hand_made_step() -> None:
    class Fixed:
        """Worker times 1,1,1,10 and copies that take 1."""

        def sample_jobs(self, rng, n, k):
            return np.tile([1.0, 1.0, 1.0, 10.0], (n, 1))

        def sample(self, rng, shape):
            return np.ones(shape)

    out = kernels.speculate(Fixed(), np.random.default_rng(0), 2, 4, multiplier=1.5, quantile=0.75)
    # 3 of 4 done at t=1, median 1, threshold 1.5: the copy starts at 1.5 and ends at 2.5
    assert np.allclose(out["step"], 2.5)
    assert np.allclose(out["num_copies"], 1)
    assert np.allclose(out["useful"], 1 + 1 + 1 + 2.5)
    assert np.allclose(out["busy"], 5.5 + 1.0)


def test_textbook_policy_table_orders_as_expected() -> None:
    res = compare_policies(TEXTBOOK, 256, num_trials=4_000, seed=1)
    labels = [r.policy for r in res.rows]
    assert labels == ["bsp", "backup:1", "speculate:1.5,0.75", "drop:1", "overdecomp:4", "ssp:3", "async"]
    for r in res.rows[1:]:
        assert r.barrier_cut > 0.1, r
        assert r.mean < res.rows[0].mean
        assert 0.0 <= r.idle_fraction < 1.0
    assert 1.0 < res.row("speculate:1.5,0.75").compute_multiplier < 1.5
    js = res.to_json()
    assert set(js["rows"][0]) >= {"policy", "mean", "p99", "idle_fraction", "compute_multiplier"}


def test_bsp_is_added_and_duplicates_removed() -> None:
    res = compare_policies(LIGHT, 8, ["backup:1", "backup", "backup:copies=1"], num_trials=200)
    assert [r.policy for r in res.rows] == ["bsp", "backup:1"]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("bsp", Policy(kind="bsp")),
        ("BSP", Policy(kind="bsp")),
        ("backup", Policy(kind="backup", copies=1)),
        ("backup:2", Policy(kind="backup", copies=2)),
        ("backups:copies=3", Policy(kind="backup", copies=3)),
        ("speculate", Policy(kind="speculate", multiplier=1.5, quantile=0.75)),
        ("speculate:2,0.9", Policy(kind="speculate", multiplier=2.0, quantile=0.9)),
        ("speculation:quantile=0.5", Policy(kind="speculate", multiplier=1.5, quantile=0.5)),
        ("drop:2", Policy(kind="drop", num_drop=2)),
        ("overdecomp:8", Policy(kind="overdecomp", pieces=8)),
        ("ssp:0", Policy(kind="ssp", staleness=0)),
        ("ssp:3", Policy(kind="ssp", staleness=3)),
        ("async", Policy(kind="async")),
    ],
)
def test_parse_policy(spec: str, expected: Policy) -> None:
    p = parse_policy(spec)
    assert p == expected
    assert parse_policy(p.label()) == p


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("", "empty"),
        ("gossip", "unknown policy 'gossip'"),
        ("backup:x", "copies must be a number"),
        ("backup:0", "copies must be an integer in 1..16"),
        ("backup:1.5", "whole number"),
        ("backup:1,2", "at most 1 parameter"),
        ("bsp:1", "at most 0 parameter"),
        ("ssp:-1", "staleness must be"),
        ("speculate:0.5", "multiplier must be a number >= 1"),
        ("speculate:quantile=1.5", "quantile must be in (0, 1]"),
        ("speculate:foo=1", "unknown parameter 'foo'"),
        ("drop:m=1,m=2", "at most 1"),
        ("overdecomp:0", "pieces must be"),
    ],
)
def test_bad_policies(spec: str, fragment: str) -> None:
    with pytest.raises(LaggardError) as info:
        parse_policy(spec)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_bad_comparisons() -> None:
    with pytest.raises(LaggardError, match="cannot drop 8 of 8 workers"):
        compare_policies(LIGHT, 8, ["drop:8"], num_trials=200)
    with pytest.raises(LaggardError, match="--workers"):
        compare_policies(LIGHT, 0, ["bsp"], num_trials=200)
    with pytest.raises(LaggardError, match="--steps"):
        compare_policies(LIGHT, 4, ["ssp:1"], num_trials=200, num_steps=1)
    with pytest.raises(LaggardError, match="at least one policy"):
        compare_policies(LIGHT, 4, [], num_trials=200)


def test_verdict_wording() -> None:
    from laggard.simulate.policies import PolicyRow

    def row(cut, mult=1.0, lost=0.0, stale=0):
        return PolicyRow(policy="x", mean=1, p99=1, idle_fraction=0, compute_multiplier=mult,
                         gradient_lost=lost, staleness=stale, barrier_cut=cut)

    assert verdict(row(0.0), "bsp") == "baseline"
    assert verdict(row(0.5, mult=2.0), "backup") == "cuts the barrier by 50% (2x compute)"
    assert verdict(row(0.05, mult=2.0), "backup").startswith("barely helps")
    assert verdict(row(0.001), "overdecomp") == "no real gain"
    assert verdict(row(-0.2), "overdecomp").startswith("hurts")
    assert "unbounded staleness" in verdict(row(0.7, stale=None), "async")
