"""Cost-aware pipeline partitioning: exact against brute force, layout strings, layer costs."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from laggard.errors import LaggardError
from laggard.mitigate import megatron_layout, partition_stages, split_stages
from laggard.mitigate.partition import even_counts, layer_costs_from_stages, stage_costs

pytestmark = pytest.mark.timeout(120)


def _brute(costs, p):
    n = len(costs)
    best = math.inf
    for cuts in itertools.combinations(range(1, n), p - 1):
        b = [0, *cuts, n]
        best = min(best, max(sum(costs[b[i] : b[i + 1]]) for i in range(p)))
    return best


def test_optimal_against_brute_force_integers():
    rng = np.random.default_rng(0)
    for _ in range(400):
        n = int(rng.integers(1, 12))
        p = int(rng.integers(1, n + 1))
        costs = rng.integers(0, 30, n).tolist()
        counts = partition_stages(costs, p)
        assert len(counts) == p and min(counts) >= 1 and sum(counts) == n
        assert stage_costs(costs, counts).max() == _brute(costs, p), (costs, p, counts)


def test_optimal_against_brute_force_floats():
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(2, 11))
        p = int(rng.integers(1, n + 1))
        costs = (rng.random(n) * rng.choice([1.0, 1e-3, 1e6])).tolist()
        counts = partition_stages(costs, p)
        assert stage_costs(costs, counts).max() == pytest.approx(_brute(costs, p), rel=1e-12)


def test_heavy_last_layer_and_thousands_of_layers():
    costs = [1.0] * 31 + [9.0]
    counts = partition_stages(costs, 4)
    assert stage_costs(costs, counts).max() == pytest.approx(10.0)  # 10 | 10 | 10 | 1+9
    rng = np.random.default_rng(2)
    big = rng.random(5000)
    big[-1] = 40.0
    counts = partition_stages(big, 64)
    best = stage_costs(big, counts).max()
    # optimal: a greedy split under the optimum fits in 64 stages, under slightly less it does not
    def stages_needed(limit):
        num, acc = 1, 0.0
        for c in big:
            if acc + c > limit:
                num, acc = num + 1, c
            else:
                acc += c
        return num
    assert stages_needed(best * (1 + 1e-12)) <= 64
    assert stages_needed(best * (1 - 1e-9)) > 64


def test_split_stages_and_layout():
    kinds = ["embedding"] + ["decoder"] * 8 + ["loss"]
    costs = [1, 3, 3, 3, 3, 3, 3, 3, 3, 10]
    s = split_stages(costs, 4, layer_kinds=kinds)
    assert sum(s.counts) == 10 and s.split_points == np.cumsum(s.counts)[:-1].tolist()
    assert s.max_cost == 10.0
    assert s.layout == "Et*2|t*3|t*3|L"
    assert s.to_json()["layout"] == s.layout


def test_megatron_layout_strings():
    assert megatron_layout([2, 2, 2, 2]) == "(t*2|)*3,t*2"
    assert megatron_layout([1, 1]) == "t|t"
    assert megatron_layout([3], ["E", "t", "L"]) == "EtL"
    assert megatron_layout([4, 2, 2, 2, 2, 2], ["E"] + ["t"] * 12 + ["L"]) == "Et*3|(t*2|)*4,tL"
    assert megatron_layout([2, 3], ["E", "t", "t", "t", "L"]) == "Et|t*2,L"
    assert megatron_layout([1, 0, 1, 1], ["E", "t", "L"]) == "E||t|L"
    with pytest.raises(LaggardError):
        megatron_layout([2], ["E"])
    with pytest.raises(LaggardError, match="not known"):
        megatron_layout([1], ["attention"])


def test_layer_costs_from_stages():
    # 4 stages of 8 decoder layers at 1.0; embedding 0.5 on stage 0; output+loss 9.0 on the last
    costs, kinds = layer_costs_from_stages([8.5, 8.0, 8.0, 17.0], [8, 8, 8, 8])
    assert kinds[0] == "embedding" and kinds[-1] == "loss" and kinds.count("decoder") == 32
    assert costs[0] == pytest.approx(0.5) and costs[-1] == pytest.approx(9.0)
    assert costs[1:-1] == pytest.approx(np.ones(32))
    costs2, kinds2 = layer_costs_from_stages([4.0, 6.0], [4, 4], embedding=False)
    assert len(costs2) == 9 and kinds2[-1] == "loss" and costs2[-1] == pytest.approx(2.0)
    assert even_counts(10, 4) == [3, 3, 2, 2]


def test_errors():
    with pytest.raises(LaggardError, match="more than"):
        partition_stages([1.0, 2.0], 3)
    with pytest.raises(LaggardError, match="finite"):
        partition_stages([1.0, -2.0], 1)
    with pytest.raises(LaggardError, match="non-empty"):
        partition_stages([], 1)
    with pytest.raises(LaggardError, match="num_stages"):
        partition_stages([1.0], 0)
