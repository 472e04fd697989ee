"""PriCER as a simulated protocol (seed 004 Algs. 1–2): unbiased, below the Thm. 3.2 bound, equal
to its exact expected MSE, ColRel at σ = 0, naive as printed; vector data; deadlines."""

from __future__ import annotations

import numpy as np
import pytest
from _pricer_helpers import NETWORK, Logged

import desim
from desim.kernel.engine import Simulation
from desim.kernel.params import build
from desim.kernel.randomness import Streams
from desim.kernel.registry import METRICS
from desim.models.pricer import optimiser as po
from desim.models.pricer.data import VectorData
from desim.models.pricer.protocol import PricerParams, pricer_metrics

N, D = 5, 8


def simulate(t_max=3000, network=None, seed=3, **params):
    """Run `Logged` on fixed vectors; the same seed gives the same links, noise and data."""
    data = VectorData(agents=N, dimension=D, radius=2.0, distribution="normal").make(
        np.random.default_rng(11)
    )
    links = build(desim.network_models.links.BernoulliLinks, network or NETWORK, "network")
    proto = Logged(
        build(PricerParams, {"epsilon_low": 2.0, "trust": "ring", "trusted": 1, **params}, "pricer")
    )
    sim = Simulation(
        proto, data, t_max, Streams(seed, 0, 1, 2), links=links, checkpoints=np.array([t_max])
    )
    sim.run()
    return proto, data, np.array(proto.rounds)


@pytest.mark.slow
def test_pricer_is_unbiased_and_its_mse_is_its_expectation_below_the_bound():
    proto, data, est = simulate()
    assert proto.sigma > 0 and len(est) == 3000
    truth = data.x.mean(axis=0)
    z = (est.mean(axis=0) - truth) / (est.std(axis=0, ddof=1) / np.sqrt(len(est)))
    assert np.abs(z).max() < 4.5  # every coordinate of x̄ within its standard error
    err = ((est - truth) ** 2).sum(axis=1)
    se = err.std(ddof=1) / np.sqrt(len(err))
    expected = po.expected_mse(proto.conn, proto.A, proto.sigma, data.x)
    bound = po.worst_case_mse(proto.conn, proto.A, proto.sigma, 2.0, D)
    assert abs(err.mean() - expected) < 4 * se
    assert err.mean() + 4 * se < bound  # Thm. 3.2 (the data are not all equal: strictly below)
    assert bound == pytest.approx(proto.solution.objective, rel=1e-10)


@pytest.mark.slow
def test_colrel_is_unbiased_without_noise_and_naive_is_biased_as_printed():
    proto, data, est = simulate(t_max=2000, strategy="colrel")
    assert proto.sigma == 0
    truth = data.x.mean(axis=0)
    z = (est.mean(axis=0) - truth) / (est.std(axis=0, ddof=1) / np.sqrt(len(est)))
    assert np.abs(z).max() < 4.5
    proto, data, est = simulate(t_max=2000, strategy="naive")
    p = np.array(NETWORK["p_server"])
    biased = (p[:, None] * data.x).mean(axis=0)  # E[(1/n) Σ τ_i x_i]
    z = (est.mean(axis=0) - biased) / (est.std(axis=0, ddof=1) / np.sqrt(len(est)))
    assert np.abs(z).max() < 4.5
    err = ((est - truth) ** 2).sum(axis=1)
    expected = po.expected_mse(proto.conn, np.eye(N), 0.0, data.x)
    assert abs(err.mean() - expected) < 4 * err.std(ddof=1) / np.sqrt(len(err))


def test_sigma_zero_is_colrel():
    """Without privacy constraints PriCER's optimum has σ = 0 and relays exactly like ColRel."""
    free, data, a = simulate(t_max=50, epsilon_high=float("inf"), epsilon_low=float("inf"))
    colrel, _, b = simulate(t_max=50, strategy="colrel")
    assert free.sigma == 0
    assert np.allclose(free.A, colrel.A, rtol=1e-6, atol=1e-9)
    assert np.allclose(a, b, rtol=1e-6, atol=1e-9)  # the same link realisations, no noise


def test_shares_are_privatised_with_gaussian_noise_of_the_optimised_sigma():
    proto, data, _ = simulate(t_max=1)
    sent: list[np.ndarray] = []
    send = proto.ctx.send
    proto.ctx.send = lambda kind, src, dst, payload: (
        sent.append((kind, src, dst, payload)) or send(kind, src, dst, payload)
    )
    for t in range(2, 60):
        proto.on_samples(t, data.x)
    shares = [(s, d_, pl) for kind, s, d_, pl in sent if kind == "share"]
    noise = np.concatenate(
        [pl[:, 1:] - proto.A[s, d_][:, None] * data.x[s] for s, d_, pl in shares]
    )
    assert noise.std() == pytest.approx(proto.sigma, rel=0.05)
    assert abs(noise.mean()) < 4 * proto.sigma / np.sqrt(noise.size)


