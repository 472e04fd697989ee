"""The empirical-Bayes family's mechanisms, estimators and closed forms against hand computations,
exact identities and Monte Carlo with standard-error tolerances."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from desim.models.eb import analytic
from desim.models.eb import estimators as est
from desim.models.eb import mechanisms as mech
from desim.models.eb.data import BernoulliPrior

# -- mechanisms ----------------------------------------------------------------------------------


def test_clip_radius_and_gaussian_sigma_by_hand():
    # b = r + (σ_θ + σ_x/√n)√log(m²n) with m = 10⁴, n = 15, σ_θ = 0.1, σ_x = 0.5, r = 1
    root = math.sqrt(math.log(1e8 * 15))
    assert mech.clip_radius(1.0, 0.1, 0.5, 10_000, 15) == pytest.approx(
        1.0 + 0.1 * root + 0.5 / math.sqrt(15) * root, rel=1e-14
    )
    assert mech.gaussian_ldp_sigma2(2.0, 0.5, 1e-5) == pytest.approx(
        8 * 4 * math.log(2e5) / 0.25, rel=1e-14
    )
    assert mech.quantiser_sigma2(3.0, 2) == pytest.approx(1.0)  # (3/(2²−1))²


@pytest.mark.parametrize("bits", [1, 2, 5])
def test_quantiser_is_unbiased_on_its_grid_with_variance_below_sigma_q(bits):
    b, n_draws = 1.7, 40_000
    rng = np.random.default_rng(bits)
    levels = 2**bits - 1
    step = 2 * b / levels
    for x in (-b, -0.93, 0.0, 0.31, 1.2, b):
        q = mech.quantise(np.full(n_draws, x), b, bits, rng)
        # every output is one of the 2^k levels −b + i·Δ
        idx = (q + b) / step
        assert np.allclose(idx, np.round(idx)) and idx.min() >= -1e-9 and idx.max() <= levels
        # exact variance Δ² f(1−f) ≤ Δ²/4 = σ_q², and the Monte Carlo agrees with it
        f = levels * (x + b) / (2 * b) % 1.0
        var = step**2 * f * (1 - f)
        assert var <= mech.quantiser_sigma2(b, bits) * (1 + 1e-12)
        se = math.sqrt(var / n_draws)
        assert abs(q.mean() - x) <= 4 * se + 1e-12
        if var > 0:  # variance of a sample variance of two-point data: ≤ var·√(2/n) scale
            assert abs(q.var() - var) <= 6 * var * math.sqrt(2 / n_draws) + 1e-12


def test_quantiser_refuses_unclipped_input():
    with pytest.raises(ValueError, match="clip first"):
        mech.quantise(np.array([2.0]), 1.0, 3, np.random.default_rng(0))


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.0])
def test_randomised_response_is_unbiased_with_its_exact_variance(epsilon):
    rng = np.random.default_rng(7)
    n_draws = 200_000
    low, high = mech.rr_values(epsilon)
    for x in (0.0, 0.2, 0.5, 1.0):
        q = mech.randomised_response(np.full(n_draws, x), epsilon, rng)
        assert set(np.unique(q)) <= {low, high}
        var = float(mech.rr_variance(x, epsilon))
        assert abs(q.mean() - x) <= 4 * math.sqrt(var / n_draws)
        # the two-point law's variance, (H − L)² P(H)(1 − P(H)), is the closed form
        ph = float(mech.rr_high_probability(x, epsilon))
        assert (high - low) ** 2 * ph * (1 - ph) == pytest.approx(var, rel=1e-12)


@given(x=st.floats(0, 1), y=st.floats(0, 1), epsilon=st.floats(0.01, 10))
@settings(max_examples=200, deadline=None)
def test_randomised_response_likelihood_ratio_never_exceeds_e_epsilon(x, y, epsilon):
    """ε₀-LDP of eq. (7), exactly: P[q(x) = v]/P[q(y) = v] ≤ e^ε₀ for both outputs v."""
    px = float(mech.rr_high_probability(x, epsilon))
    py = float(mech.rr_high_probability(y, epsilon))
    bound = math.exp(epsilon) * (1 + 1e-12)
    assert 0 < px < 1 and 0 < py < 1
    assert px / py <= bound and (1 - px) / (1 - py) <= bound


def test_randomised_response_ratio_is_attained_at_the_ends():
    e = 1.3
    p0, p1 = (float(mech.rr_high_probability(x, e)) for x in (0.0, 1.0))
    assert p1 / p0 == pytest.approx(math.exp(e), rel=1e-12)


# -- estimators ----------------------------------------------------------------------------------


def test_leave_one_out_moments_match_a_hand_loop():
    y = np.array([0.1, 0.5, 0.35, 0.9, 0.0, 0.42])
    m = len(y)
    mu, s2_c = est.loo_moments(y, "consistent")
    _, s2_p = est.loo_moments(y, "printed")
    loo = np.array([(y.sum() - y[i]) / (m - 1) for i in range(m)])
    for i in range(m):
        others = [y[j] for j in range(m) if j != i]
        assert mu[i] == pytest.approx(np.mean(others), rel=1e-14)
        assert s2_c[i] == pytest.approx(sum((v - mu[i]) ** 2 for v in others) / (m - 2))
        # eq. (6) as printed: deviations from each l's own leave-one-out mean μ̂_l
        assert s2_p[i] == pytest.approx(
            sum((y[j] - loo[j]) ** 2 for j in range(m) if j != i) / (m - 2)
        )


def test_bernoulli_weights_with_exact_moments_are_the_posterior_weight():
    alpha, beta, n = 2.0, 5.0, 14
    mean, var = analytic.beta_moments(alpha, beta)
    var_xbar = var + (mean * (1 - mean) - var) / n  # what S² of the means estimates
    s2 = est.prior_variance(np.array([var_xbar]), np.array([mean]), n)
    assert s2[0] == pytest.approx(var, rel=1e-12)
    a = est.bernoulli_weight(np.array([mean]), s2, n, "consistent", minus_one=True)
    assert a[0] == pytest.approx(n / (alpha + beta + n), rel=1e-12)
    # as printed, with the exact prior variance, (6) is also n/(α+β+n): α+β = μ(1−μ)/σ² − 1
    a = est.bernoulli_weight(np.array([mean]), np.array([var]), n, "printed", minus_one=True)
    assert a[0] == pytest.approx(n / (alpha + beta + n), rel=1e-12)


def test_gaussian_weight_by_hand():
    # Theorem 1: a = σ_θ²/(σ_θ² + σ_x²/n) = 0.01/(0.01 + 0.25/15) = 0.375
    assert est.gaussian_weight(0.01, 0.0, 10_000, 0.25 / 15) == pytest.approx(0.375)
    # Theorem 2: σ_q²/(m − 1) joins σ_θ²
    a = est.gaussian_weight(0.01, 9.0, 10, 0.25 / 15)
    assert a == pytest.approx(1.01 / (1.01 + 0.25 / 15))


def test_posterior_weights_by_hand():
    centres, weights = np.array([0.0, 1.0]), np.array([0.25, 0.75])
    w = est.posterior_weights(np.array([0.5, 0.0]), 4, 1.0, centres, weights)
    assert w[0] == pytest.approx([0.25, 0.75])  # equidistant: the prior
    # X̄ = 0, n = 4, σ² = 1: likelihood ratio e^{−4·1/2} for centre 1
    r = 0.75 * math.exp(-2.0)
    assert w[1] == pytest.approx([0.25 / (0.25 + r), r / (0.25 + r)])
    assert np.allclose(w.sum(axis=1), 1.0)


def test_cluster_is_deterministic_for_a_seed_and_finds_the_classes():
    rng = np.random.default_rng(3)
    y = rng.choice([0.2, 0.4, 0.8], 600) + 0.01 * rng.standard_normal(600)
    a = est.cluster(y, 3, np.random.default_rng(11), None, 10)
    b = est.cluster(y, 3, np.random.default_rng(11), None, 10)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert np.allclose(a[0], [0.2, 0.4, 0.8], atol=0.005)
    assert a[1].sum() == pytest.approx(1.0)
    warm = est.cluster(y, 3, np.random.default_rng(99), a[0], 1)  # warm start: rng unused
    assert np.allclose(warm[0], a[0], atol=1e-3)


# -- closed forms --------------------------------------------------------------------------------


@given(
    m=st.integers(2, 10**5),
    n=st.integers(1, 10**4),
    st2=st.floats(0, 10),
    sx2=st.floats(1e-3, 10),
    sq2=st.floats(0, 100),
)
@settings(max_examples=200, deadline=None)
def test_theorem_bound_is_the_exact_mse_at_its_weight(m, n, st2, sx2, sq2):
    """The exact MSE of a X̄ + (1 − a) μ̂_q at a of Theorem 1/2 equals the theorems' bound."""
    a = analytic.theorem_weight(m, n, st2, sx2, sq2)
    exact = analytic.shrinkage_mse(a, m, n, st2, sx2, sq2)
    assert exact == pytest.approx(analytic.theorem_mse(m, n, st2, sx2, sq2), rel=1e-9)


