"""Delay and sojourn distributions: means, CDFs, inverse CDFs and study-file validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from desim.kernel.params import ConfigError
from desim.kernel.registry import DISTRIBUTIONS
from desim.network_models.distributions import (
    Constant,
    Distribution,
    Exponential,
    Geometric,
    Lognormal,
    Pareto,
    Uniform,
    Weibull,
    distribution,
)

#: (distribution, the same law in scipy.stats)
CASES = [
    (Uniform(low=2.0, high=5.0), stats.uniform(loc=2.0, scale=3.0)),
    (Exponential(mean=4.0), stats.expon(scale=4.0)),
    (
        Lognormal(mean=3.0, cv=0.8),
        stats.lognorm(s=math.sqrt(math.log(1.64)), scale=3.0 / math.sqrt(1.64)),
    ),
    (Pareto(shift=1.0, scale=2.0, alpha=3.5), stats.lomax(c=3.5, loc=1.0, scale=2.0)),
    (Weibull(shape=0.7, scale=10.0), stats.weibull_min(c=0.7, scale=10.0)),
    (Geometric(mean=4.0), stats.geom(p=0.25)),
]
IDS = ["uniform", "exponential", "lognormal", "pareto", "weibull", "geometric"]


def test_every_model_is_registered():
    assert set(DISTRIBUTIONS) == {
        "constant",
        "uniform",
        "exponential",
        "lognormal",
        "pareto",
        "weibull",
        "geometric",
    }


@pytest.mark.parametrize(("dist", "ref"), CASES, ids=IDS)
def test_mean_matches_scipy_and_sample_mean_is_within_four_standard_errors(dist, ref):
    assert dist.mean == pytest.approx(ref.mean(), rel=1e-12)
    n = 200_000
    x = dist.sample(np.random.default_rng(1), n)
    assert x.shape == (n,) and x.min() >= 0
    assert abs(x.mean() - dist.mean) < 4 * math.sqrt(ref.var() / n)


@pytest.mark.parametrize(("dist", "ref"), CASES, ids=IDS)
def test_cdf_and_ppf_match_scipy(dist, ref):
    x = np.linspace(0, 30, 301)
    np.testing.assert_allclose(dist.cdf(x), ref.cdf(x), rtol=1e-10, atol=1e-14)
    u = np.linspace(0.001, 0.999, 300)  # scipy puts ppf(0) of a discrete law below its support
    np.testing.assert_allclose(dist.ppf(u), ref.ppf(u), rtol=1e-10, atol=1e-12)
    assert dist.ppf(np.array([0.0]))[0] == ref.support()[0]


@pytest.mark.parametrize(("dist", "ref"), CASES[:-1], ids=IDS[:-1])
@given(u=st.floats(0.0, 0.999))
def test_cdf_inverts_ppf_for_continuous_models(dist, ref, u):
    assert dist.cdf(dist.ppf(np.array([u])))[0] == pytest.approx(u, abs=1e-9)


@given(mean=st.floats(1.0, 50.0), u=st.floats(0.0, 0.999999))
def test_geometric_ppf_is_the_smallest_k_whose_cdf_reaches_u(mean, u):
    g = Geometric(mean=mean)
    k = g.ppf(np.array([u]))[0]
    assert k >= 1 and k == int(k)
    assert g.cdf(np.array([k]))[0] >= u - 1e-12
    assert k == 1 or g.cdf(np.array([k - 1]))[0] < u + 1e-12


@given(
    m1=st.floats(1.0, 50.0),
    m2=st.sampled_from([1.0, 2.0, 10.0, 37.5]),
    seed=st.integers(0, 2**32 - 1),
)
def test_geometric_quantiles_of_two_laws_in_one_pass_are_those_of_each_law(m1, m2, seed):
    """`Geometric.ppf_of` with each draw's own log(1 − p) (mean 1 included: log_q = −∞) gives
    the floats of the two laws' own `ppf` (alternating renewal draws rely on it)."""
    rng = np.random.default_rng(seed)
    u, first = rng.random(500), rng.random(500) < 0.5
    g1, g2 = Geometric(mean=m1), Geometric(mean=m2)
    expected = np.where(first, g1.ppf(u), g2.ppf(u))
    assert np.array_equal(Geometric.ppf_of(u, np.where(first, g1.log_q, g2.log_q)), expected)