def test_latency_past_the_deadline_loses_the_round_and_matching_deadlines_recover_it():
    slow = {**NETWORK, "slots": 1.0}
    proto, _, est = simulate(t_max=20, network=slow)
    assert np.all(est == 0) and proto.stage1.late > 0  # every share arrives a slot late
    proto, data, est = simulate(t_max=400, network=slow, relay_deadline=1.0, server_deadline=1.0)
    assert len(est) == 398  # round r closes at r + 2
    truth = data.x.mean(axis=0)
    err = ((est - truth) ** 2).sum(axis=1).mean()
    assert err < 3 * po.expected_mse(proto.conn, proto.A, proto.sigma, data.x)


def test_vector_data_are_bounded_fixed_and_shared():
    spec = VectorData(agents=6, dimension=50, radius=3.0)
    a = spec.make(np.random.default_rng(1))
    norms = np.linalg.norm(a.x, axis=1)
    assert norms.max() == pytest.approx(3.0) and norms.min() < 3.0
    each = VectorData(agents=6, dimension=50, radius=3.0, normalise="each").draw(
        np.random.default_rng(1)
    )
    assert np.allclose(np.linalg.norm(each, axis=1), 3.0)
    block = a.sample(np.random.default_rng(0), 1024)
    assert block.shape == (1024, 6, 50) and np.shares_memory(block, a.x)
    assert np.allclose(a.means, a.x.mean(axis=0))
    assert np.array_equal(spec.draw(np.random.default_rng(1)), a.x)
    # N(0,1)³ is heavy tailed: its kurtosis far exceeds the normal's 3
    z = spec.draw(np.random.default_rng(2)).ravel()
    assert np.mean(z**4) / np.mean(z**2) ** 2 > 10


def test_a_scenario_records_mse_and_the_pricer_metrics_reproducibly():
    s = desim.Scenario(
        "pricer",
        {"strategy": "pricer"},
        data={"model": "vectors", "agents": 6, "dimension": 20},
        network={"links": "bernoulli", "good": 2, "p_link": 0.8},
        t_max=30,
        seed=5,
        metrics=("pricer",),
    )
    a, b = desim.run(s).metrics, desim.run(s).metrics
    assert a.equals(b)
    names = set(a["metric"])
    assert {"mse", "bound", "expected_mse", "sigma", "messages_share", "dropped_relay"} <= names
    last = a[a["t"] == 30].set_index("metric")["value"]
    assert last["expected_mse"] < last["bound"]
    assert METRICS.get("pricer") is pricer_metrics


def test_pricer_metrics_ignore_other_protocols_and_pricer_needs_vector_data():
    assert pricer_metrics(object(), None) == {}  # type: ignore[arg-type]
    s = desim.Scenario("pricer", {}, t_max=2)
    with pytest.raises(ValueError, match="vector data"):
        desim.run(s)


def simulate_late(effective: bool, t_max=2000):
    """PriCER over Bernoulli links plus exponential latency (mean 1) and one-slot deadlines."""
    from desim.network_models.realistic import realistic_links

    data = VectorData(agents=N, dimension=D, radius=2.0, distribution="normal").make(
        np.random.default_rng(11)
    )
    base = build(desim.network_models.links.BernoulliLinks, NETWORK, "network")
    links = realistic_links(
        base, {"latency": {"model": "exponential", "mean": 1.0, "resolution": 0.5}}
    )
    proto = Logged(
        build(
            PricerParams,
            {
                "epsilon_low": 2.0,
                "trust": "ring",
                "trusted": 1,
                "relay_deadline": 1.0,
                "server_deadline": 1.0,
                "effective": effective,
            },
            "pricer",
        )
    )
    sim = Simulation(
        proto, data, t_max, Streams(5, 0, 1, 2), links=links, checkpoints=np.array([t_max])
    )
    sim.run()
    return proto, data, np.array(proto.rounds)


@pytest.mark.slow
def test_relays_that_miss_a_deadline_are_lost_as_the_effective_probabilities_say():
    """A share or relay arrives in time with F(1) = 1 − e^(−1) (deadlines on the 0.5 grid), so
    the effective p_ij, p_i are the nominal ones times F, and the simulated MSE is the exact
    expectation at those probabilities, whichever probabilities the optimiser designed for."""
    f = 1.0 - np.exp(-1.0)
    nominal, data, est = simulate_late(effective=False)
    conn, eff = nominal.conn, nominal.effective_conn
    assert eff.p == pytest.approx(conn.p * f)
    off = ~np.eye(N, dtype=bool)
    assert eff.P[off] == pytest.approx(conn.P[off] * f)
    assert eff.E[off] == pytest.approx(conn.E[off] * f * f)  # independent delays each way
    truth = data.x.mean(axis=0)
    designed, _, designed_est = simulate_late(effective=True)
    assert designed.conn is designed.effective_conn
    for name, (proto, rounds) in {
        "nominal": (nominal, est),
        "effective": (designed, designed_est),
    }.items():
        err = ((rounds[2:] - truth) ** 2).sum(axis=1)  # rounds 1–2 close after they start
        se = err.std(ddof=1) / np.sqrt(len(err))
        expected = po.expected_mse(proto.effective_conn, proto.A, proto.sigma, data.x)
        assert abs(err.mean() - expected) < 4 * se, name
        assert pricer_metrics(proto, data)["expected_mse"] == pytest.approx(expected)
