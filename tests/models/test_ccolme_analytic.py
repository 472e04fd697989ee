"""Closed forms of the consensus family, the curves and the metrics, against simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

import desim
from desim.kernel.params import build
from desim.kernel.protocol import Protocol
from desim.kernel.registry import CURVES, DATA, METRICS, TOPOLOGIES
from desim.models.ccolme.analytic import (
    component_average,
    consensus_mse_exact,
    corollary1_rhs,
    harmonic_factor,
    privacy_threshold,
    variance_factor,
)
from desim.study.scenario import Scenario
from desim.topologies.graph import Graph

T = np.array([1, 2, 5, 10, 100, 1000, 5000])


def test_variance_factor_of_1_over_t_is_2t_minus_harmonic_over_t2():
    np.testing.assert_allclose(variance_factor(T), harmonic_factor(T), rtol=1e-12)
    assert variance_factor(np.array([1]))[0] == 1.0  # α_1 = 0: Y = X̃ at t = 1


def test_variance_factor_limits_c_over_t_and_sqrt():
    big = np.array([200_000])
    c = 2.0  # (c/(c−1))² (1 − 2/c + 1/(2c−1)) = 4/3 for c = 2 (docs/papers.md §2.4)
    theory = (c / (c - 1)) ** 2 * (1 - 2 / c + 1 / (2 * c - 1))
    assert variance_factor(big, c, 1.0)[0] * big[0] == pytest.approx(theory, rel=1e-3)
    assert variance_factor(big, 1.0, 0.5)[0] * big[0] == pytest.approx(1.0, abs=5e-3)


def test_exact_mse_of_one_agent_is_the_variance_factor():
    np.testing.assert_allclose(
        consensus_mse_exact(np.eye(1), np.array([3.0]), 50),
        3.0 * variance_factor(np.arange(1, 51)),
        rtol=1e-12,
    )


def test_exact_mse_with_averaging_matrix_is_the_component_mean_plus_a_small_rest():
    n, t = 8, 400
    exact = consensus_mse_exact(np.full((n, n), 1 / n), np.ones(n), t)
    lead = variance_factor(np.arange(1, t + 1)) / n
    assert np.all(exact >= lead - 1e-15)
    assert exact[-1] == pytest.approx(lead[-1], rel=n / t**2 * 10 + 1e-9)


def test_component_average_and_corollary1_with_equal_variances():
    labels = np.array([0, 0, 0, 1, 2, 2])
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 7.0])
    assert component_average(labels, x) == pytest.approx((2.0 + 4.0 + 6.0) / 6)
    assert component_average(labels + 10, x) == component_average(labels, x)  # any labels
    m, k = 6, 3
    assert corollary1_rhs(labels, 0.25) == pytest.approx(0.25 * (m / (2 * k) - 1))
    assert privacy_threshold(-0.1, 1.0) == math.inf
    assert privacy_threshold(2.0, 1.0) == pytest.approx(2.0)


def data_params(agents=60, **kw):
    return build(DATA.get("classes"), {"agents": agents, **kw}, "data")


def sim_final(protocol, params, data, topology, t_max, reps, metric="mse"):
    values = []
    for r in range(reps):
        out = desim.run(
            Scenario(
                protocol,
                params,
                data,
                t_max=t_max,
                seed=3,
                replicate=r,
                topology=topology,
                checkpoints=2,
            )
        )
        m = out.metrics
        values.append(m[(m.metric == metric) & (m.t == t_max)].value.iloc[0])
    return np.array(values)


@pytest.mark.slow
def test_ideal_component_protocol_matches_the_prop2_curve():
    topo = {"model": "regular", "degree": 3}
    data = {"model": "classes", "agents": 60}
    t_max = 100
    sim = sim_final("ideal-component", {}, data, topo, t_max, reps=60)
    curve = build(CURVES.get("ideal-component"), {"topology": topo, "draws": 400}, "curve")
    mean, se = curve.curve(np.array([t_max]), data_params())
    total_se = math.sqrt(sim.var(ddof=1) / len(sim) + se[0] ** 2)
    assert abs(sim.mean() - mean[0]) < 4 * total_se


@pytest.mark.slow
def test_consensus_oracle_curve_predicts_the_oracle_rule_with_fallback():
    """Private-C-ColME with oracle decisions and the fallback against Theorem 1's leading term
    (the lower-order rest is a few per cent here: the tolerance adds 5 % of the curve)."""
    topo = {"model": "regular", "degree": 6}
    data = {"model": "classes", "agents": 60, "class_means": [0.0, 1.0]}
    t_max, eps = 1500, 4.0
    sim = sim_final(
        "private-c-colme", {"rule": "oracle", "epsilon": eps}, data, topo, t_max, reps=16
    )
    curve = build(
        CURVES.get("consensus-oracle"),
        {"topology": topo, "epsilon": eps, "fallback": "local", "draws": 300},
        "c",
    )
    mean, se = curve.curve(np.array([t_max]), data_params(class_means=[0.0, 1.0]))
    total_se = math.sqrt(sim.var(ddof=1) / len(sim) + se[0] ** 2)
    assert abs(sim.mean() - mean[0]) < 4 * total_se + 0.05 * mean[0], (sim.mean(), mean)


def test_metrics_compare_exposed_state_with_the_truth():
    class P:
        sigma2_dp = 0.5

        def estimates(self):
            return np.array([0.0, 0.05, 0.3, 1.0])

        def neighbour_decisions(self):
            src, dst = g.src, g.dst
            return src, dst, np.ones(len(src), dtype=bool)

    g = Graph.from_edges(4, [0, 1, 2], [1, 2, 3])  # path; classes 0 0 1 1
    data = type("D", (), {})()
    data.means, data.classes = np.array([0.0, 0.0, 1.0, 1.0]), np.array([0, 0, 1, 1])
    data.public = {"graph": g, "sigma2": np.full(4, 0.25), "L": 0.5 * math.sqrt(3)}
    acc = METRICS.get("accuracy")(P(), data)
    assert acc == {"within_0.1": 0.75, "outside_0.1": 0.25}
    assert METRICS.get("links")(P(), data) == {"wrong_kept": 2.0, "wrong_dropped": 0.0}
    cor = METRICS.get("corollary1")(P(), data)
    assert cor["class_components"] == 2 and cor["small_share"] == 1.0
    assert cor["cor1_rhs"] == pytest.approx(0.25 * (4 / 4 - 1))
    assert cor["cor1_holds"] == 0.0 and cor["cor1_sigma2_dp"] == 0.5
    assert METRICS.get("links")(Protocol(None), data) == {}  # nothing exposed: nothing measured


def test_corollary1_follows_changed_classes_variances_and_graphs():
    """The graph's part of the bound is kept between checkpoints, never past a change."""
    cor1 = METRICS.get("corollary1")
    g = Graph.from_edges(6, [0, 1, 2, 3, 4], [1, 2, 3, 4, 5])  # a path
    data = type("D", (), {})()
    data.classes = np.array([0, 0, 0, 1, 1, 1])
    data.public = {"graph": g, "sigma2": np.full(6, 0.25), "L": 1.0}
    proto = Protocol(None)
    first = cor1(proto, data)
    assert first["class_components"] == 2 and first["cor1_rhs"] == pytest.approx(0.25 * 0.5)
    assert cor1(proto, data) == first
    data.classes = np.array([0, 1, 0, 1, 0, 1])  # every link across classes: 6 components
    assert cor1(proto, data)["class_components"] == 6
    data.classes[:] = [0, 0, 1, 1, 2, 2]  # the same array, changed in place: 3 components
    assert cor1(proto, data)["class_components"] == 3
    data.public["sigma2"] = np.full(6, 2.0)  # σ²(M/(2K) − 1) with K = 2 again
    data.classes[:] = [0, 0, 0, 1, 1, 1]
    assert cor1(proto, data)["cor1_rhs"] == pytest.approx(2.0 * 0.5)
    data.public["graph"] = Graph.from_edges(6, [0, 2, 4], [1, 3, 5])  # three pairs, one across
    assert cor1(proto, data)["class_components"] == 4
    data.public["graph"] = Graph.from_edges(6, [0, 1, 4], [1, 2, 5])  # 3 stays alone
    assert cor1(proto, data)["class_components"] == 3


def test_curves_reject_a_study_without_topology():
    curve = build(CURVES.get("ideal-component"), {}, "curve")
    with pytest.raises(ValueError, match="needs the study's \\[topology\\]"):
        curve.curve(np.array([1.0, 2.0]), data_params())
    assert "regular" in TOPOLOGIES