def test_closed_forms_by_hand():
    # Fig. 4's set-up: m = 10⁴, n = 15, σ_θ = 0.1, σ_x = 0.5 (a = 0.375)
    assert analytic.theorem_mse(10_000, 15, 0.01, 0.25) == pytest.approx(
        0.25 / 15 * (0.375 + 0.625 / 10_000)
    )
    # (47) equals Theorem 1's bound; (46) is below it
    assert analytic.van_trees_estimated(10_000, 15, 0.01, 0.25) == pytest.approx(
        analytic.theorem_mse(10_000, 15, 0.01, 0.25)
    )
    assert analytic.van_trees_prior(15, 0.01, 0.25) == pytest.approx(0.0025 / 0.4)
    # Beta(2, 5), n = 14: αβ/(n(α+β)(α+β+1)) · n/(α+β+n)
    local = 10 / (14 * 7 * 8)
    assert analytic.beta_bernoulli_mse(14, 2, 5) == pytest.approx(local * 14 / 21)
    mean, var = analytic.beta_moments(2, 5)
    assert analytic.bernoulli_local_mse(14, mean, var) == pytest.approx(local)
    assert analytic.linear_shrinkage_mse(14, mean, var) == pytest.approx(local * 14 / 21)


@pytest.mark.parametrize("prior", ["beta", "normal", "uniform", "spikes"])
def test_prior_moments_against_draws(prior):
    spec = BernoulliPrior(
        agents=200_000, prior=prior, alpha=2.0, beta=3.0, mean=0.6, sd=0.3, low=0.1, high=0.7
    )
    p = spec.draw(np.random.default_rng(5))
    mean, var = spec.moments()
    assert 0 <= p.min() and p.max() <= 1
    assert abs(p.mean() - mean) <= 4 * math.sqrt(var / len(p))
    # sd of a sample variance ≤ sqrt(E(p−μ)⁴/n) ≤ sqrt(var/n) for p in [0, 1]
    assert abs(p.var() - var) <= 4 * math.sqrt(var / len(p))


