"""The model of C-ColME against values computed by hand from the formulas of docs/papers.md."""

from __future__ import annotations

import math

import numpy as np
import pytest

from desim.models.ccolme.model import (
    bernstein_keep,
    bernstein_threshold,
    confidence_radius,
    consensus_update,
    edge_weight,
    metropolis_weights,
    mix,
    one_minus_alpha,
    optimistic_keep,
    pair_parameters,
    small_component,
)
from desim.topologies.graph import Graph


def test_confidence_radius_by_hand():
    # n = 2, σ² = 1, γ = 1/2: √((2/2)(1 + 1/2) ln(√3/(1/2))) = √(1.5 ln 3.4641…) = 1.36517…
    assert confidence_radius(2.0, 1.0, 0.5) == pytest.approx(1.365167, abs=1e-6)
    # σ² scales the radius by σ; n < 2: no radius at all
    r = confidence_radius(np.array([1.0, 2.0]), np.array([1.0, 4.0]), 0.5)
    assert r[0] == math.inf and r[1] == pytest.approx(2 * 1.365167, abs=1e-6)


def test_optimistic_distance_keeps_within_the_sum_of_radii():
    # both radii 1.36517 (n = 2, σ² = 1, γ = 1/2): the sum 2.73033
    keep = optimistic_keep(np.array([2.7, 2.8]), 2.0, 2.0, 1.0, 1.0, 0.5)
    assert keep.tolist() == [True, False]
    # a neighbour with a single sample (n_b = 1) has an infinite radius: always kept
    assert optimistic_keep(np.array([1e9]), 2.0, 1.0, 1.0, 1.0, 0.5).tolist() == [True]


def test_bernstein_threshold_by_hand():
    # θ = 2/e: ℓ = ln(2/θ) = 1; n = 10, σ² = 1, β = 1/2
    theta = 2.0 / math.e
    # exact: (βℓ + √(β²ℓ² + 2nσ²ℓ))/n = (0.5 + √(0.25 + 20))/10 = 0.5
    assert bernstein_threshold(10.0, 1.0, 0.5, theta) == pytest.approx(0.5)
    # simple: 2βℓ/n + σ√(2ℓ/n) = 0.1 + √0.2
    simple = bernstein_threshold(10.0, 1.0, 0.5, theta, exact=False)
    assert simple == pytest.approx(0.1 + math.sqrt(0.2))


def test_bernstein_test_is_strict_at_level_theta_over_log():
    # θ_t = θ/ln(n + 1) = 2/e for θ = (2/e) ln 11, n = 10: the threshold 0.5 of above
    theta = 2.0 / math.e * math.log(11.0)
    diff = np.array([0.49, 0.5 + 1e-9, 0.99])
    assert bernstein_keep(diff, 10.0, 1.0, 0.5, theta).tolist() == [True, False, False]
    assert bernstein_keep(diff, 10.0, 1.0, 0.5, theta, scale=2.0).tolist() == [True, True, True]


def test_pair_parameters_by_hand():
    # no noise: k = 2 terms, σ_ab² = 1 + 3, β_ab = √2 max(0.1, 0.2, 1, √3) = √6
    s2, beta = pair_parameters(1.0, 3.0, 0.1, 0.2, 1.0, math.sqrt(3.0), 0.0)
    assert s2 == 4.0 and beta == pytest.approx(math.sqrt(6.0))
    # σ_DP² = 8 (σ_DP = 2√2 dominates): k = 4 terms, β_ab = 2 · 2√2
    s2, beta = pair_parameters(9.0, 9.0, 0.1, 0.1, 1.0, 1.0, 8.0)
    assert s2 == 18.0 and beta == pytest.approx(4.0 * math.sqrt(2.0))
    # arrays: the same element-wise
    one = np.array([1.0])
    s2, beta = pair_parameters(one, 3 * one, 0.1 * one, 0.2 * one, one, math.sqrt(3) * one, 0.0)
    np.testing.assert_allclose(beta, [math.sqrt(6.0)])


def test_metropolis_weights_on_a_path():
    # 0 − 1 − 2, all kept: |C| = (1, 2, 1), every W_ab = 1/(1 + 2), W_aa = (2/3, 1/3, 2/3)
    g = Graph.from_edges(3, np.array([0, 1]), np.array([1, 2]))
    w, w_aa = metropolis_weights(g, np.ones(g.n_directed, dtype=bool))
    np.testing.assert_allclose(w, [1 / 3] * 4)
    np.testing.assert_allclose(w_aa, [2 / 3, 1 / 3, 2 / 3])
    # 1 drops 2 (and 2 drops 1): |C| = (1, 1, 0), W_01 = W_10 = 1/2, agent 2 alone
    kept = (g.src + g.dst) == 1
    w, w_aa = metropolis_weights(g, kept)
    np.testing.assert_allclose(w[kept], [0.5, 0.5])
    np.testing.assert_allclose(w_aa, [0.5, 0.5, 1.0])
    np.testing.assert_allclose(edge_weight(np.array([0, 3]), np.array([2.0, 1.0])), [1 / 3, 1 / 4])


def test_alpha_schedule_by_hand():
    age = np.array([1.0, 2.0, 4.0])
    np.testing.assert_allclose(one_minus_alpha(age), [1.0, 0.5, 0.25])  # 1 − α = 1/s
    # c = 1/2, p = 1/2: min(1, 0.5/√s), and α = 0 at age 1 whatever c
    np.testing.assert_allclose(one_minus_alpha(age, 0.5, 0.5), [1.0, 0.5 / math.sqrt(2), 0.25])


def test_mix_and_update_by_hand():
    # agent 0 mixes Y_1 with W = 1/2; agent 1 nobody; agent 2 Y_0 and Y_1 with W = 1/4 each
    y = np.array([1.0, 2.0, 3.0])
    counts = np.array([1, 0, 2])
    nb_y = np.array([2.0, 1.0, 2.0])
    w = np.array([0.5, 0.25, 0.25])
    rows, starts = counts > 0, np.array([0, 1])
    mixed = mix(y, nb_y, w, counts, rows, starts)
    np.testing.assert_allclose(mixed, [1.5, 2.0, 3.0 - 0.5 - 0.25])
    # (W Y)_2 = W_22 Y_2 + W_20 Y_0 + W_21 Y_1 = 0.5·3 + 0.25·1 + 0.25·2
    assert mixed[2] == pytest.approx(0.5 * 3 + 0.25 * 1 + 0.25 * 2)
    # nobody mixes: W = I
    np.testing.assert_array_equal(mix(y, y[:0], 0.0, np.zeros(3, int), counts < 0, starts[:0]), y)
    # Y = (1 − α) X̃ + α W Y: α = 0 takes X̃, α = 3/4 mostly W Y
    out = consensus_update(np.array([1.0, 1.0]), np.array([3.0, 5.0]), np.array([1.0, 0.25]))
    np.testing.assert_allclose(out, [1.0, 0.25 + 0.75 * 5.0])


def test_fallback_when_the_component_seems_one_or_two_agents():
    # nobody kept; one kept who keeps only a; one kept who keeps two; two kept
    size = np.array([0, 1, 1, 2])
    told = np.array([0, 1, 2, 1])
    assert small_component(size, told).tolist() == [True, True, False, False]
