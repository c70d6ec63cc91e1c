"""The microbatch cost model and its fit."""

from __future__ import annotations

import numpy as np
import pytest

from laggard.errors import LaggardError
from laggard.mitigate import CostModel, fit_cost
from laggard.mitigate.cost import features

pytestmark = pytest.mark.timeout(60)


def _samples(rng, n):
    return [rng.integers(1, 4096, rng.integers(1, 9)) for _ in range(n)]


def test_features():
    x = features([[1, 2], [3], []])
    np.testing.assert_array_equal(x, [[5, 3, 1], [9, 3, 1], [0, 0, 1]])


@pytest.mark.parametrize(("a", "b", "c0"), [(2e-9, 3e-6, 1e-3), (1.0, 0.0, 0.0), (0.0, 5.0, 2.0), (3e-3, 1.0, 0.0)])
def test_recovers_known_coefficients_exactly(a, b, c0):
    rng = np.random.default_rng(0)
    seqs = _samples(rng, 200)
    times = [CostModel(a, b, c0).microbatch_cost(s) for s in seqs]
    fit = fit_cost(seqs, times)
    assert fit.model.a == pytest.approx(a, rel=1e-6, abs=1e-15)
    assert fit.model.b == pytest.approx(b, rel=1e-6, abs=1e-12)
    assert fit.model.c0 == pytest.approx(c0, rel=1e-6, abs=1e-9)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.num_samples == 200


def test_recovers_coefficients_with_noise():
    rng = np.random.default_rng(1)
    seqs = _samples(rng, 2000)
    true = CostModel(2e-9, 3e-6, 1e-3)
    times = np.array([true.microbatch_cost(s) for s in seqs]) * rng.lognormal(0, 0.02, 2000)
    fit = fit_cost(seqs, times)
    assert fit.model.a == pytest.approx(2e-9, rel=0.05)
    assert fit.model.b == pytest.approx(3e-6, rel=0.05)
    assert fit.model.c0 == pytest.approx(1e-3, rel=0.3)
    assert 0.95 < fit.r2 <= 1.0


def test_coefficients_are_never_negative():
    rng = np.random.default_rng(2)
    seqs = _samples(rng, 100)
    # data with a negative linear part: least squares would go negative, the fit clips at zero
    times = [1e-6 * (np.asarray(s, float) ** 2).sum() - 1e-4 * np.sum(s) + 5.0 for s in seqs]
    fit = fit_cost(seqs, times)
    assert fit.model.a >= 0 and fit.model.b >= 0 and fit.model.c0 >= 0


def test_linear_only_fit():
    seqs = [[n] for n in range(1, 50)]
    fit = fit_cost(seqs, [3.0 * s[0] + 1.0 for s in seqs], quadratic=False)
    assert fit.model.a == 0.0
    assert fit.model.b == pytest.approx(3.0) and fit.model.c0 == pytest.approx(1.0)


def test_fit_errors():
    with pytest.raises(LaggardError, match="at least 3"):
        fit_cost([[1], [2]], [1.0, 2.0])
    with pytest.raises(LaggardError, match="times"):
        fit_cost([[1], [2], [3]], [1.0, 2.0])
    with pytest.raises(LaggardError, match="finite"):
        fit_cost([[1], [2], [3]], [1.0, float("nan"), 2.0])
    with pytest.raises(LaggardError, match="CostModel"):
        CostModel(-1.0, 0.0, 0.0)