# -- posterior mean against linear shrinkage (issue 27: the curve names what it computes) --------
def test_posterior_mean_mse_by_hand():
    # n = 1, p = 1/4 or 3/4 with equal mass: E[p | Z = 1] = 5/8, E[p | Z = 0] = 3/8,
    # MSE = E p² − E E[p | Z]² = 5/16 − (25/64 + 9/64)/2 = 3/64
    assert analytic.discrete_posterior_mse(1, [0.25, 0.75], [1, 1]) == pytest.approx(3 / 64)
    # atoms at 0 and 1: one sample tells which, the posterior mean is exact
    assert analytic.discrete_posterior_mse(2, [0.0, 1.0], [0.3, 0.7]) == 0.0
    # a point mass: nothing to learn, nothing to lose
    assert analytic.discrete_posterior_mse(5, [0.4], [2.0]) == 0.0


def test_three_spike_prior_posterior_mean_gains_more_than_linear_shrinkage():
    """The figures of issue 27: at n = 14 the posterior mean gains 32.8 % over the local mean
    under the 3-spike prior, the best linear shrinkage 26.3 %."""
    spikes = BernoulliPrior(prior="spikes")
    mean, var = spikes.moments()
    local = analytic.bernoulli_local_mse(14, mean, var)
    post = analytic.discrete_posterior_mse(14, [0.25, 0.5, 0.75], [1, 1, 1])
    assert 1 - post / local == pytest.approx(0.328, abs=5e-4)
    assert 1 - analytic.linear_shrinkage_mse(14, mean, var) / local == pytest.approx(
        0.263, abs=5e-4
    )


