"""Property tests (hypothesis) of the Private-ColME building blocks."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import desim
from desim.models.colme import analytic
from desim.models.colme.statistic import PairStatistic
from desim.models.privacy.release import PSumRelease
from desim.study.scenario import Scenario

gaps = st.lists(st.integers(1, 50), min_size=1, max_size=40)


@given(
    gaps=gaps,
    mechanism=st.sampled_from(["pm1", "pm2"]),
    weights=st.sampled_from(["last", "mom", "wmom"]),
    s2=st.floats(0.01, 10),
    s2dp=st.floats(0.0, 1e4),
)
@settings(max_examples=60, deadline=None)
def test_incremental_var_T_equals_closed_form_for_any_query_times(
    gaps, mechanism, weights, s2, s2dp
):
    times = np.cumsum(gaps).astype(float)
    stat = PairStatistic(2, mechanism, weights, s2dp, levels=8)
    noise_term = analytic.pm1_noise_term if mechanism == "pm1" else analytic.pm2_noise_term
    for k in range(1, len(times) + 1):
        stat.update(np.array([1]), np.array([0]), np.zeros(1), times[k - 1 : k], np.array([k]))
    w = analytic.weights(weights, len(times))
    expect = s2 * analytic.data_term(times, w) + s2dp * noise_term(times, w)
    got = stat.variance(np.array([s2, s2]))[1, 0]
    assert np.isclose(got, expect, rtol=1e-9)


@given(kappa=st.integers(1, 300), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=40, deadline=None)
def test_pm2_release_noise_is_the_sum_of_its_dyadic_nodes(kappa, seed):
    """Release j's noise is the sum over set bits s of j of the node drawn at j's prefix m·2^s."""
    mech = PSumRelease(2, "pm2", "gaussian", 1.0, np.random.default_rng(seed), 512)
    b, a = np.array([0]), np.array([1])
    fresh, noise = [], []
    for _ in range(kappa):
        value, j, z = mech.release(b, a, np.zeros(1), np.ones(1))
        fresh.append(z[0])
        noise.append(value[0])
    for j in range(1, kappa + 1):
        nodes = [((j >> s) << s) for s in range(10) if j >> s & 1]  # node ends: j with low bits 0
        assert np.isclose(noise[j - 1], sum(fresh[e - 1] for e in nodes))


@given(
    seed=st.integers(0, 10**6),
    protocol=st.sampled_from(["private-colme", "local"]),
    mechanism=st.sampled_from(["pm1", "pm2"]),
)
@settings(max_examples=8, deadline=None)
def test_same_seed_same_bytes(seed, protocol, mechanism):
    params = {"mechanism": mechanism} if protocol == "private-colme" else {}
    s = Scenario(
        protocol, params, {"model": "classes", "agents": 12}, t_max=120, seed=seed, checkpoints=10
    )
    first, second = desim.run(s).metrics, desim.run(s).metrics
    assert first.to_csv().encode() == second.to_csv().encode()
