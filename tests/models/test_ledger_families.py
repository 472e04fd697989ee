"""The privacy ledger and tight calibration beyond Private-ColME (issue 13): Private-C-ColME's
per-sample Laplace, PriCER's pairwise (ε_ij, δ_ij) constraints and its ledger."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest

import desim
from desim.kernel.engine import Simulation
from desim.kernel.links import Connectivity
from desim.kernel.params import build
from desim.kernel.randomness import Streams
from desim.kernel.registry import METRICS, PROTOCOLS, TOPOLOGIES
from desim.models.pricer import optimiser as po
from desim.models.pricer.data import VectorData
from desim.models.pricer.protocol import Pricer, PricerParams
from desim.models.privacy.accounting import pld_epsilon, tight_multiplier
from desim.testing import Zeros

PRIVACY = METRICS.get("privacy")


def test_c_colme_laplace_is_already_tight_and_its_ledger_is_one_release():
    """b = 2L/ε is exactly ε-DP (the accountant at δ → 0), 0.99·b is not; every sample is one
    release, so one neighbour and all colluding learn the same ε."""
    for eps in (1.0, 2.0):
        assert pld_epsilon("laplace", 1 / eps, 1, 1e-12) == pytest.approx(eps, rel=1e-6)
        assert pld_epsilon("laplace", 0.99 / eps, 1, 1e-12) > eps
    graph = TOPOLOGIES.get("regular")(degree=3).make(10, np.random.default_rng(0))
    data = Zeros(10)
    data.public = {"L": 1.0, "sigma2": np.ones(10), "graph": graph}
    cls = PROTOCOLS.get("private-c-colme")
    proto = cls(build(cls.Params, {"epsilon": 2.0}, "test"))
    out = Simulation(
        proto, data, 5, Streams(0, 0, 1, 2), checkpoints=np.arange(1, 6), metrics=[PRIVACY]
    ).run()
    wide = out.metrics.pivot(index="t", columns="metric", values="value")
    for col in ("eps_one_max", "eps_one_mean", "eps_all_max", "eps_all_mean"):
        np.testing.assert_allclose(wide[col], 2.0, rtol=1e-6)


def problem(calibration: str, eps_low: float = 0.5) -> po.Problem:
    n = 6
    eye = np.eye(n, dtype=bool)
    conn = Connectivity(np.full(n, 0.7), np.where(eye, 1.0, 0.8), np.where(eye, 1.0, 0.64))
    trusted = po.trust_matrix("ring", n, 1)
    return po.Problem(
        conn, po.epsilon_matrix(trusted, 1e3, eps_low), np.full((n, n), 1e-3), 1.0, 1, calibration
    )


def test_pricer_tight_box_is_the_accountant_s_exact_edge():
    """With tight calibration α_ij = c_ij σ is exactly the accountant's (ε_ij, δ_ij) edge: the
    closed-form ε there is at most ε_ij and within the PLD grid of it. Against the classical
    bound the box widens for ε_ij = 0.5 and narrows for the trusted ε_ij = 10³, where Thm. 4.1's
    formula (a theorem for ε ≤ 1 only) understates the noise: its edge spends ε ≈ 3.6·10⁴."""
    tight, paper = problem("tight"), problem("paper")
    sigma = 3.0
    A = np.where(tight.conn.P > 0, tight.slope * sigma, 0.0)
    levels = po.privacy_levels(tight, A, sigma)
    link = tight.conn.P > 0
    assert np.all(levels[link] <= tight.epsilon[link] * (1 + 1e-12))
    low, high = link & (tight.epsilon == 0.5), link & (tight.epsilon == 1e3)
    np.testing.assert_allclose(levels[low], 0.5, rtol=2e-3)
    np.testing.assert_allclose(levels[high], 1e3, rtol=1e-6)  # exact closed form above ε = 10
    ratio = math.sqrt(2 * math.log(1.25e3)) / 0.5 / tight_multiplier("gaussian", 0.5, 1e-3)
    np.testing.assert_allclose(tight.slope[low] / paper.slope[low], ratio, rtol=1e-12)
    assert ratio > 1.6 and np.all(tight.slope[high] < 0.2 * paper.slope[high])
    edge = np.where(link, paper.slope * sigma, 0.0)
    assert po.privacy_levels(tight, edge, sigma)[high].min() > 3e4
    sol = po.optimise(tight, L1=200, L2=200)
    assert sol.report.privacy_excess <= 1e-9 and sol.report.bias <= 1e-9


def test_pricer_ledger_is_the_pairwise_levels_composed_over_rounds():
    """Against a neighbour: r rounds of α_ij x_i + n_ij; the most exposed neighbour's ε equals
    the optimiser's privacy level composed r times (Gaussian: multiplier / √r)."""
    n, t_max = 5, 4
    data = VectorData(agents=n, dimension=3, radius=1.0, distribution="normal").make(
        np.random.default_rng(1)
    )
    links = build(
        desim.network_models.links.BernoulliLinks, {"p_server": 0.8, "p_link": 0.7}, "network"
    )
    proto = Pricer(
        build(
            PricerParams,
            {"trust": "ring", "trusted": 1, "epsilon_low": 0.5, "calibration": "tight"},
            "pricer",
        )
    )
    out = Simulation(
        proto,
        data,
        t_max,
        Streams(0, 0, 1, 2),
        links=links,
        checkpoints=np.arange(1, t_max + 1),
        metrics=[PRIVACY],
    ).run()
    wide = out.metrics.pivot(index="t", columns="metric", values="value")
    A, sigma, delta = proto.A, proto.sigma, 1e-3
    others = np.where(proto.conn.P > 0, A, 0.0)
    np.fill_diagonal(others, 0.0)
    for r in range(1, t_max + 1):
        mult = sigma / (2 * others.max(axis=1))
        eps = [dp_accounting.get_epsilon_gaussian(m / math.sqrt(r), delta) for m in mult]
        assert wide.loc[r, "eps_neighbour_max"] == pytest.approx(max(eps), rel=1e-9)
        server = sigma / (2 * np.sqrt((np.where(proto.conn.P > 0, A, 0.0) ** 2).sum(axis=1)))
        eps = [dp_accounting.get_epsilon_gaussian(m / math.sqrt(r), delta) for m in server]
        assert wide.loc[r, "eps_server_mean"] == pytest.approx(np.mean(eps), rel=1e-9)
    # one round against one neighbour: the optimiser's own levels, within every ε_ij
    levels = po.privacy_levels(
        po.Problem(
            proto.conn, proto.solution and _eps(proto), np.full((n, n), delta), 1.0, 3, "tight"
        ),
        A,
        sigma,
    )
    np.fill_diagonal(levels, 0.0)
    assert wide.loc[1, "eps_neighbour_max"] == pytest.approx(levels.max(), rel=1e-9)


def _eps(proto: Pricer) -> np.ndarray:
    trusted = po.trust_matrix("ring", len(proto.A), 1)
    return po.epsilon_matrix(trusted, 1e3, 0.5)


def test_colrel_has_no_ledger():
    data = VectorData(agents=4, dimension=2, radius=1.0).make(np.random.default_rng(0))
    proto = Pricer(build(PricerParams, {"strategy": "colrel"}, "pricer"))
    out = Simulation(proto, data, 2, Streams(0, 0, 1, 2), metrics=[PRIVACY]).run()
    assert not out.metrics.metric.str.startswith("eps_").any()