@given(
    atoms=st.lists(st.floats(0, 1), min_size=1, max_size=6),
    n=st.integers(1, 60),
)
@example(atoms=[1.0, 0.9999999999999999], n=1)  # μ(1−μ) − σ² rounds below 0
@settings(max_examples=100, deadline=None)
def test_posterior_mean_is_never_worse_than_linear_shrinkage(atoms, n):
    """The Bayes estimator has the least MSE of all, linear ones included."""
    p = np.asarray(atoms)
    post = analytic.discrete_posterior_mse(n, p, np.ones(len(p)))
    linear = float(analytic.linear_shrinkage_mse(n, p.mean(), p.var()))
    assert 0.0 <= post <= linear * (1 + 1e-9) + 1e-15


@pytest.mark.parametrize("bad", [dict(n=2.5), dict(n=0), dict(atoms=[1.5]), dict(weights=[-1])])
def test_posterior_mean_mse_refuses_bad_arguments(bad):
    args = dict(n=3, atoms=[0.5], weights=[1.0]) | bad
    with pytest.raises(ValueError):
        analytic.discrete_posterior_mse(args["n"], args["atoms"], args["weights"])


def _monte_carlo_posterior(prior, n, posterior, draws=200_000, seed=3):
    """(mean, standard error) of (p − E[p | Z])² over p from the prior and Z ~ Bin(n, p), with
    `posterior(z)` the posterior mean computed independently of `analytic`."""
    rng = np.random.default_rng(seed)
    p = dataclasses.replace(prior, agents=draws).draw(rng)
    z = rng.binomial(n, p)
    err = (p - np.array([posterior(k) for k in range(n + 1)])[z]) ** 2
    return err.mean(), err.std() / math.sqrt(draws)


def test_posterior_mean_curve_against_monte_carlo_spikes():
    from scipy import stats

    from desim.kernel.registry import CURVES

    prior = BernoulliPrior(prior="spikes", spikes=[0.1, 0.35, 0.9])
    atoms = np.array(prior.spikes)

    def posterior(z):
        like = stats.binom.pmf(z, 6, atoms)
        return float(like @ atoms / like.sum())

    mc, se = _monte_carlo_posterior(prior, 6, posterior)
    curve = CURVES.get("eb-posterior-mean")().curve(np.array([6.0]), prior)[0][0]
    assert abs(curve - mc) <= 4 * se


def test_posterior_mean_curve_against_monte_carlo_clipped_normal():
    from scipy import integrate, stats

    from desim.kernel.registry import CURVES

    prior = BernoulliPrior(prior="normal", mean=0.7, sd=0.3)
    n, z_law = 9, stats.norm(0.7, 0.3)

    def posterior(z):
        # atoms at 0 (mass below 0) and 1 (mass above 1), density in between
        w1 = z_law.sf(1.0) * (z == n)
        w0 = z_law.cdf(0.0) * (z == 0)
        f = lambda p, k: p**k * stats.binom.pmf(z, n, p) * z_law.pdf(p)  # noqa: E731
        top = integrate.quad(f, 0, 1, args=(1,))[0] + w1
        return top / (integrate.quad(f, 0, 1, args=(0,))[0] + w0 + w1)

    mc, se = _monte_carlo_posterior(prior, n, posterior)
    curve = CURVES.get("eb-posterior-mean")().curve(np.array([float(n)]), prior)[0][0]
    assert abs(curve - mc) <= 4 * se


def test_posterior_mean_curve_is_exact_for_uniform_and_beta_priors():
    """Uniform on [0, 1] is Beta(1, 1): the quadrature must give the closed form; under a Beta
    prior the posterior mean is linear, so the two curves coincide."""
    from desim.kernel.registry import CURVES

    t = np.arange(1.0, 30.0)
    post, linear = CURVES.get("eb-posterior-mean")(), CURVES.get("eb-linear-shrinkage")()
    uniform = BernoulliPrior(prior="uniform", low=0.0, high=1.0)
    np.testing.assert_allclose(
        post.curve(t, uniform)[0], analytic.beta_bernoulli_mse(t, 1, 1), rtol=1e-10
    )
    beta = BernoulliPrior(prior="beta", alpha=2.0, beta=5.0)
    np.testing.assert_allclose(post.curve(t, beta)[0], linear.curve(t, beta)[0], rtol=1e-12)
    # a uniform prior on a sub-interval is not a Beta: there the posterior mean gains more
    narrow = BernoulliPrior(prior="uniform", low=0.2, high=0.4)
    assert np.all(post.curve(t, narrow)[0] < linear.curve(t, narrow)[0])
    with pytest.raises(ValueError, match="whole sample counts"):
        post.curve(np.array([2.5]), uniform)
