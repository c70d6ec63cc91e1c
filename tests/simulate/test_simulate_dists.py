"""Worker-time distributions: specs, sampling, closed forms and the quadrature used as checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from laggard.errors import LaggardError, LaggardWarning
from laggard.simulate import theory
from laggard.simulate.dists import (
    TEXTBOOK,
    Constant,
    Exponential,
    Gaussian,
    LogNormal,
    Mixture,
    Pareto,
    harmonic,
    parse_dist,
)

SPECS = [
    "constant:value=2",
    TEXTBOOK,
    "textbook",
    "exponential:rate=2",
    "exponential:mean=0.5,base=1",
    "gaussian:mean=1,std=0.05",
    "normal:mean=2,std=0.5,min=1",
    "pareto:scale=1,alpha=3",
    "pareto:base=1,scale=0.5,alpha=2.5",
    "uniform:low=1,high=3",
    "mixture:0.99*gaussian(mean=1,std=0.05)+0.01*constant(value=5)",
    "mixture:gaussian(mean=1,std=0.05)+0.1*exponential(rate=0.5,base=1)",
]


@pytest.mark.parametrize("spec", SPECS)
def test_spec_round_trip_and_positive_samples(spec: str) -> None:
    d = parse_dist(spec)
    assert parse_dist(d.spec()) == d
    assert isinstance(d.describe(), str) and d.describe()
    x = d.sample(np.random.default_rng(1), (300, 7))
    assert x.shape == (300, 7) and x.dtype == np.float64
    assert (x > 0).all()
    assert d.sample(np.random.default_rng(1), 5).shape == (5,)


@pytest.mark.parametrize("spec", [s for s in SPECS if not s.startswith("pareto")])
def test_sample_mean_matches_exact_mean(spec: str) -> None:
    d = parse_dist(spec)
    x = d.sample(np.random.default_rng(7), 400_000)
    se = x.std() / math.sqrt(x.size)
    assert abs(x.mean() - d.mean()) < 5 * se + 1e-12


def test_textbook_is_one_plus_lognormal() -> None:
    d = parse_dist("textbook")
    assert d == LogNormal(base=1.0, mu=-0.7, sigma=0.9)
    assert d.mean() == pytest.approx(1.0 + math.exp(-0.7 + 0.9**2 / 2))
    assert parse_dist("lognormal:base=1.0,mean=-0.7,sigma=0.9") == d


def test_classes_from_specs() -> None:
    assert parse_dist("exponential:rate=4") == Exponential(rate=4.0)
    assert parse_dist("exponential:mean=0.25") == Exponential(rate=4.0)
    assert parse_dist("gaussian:mean=1,std=0.1,min=0.5") == Gaussian(mu=1.0, std=0.1, low=0.5)
    assert parse_dist("pareto:alpha=2") == Pareto(alpha=2.0)
    assert parse_dist("constant:value=3") == Constant(value=3.0)
    m = parse_dist("mixture:0.75*constant(value=1)+constant(value=4)")
    assert isinstance(m, Mixture)
    assert m.weights == pytest.approx((0.75, 0.25))


def test_mixture_picks_components_by_weight() -> None:
    d = parse_dist("mixture:0.9*constant(value=1)+0.1*constant(value=10)")
    x = d.sample(np.random.default_rng(3), 200_000)
    share = np.mean(x == 10.0)
    assert share == pytest.approx(0.1, abs=0.004)
    assert set(np.unique(x)) == {1.0, 10.0}
    # weights that do not sum to one are normalised
    d2 = parse_dist("mixture:2*constant(value=1)+2*constant(value=3)")
    assert d2.weights == pytest.approx((0.5, 0.5))


def test_gaussian_is_clipped_at_min() -> None:
    d = parse_dist("gaussian:mean=1,std=1,min=0.5")
    x = d.sample(np.random.default_rng(0), 100_000)
    assert x.min() == 0.5
    assert np.mean(x == 0.5) == pytest.approx(0.3085, abs=0.01)  # P(N(1,1) < 0.5)
    assert x.mean() == pytest.approx(d.mean(), abs=0.01)


def test_pareto_mean_and_tail() -> None:
    d = parse_dist("pareto:scale=2,alpha=3")
    assert d.mean() == pytest.approx(3.0)
    x = d.sample(np.random.default_rng(5), 400_000)
    assert x.min() >= 2.0
    # P(X > 4) = (2/4)^3
    assert np.mean(x > 4) == pytest.approx(0.125, abs=0.003)


def test_pareto_with_infinite_mean_warns() -> None:
    with pytest.warns(LaggardWarning, match="infinite mean"):
        d = parse_dist("pareto:alpha=0.9")
    assert d.mean() is None


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("weibull:k=1", "unknown distribution 'weibull'"),
        ("lognormal:sigma=x", "sigma must be a number"),
        ("lognormal:sigma=-1", "sigma must be > 0"),
        ("lognormal:sigma=nan", "must be finite"),
        ("lognormal:sigma", "expected key=value"),
        ("lognormal:sigma=1,sigma=2", "given twice"),
        ("gaussian:mean=1,foo=2", "unknown parameter 'foo'"),
        ("gaussian:mean=1,std=0.1,min=2", "min must be below mean"),
        ("exponential:rate=0", "rate must be > 0"),
        ("exponential:rate=1,mean=2", "not both"),
        ("uniform:low=2,high=1", "high must be greater than low"),
        ("mixture:0.5*constant(value=1)", "at least two terms"),
        ("mixture:constant(value=1)+constant(value=2)", "at most one mixture term"),
        ("mixture:0.6*constant(value=1)+0.5*constant(value=2)+exponential", "nothing left"),
        ("mixture:-1*constant(value=1)+constant(value=2)", "weights must be > 0"),
        ("mixture:0.5*constant(value=1+0.5*constant(value=2)", "unbalanced"),
        ("mixture:0.5*trace(x)+0.5*constant(value=2)", "must be parametric"),
        ("textbook:sigma=2", "takes no parameters"),
        ("trace:", "give the trace path"),
        ("trace:/no/such/file.parquet", "no such file"),
    ],
)
def test_bad_specs_raise_one_line_errors(spec: str, fragment: str) -> None:
    with pytest.raises(LaggardError) as info:
        parse_dist(spec, where="--dist")
    msg = str(info.value)
    assert fragment in msg
    assert "\n" not in msg
    assert isinstance(info.value, ValueError)


def test_harmonic_numbers() -> None:
    assert harmonic(1) == 1.0
    assert harmonic(4) == pytest.approx(1 + 1 / 2 + 1 / 3 + 1 / 4)
    assert harmonic(0) == 0.0


@pytest.mark.parametrize("k", [1, 2, 16, 1024])
def test_exponential_closed_form_equals_quadrature(k: int) -> None:
    d = parse_dist("exponential:rate=2")
    assert d.expected_max(k) == pytest.approx(harmonic(k) / 2)
    assert theory.expected_max(d, k) == pytest.approx(harmonic(k) / 2, rel=1e-6)
    assert theory.expected_max_exponential(k, 2.0) == pytest.approx(harmonic(k) / 2)


def test_exponential_order_statistics_closed_form() -> None:
    # the (K-m)-th smallest of K Exp(rate): sum_{j=m+1}^{K} 1/(j rate)
    d = parse_dist("exponential:rate=2")
    k, m = 16, 3
    exact = sum(1.0 / j for j in range(m + 1, k + 1)) / 2
    assert theory.expected_order_stat(d, k, m) == pytest.approx(exact, rel=1e-6)
    # min of b+1 Exp(rate) is Exp((b+1) rate)
    assert theory.expected_max(d, 64, copies=3) == pytest.approx(harmonic(64) / 6, rel=1e-6)


@pytest.mark.parametrize(("k", "textbook"), [(1, 1.744), (4, 2.546), (16, 3.770), (64, 5.475), (256, 7.775),
                                             (1024, 10.765)])
def test_textbook_values_by_quadrature(k: int, textbook: float) -> None:
    assert theory.expected_max(parse_dist("textbook"), k) == pytest.approx(textbook, rel=0.005)


def test_pareto_closed_form_equals_quadrature() -> None:
    d = parse_dist("pareto:scale=1,alpha=3")
    for k in (1, 8, 64):
        assert theory.expected_max(d, k) == pytest.approx(d.expected_max(k), rel=1e-4)


def test_uniform_closed_form() -> None:
    d = parse_dist("uniform:low=1,high=3")
    assert d.expected_max(3) == pytest.approx(1 + 2 * 3 / 4)
    assert theory.expected_max(d, 3) == pytest.approx(2.5, rel=1e-6)


def test_mixture_sf_is_weighted() -> None:
    d = parse_dist("mixture:0.9*exponential(rate=1)+0.1*constant(value=5)")
    x = np.array([0.5, 2.0, 6.0])
    expected = 0.9 * np.exp(-x) + 0.1 * (x < 5)
    assert np.allclose(d.sf(x), expected)
    assert np.allclose(d.cdf(x), 1 - expected)


@pytest.mark.parametrize("spec", [s for s in SPECS if not s.startswith("mixture")])
def test_fast_barrier_equals_the_max_of_the_draws(spec: str) -> None:
    """``sample_max`` (max of standard draws, then transform) has the law of the plain max."""
    from laggard.simulate.base import Distribution

    d = parse_dist(spec)
    fast = d.sample_max(np.random.default_rng(1), 20_000, 64)
    slow = Distribution.sample_max(d, np.random.default_rng(2), 20_000, 64)
    assert fast.shape == (20_000,) and (fast > 0).all()
    se = np.hypot(fast.std(), slow.std()) / math.sqrt(fast.size)
    assert abs(fast.mean() - slow.mean()) <= 5 * se + 1e-12
    for q in (0.1, 0.5, 0.9):
        assert np.quantile(fast, q) == pytest.approx(np.quantile(slow, q), rel=0.02)
    if d.expected_max(64) is not None:
        assert abs(fast.mean() - d.expected_max(64)) <= 5 * fast.std() / math.sqrt(fast.size) + 1e-12


@pytest.mark.parametrize("spec, param", [("normal:mean=1", "std"), ("lognormal:mean=0", "sigma"),
                                         ("pareto:scale=1", "alpha"), ("gaussian", "std")])
def test_a_defaulted_spread_is_said(spec: str, param: str) -> None:
    import warnings

    from laggard.errors import LaggardWarning

    with pytest.warns(LaggardWarning, match=f"{param} not given, using"):
        parse_dist(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LaggardWarning)
        parse_dist(f"{spec}{',' if ':' in spec else ':'}{param}=2")
        parse_dist("textbook")
