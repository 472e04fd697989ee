"""Private-ColME: mechanisms and statistic against closed forms, protocol against Props. 1–3."""

from __future__ import annotations

import numpy as np
import pytest

from desim.models.colme import analytic
from desim.models.colme.statistic import PairStatistic
from desim.models.privacy.bits import lowest_set_bit, set_bits
from desim.models.privacy.release import PSumRelease

DATA = {"model": "classes", "agents": 15, "class_means": [0.2, 0.4, 0.8], "sigma": 0.5}


# -- the O(1) statistic equals eq. (2) with (20) / the exact PM-II node formula --------------
@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
@pytest.mark.parametrize("weights", ["last", "mom", "wmom"])
def test_incremental_variance_equals_closed_form(mechanism, weights):
    rng = np.random.default_rng(3)
    times = np.cumsum(rng.integers(1, 9, size=40)).astype(float)
    stat = PairStatistic(2, mechanism, weights, 5.0, levels=8)
    values = rng.normal(size=40)
    noise_term = analytic.pm1_noise_term if mechanism == "pm1" else analytic.pm2_noise_term
    for k in range(1, 41):
        stat.update(
            np.array([0]), np.array([1]), values[k - 1 : k], times[k - 1 : k], np.array([k])
        )
        w = analytic.weights(weights, k)
        expect = 0.7 * analytic.data_term(times[:k], w) + 5.0 * noise_term(times[:k], w)
        assert stat.variance(np.array([0.3, 0.7]))[0, 1] == pytest.approx(expect, rel=1e-10)
        assert stat.value[0, 1] == pytest.approx(w @ values[:k], rel=1e-12)


def test_statistic_accepts_gaps_and_rejects_stale_releases():
    stat = PairStatistic(2, "pm1", "last", 1.0, levels=4)
    one = np.array([0]), np.array([1])
    stat.update(*one, np.array([0.0]), np.array([1.0]), np.array([2]))  # release 1 was lost
    for stale in (1, 2):
        with pytest.raises(ValueError):
            stat.update(*one, np.array([0.0]), np.array([2.0]), np.array([stale]))


# -- release mechanisms: noise reuse and variance ---------------------------------------------
def test_bit_helpers():
    j = np.array([1, 2, 3, 4, 6, 12])
    np.testing.assert_array_equal(lowest_set_bit(j), [0, 1, 0, 2, 1, 2])
    np.testing.assert_array_equal(set_bits(np.array([5]), 4), [[True, False, True, False]])


def test_pm2_reuses_the_noise_of_the_same_p_sum():
    """Release 3 uses nodes (1,1) and (0,3): node (1,1) is release 2's noise, reused."""
    b, a = np.array([1]), np.array([0])
    mech = PSumRelease(2, "pm2", "gaussian", 1.0, np.random.default_rng(0), 16)
    draws = np.random.default_rng(0).normal(size=4)  # the fresh noises, in order
    got = [mech.release(b, a, np.zeros(1), np.ones(1))[0][0] for _ in range(4)]
    np.testing.assert_allclose(got, [draws[0], draws[1], draws[1] + draws[2], draws[3]])


@pytest.mark.parametrize(
    "mechanism, noise",
    [("pm1", "gaussian"), ("pm2", "gaussian"), ("pm1", "laplace"), ("pm2", "laplace")],
)
def test_release_noise_variance_matches_monte_carlo(mechanism, noise):
    """Var of release j's noise is k σ_DP²/t² with k = j (PM-I) or w_H(j) (PM-II)."""
    m, kappa, sigma2 = 150, 12, 4.0
    mech = PSumRelease(m, mechanism, noise, sigma2, np.random.default_rng(11), 64)
    b, a = np.nonzero(~np.eye(m, dtype=bool))  # every ordered pair once
    n_pairs = len(b)
    t = 3.0
    for j in range(1, kappa + 1):
        z, _, _ = mech.release(b, a, np.zeros(n_pairs), np.full(n_pairs, t))
        k = j if mechanism == "pm1" else bin(j).count("1")
        expect = k * sigma2 / t**2
        # the sample variance of n draws has standard error ≈ var·√((κ₄−1)/n); Laplace κ₄ = 6
        se = expect * np.sqrt((5.0 if noise == "laplace" else 2.0) / n_pairs)
        assert abs(z.var() - expect) < 4 * se, (j, z.var(), expect)