def test_hand_values():
    assert Exponential(mean=2.0).cdf(np.array([2.0]))[0] == pytest.approx(1 - math.exp(-1))
    assert Weibull(shape=2.0, scale=1.0).mean == pytest.approx(math.sqrt(math.pi) / 2)
    pareto = Pareto(shift=1.0, scale=2.0, alpha=3.0)
    assert pareto.mean == 2.0
    assert pareto.ppf(np.array([0.5]))[0] == pytest.approx(1 + 2 * (2 ** (1 / 3) - 1))
    assert pareto.cdf(np.array([0.5, 1.0]))[0:2].tolist() == [0.0, 0.0]
    g = Geometric(mean=4.0)
    np.testing.assert_allclose(g.cdf(np.array([0.0, 0.9, 1.0, 2.5])), [0, 0, 0.25, 0.4375])
    assert np.array_equal(Geometric(mean=1.0).sample(np.random.default_rng(0), 5), np.ones(5))
    assert np.array_equal(
        Constant(value=3.0).sample(np.random.default_rng(0), (2, 2)), np.full((2, 2), 3.0)
    )
    np.testing.assert_array_equal(Constant(value=3.0).cdf(np.array([2.9, 3.0])), [0, 1])
    point = Uniform(low=2.0, high=2.0)
    np.testing.assert_array_equal(point.cdf(np.array([1.9, 2.0])), [0, 1])
    flat = Lognormal(mean=2.0, cv=0.0)
    assert np.allclose(flat.ppf(np.array([0.1, 0.9])), 2.0)
    np.testing.assert_array_equal(flat.cdf(np.array([1.9, 2.0])), [0, 1])
    assert Lognormal(mean=2.0, cv=1.0).cdf(np.array([0.0]))[0] == 0.0


def test_distribution_builds_from_a_table_and_passes_instances_through():
    d = distribution({"model": "lognormal", "mean": 5.0, "cv": 0.5}, "[network.latency]")
    assert d == Lognormal(mean=5.0, cv=0.5)
    assert isinstance(d, Distribution)
    assert distribution({"model": "constant"}, "x") == Constant(value=1.0)
    assert distribution(d, "x") is d
    assert distribution({"model": "exponential", "mean": 3}, "x").mean == 3.0


@pytest.mark.parametrize(
    ("table", "needles"),
    [
        ({"mean": 5.0}, ["[network.latency]", "missing key 'model'", "exponential"]),
        ({"model": "exponentail"}, ["[network.latency]: model", "did you mean 'exponential'"]),
        ({"model": 3}, ["[network.latency]: model", "must be a string"]),
        ({"model": "exponential", "mean": -1.0}, ["[network.latency]", "mean = -1.0", "> 0"]),
        ({"model": "exponential", "rate": 1.0}, ["[network.latency]", "unknown key 'rate'"]),
        ({"model": "uniform", "low": 3.0, "high": 1.0}, ["[network.latency]", "high", "low"]),
        ({"model": "pareto", "alpha": 1.0}, ["[network.latency]", "alpha = 1.0", "> 1"]),
        ({"model": "geometric", "mean": 0.5}, ["[network.latency]", "mean = 0.5", "≥ 1"]),
        ({"model": "weibull", "shape": "big"}, ["[network.latency]", "shape", "a number"]),
        (5.0, ["[network.latency] = 5.0", "must be a table"]),
    ],
)
def test_bad_tables_give_one_line_errors_naming_the_table_and_field(table, needles):
    with pytest.raises(ConfigError) as exc:
        distribution(table, "[network.latency]")
    message = str(exc.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


def test_lognormal_with_mean_zero_is_the_constant_zero():
    d = Lognormal(mean=0.0, cv=2.0)
    assert (d.sample(np.random.default_rng(1), 5) == 0).all()
    assert d.cdf(np.array([-0.1, 0.0, 1.0])).tolist() == [0.0, 1.0, 1.0]
