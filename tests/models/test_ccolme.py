"""C-ColME and Private-C-ColME: mixing matrices, consensus against the exact closed form,
the privacy boundary, the options' semantics and the errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _ccolme_helpers import Driver, GraphData, protocol, regular
from hypothesis import given, settings
from hypothesis import strategies as st

import desim
from desim.kernel.engine import Simulation
from desim.kernel.params import ConfigError, build
from desim.kernel.protocol import DataSource
from desim.kernel.randomness import Streams
from desim.models.ccolme.analytic import consensus_mse_exact
from desim.models.ccolme.protocol import CColME, CColMEParams, PrivateCColMEParams
from desim.study.scenario import Scenario
from desim.topologies.graph import Graph


def simulate(proto: CColME, data: DataSource, t_max: int, seed: int = 0, checkpoints=None):
    sim = Simulation(proto, data, t_max, Streams(seed, 0, 11, 22), checkpoints=checkpoints)
    return sim.run()


def disjoint_copies(g: Graph, k: int) -> Graph:
    """k disjoint copies of g (component c holds agents c·n … c·n + n − 1)."""
    u, v = g.links()
    offs = np.repeat(np.arange(k) * g.n, len(u))
    return Graph.from_edges(k * g.n, np.tile(u, k) + offs, np.tile(v, k) + offs)


# --------------------------------------------------------------------------------------------
# mixing matrices


class RandomDecisions(CColME):
    """C-ColME whose neighbour test is a coin flip (any decisions at all), checking W and Y."""

    keep_p = 0.5

    def _rule(self, e):
        return self.coin.random(len(self.nb_x[e])) < self.keep_p

    def _update(self):
        y_old, x_priv = self.y.copy(), self.priv_sum / self.t
        age = (self.t - self.start).astype(float)  # a galante restart comes after the step
        super()._update()
        w = self.mixing_matrix().toarray()
        assert np.all(w >= -1e-15)
        np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
        if self.params.symmetric:
            np.testing.assert_array_equal(w, w.T)
            np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-12)
        # the step really is Y = (1−α) X̃ + α W Y_old
        oma = np.where(age <= 1, 1.0, np.minimum(1.0, self.params.alpha_c / age))
        np.testing.assert_allclose(self.y, oma * x_priv + (1 - oma) * (w @ y_old), atol=1e-12)
        self.checked += 1


@given(
    n=st.integers(3, 30),
    r=st.integers(1, 6),
    keep=st.floats(0.05, 0.95),
    symmetric=st.booleans(),
    weights=st.sampled_from(["metropolis", "max-degree"]),
    decisions=st.sampled_from(["retest", "irrevocable"]),
    seed=st.integers(0, 10**6),
)
@settings(max_examples=40, deadline=None)
def test_mixing_matrix_doubly_stochastic_and_symmetric_for_any_decisions(
    n, r, keep, symmetric, weights, decisions, seed
):
    if r >= n or r * n % 2:
        r = 2 if n > 2 else 1
    g = regular(n, r, seed) if r * n % 2 == 0 else regular(n + 1, r, seed)
    proto = protocol(
        cls=RandomDecisions,
        symmetric=symmetric,
        weights=weights,
        decisions=decisions,
        restart="hard",
        epsilon=2.0,
    )
    proto.coin, proto.keep_p, proto.checked = np.random.default_rng(seed), keep, 0
    simulate(proto, GraphData(g, np.zeros(g.n, int), [0.0]), t_max=12, seed=seed)
    assert proto.checked == 12


# --------------------------------------------------------------------------------------------
# consensus against the exact closed form (docs/papers.md §2.4)

K_COPIES, N, R, T = 400, 12, 4, 2000


@pytest.mark.slow
@pytest.mark.parametrize("alpha_p, factor, tolerance", [(1.0, 2.0, 0.01), (0.5, 1.0, 0.05)])
def test_consensus_reaches_2x_ideal_with_1_over_t_and_1x_with_sqrt(alpha_p, factor, tolerance):
    """Oracle neighbours, no privacy, one connected class component (many independent copies).

    The exact expected MSE of this W and schedule is within `tolerance` of factor × ideal
    σ²/(n t) at T (2 − H_T/T for 1/t; the t^(−1/2) schedule approaches 1 from above), and the
    simulation matches it within 4 standard errors of the mean over the K independent copies.
    """
    comp = regular(N, R, seed=3)
    assert comp.n_components == 1
    g = disjoint_copies(comp, K_COPIES)
    classes = np.repeat(np.arange(K_COPIES), N)
    proto = protocol(rule="oracle", epsilon=math.inf, fallback="none", alpha_p=alpha_p)
    simulate(
        proto, GraphData(g, classes, np.zeros(K_COPIES)), t_max=T, seed=7, checkpoints=np.array([T])
    )
    err2 = (proto.estimates() ** 2).reshape(K_COPIES, N).mean(axis=1)  # per component
    w = protocol(rule="oracle")  # W of one component: every neighbour kept
    w.graph = comp
    ideal = 1.0 / (N * T)
    kept = np.ones(comp.n_directed, bool)
    from desim.models.ccolme.protocol import metropolis_weights

    we, waa = metropolis_weights(comp, kept)
    wm = np.diag(waa)
    wm[comp.src, comp.dst] = we
    exact = consensus_mse_exact(wm, np.ones(N), T, 1.0, alpha_p)[-1]
    assert abs(exact / ideal - factor) < tolerance * factor
    se = err2.std(ddof=1) / math.sqrt(K_COPIES)
    assert abs(err2.mean() - exact) < 4 * se, (err2.mean() / ideal, exact / ideal, se / ideal)


# --------------------------------------------------------------------------------------------
# privacy


@pytest.mark.parametrize("rule", ["bernstein", "optimistic"])
def test_only_privatised_values_leave_an_agent(rule):
    """Two runs with different raw data but the same privatised samples send the same bytes."""
    g = regular(30, 4, seed=1)
    data = GraphData(g, np.arange(30) % 3, [0.2, 0.4, 0.8], sigma=0.5, distribution="uniform")
    rng = np.random.default_rng(0)
    private = [data.means + rng.uniform(-1.5, 1.5, 30) for _ in range(60)]
    runs = []
    for shift in (0.0, 0.37):
        proto = protocol(rule=rule, epsilon=1.0)
        stream = iter(private)
        proto.privatise = lambda x, s=stream: next(s)  # X + Z, whatever X is
        d = Driver(proto, data)
        for t in range(1, 61):
            d.slot(t, data.means + shift + 0.1 * np.sin(t))  # raw samples differ between runs
        runs.append((d.sent, proto))
    (sent_a, proto_a), (sent_b, proto_b) = runs
    assert [k for k, *_ in sent_a] == [k for k, *_ in sent_b]
    assert {k for k, *_ in sent_a} == {"state", "decision", "size"}
    for (_, sa, da, pa), (_, sb, db, pb) in zip(sent_a, sent_b, strict=True):
        np.testing.assert_array_equal(sa, sb)
        np.testing.assert_array_equal(da, db)
        assert pa.tobytes() == pb.tobytes()
    # the raw data changed nothing but the raw sums (used only for an agent's own fallback)
    assert not np.array_equal(proto_a.raw_sum, proto_b.raw_sum)
    np.testing.assert_array_equal(proto_a.y, proto_b.y)
    np.testing.assert_array_equal(proto_a.kept, proto_b.kept)


def test_laplace_noise_per_sample_has_variance_8L2_over_eps2():
    g = regular(400, 4)
    data = GraphData(g, np.zeros(400, int), [0.0], sigma=0.5, distribution="uniform")
    proto = protocol(epsilon=2.0)
    Driver(proto, data)
    z = np.concatenate([proto.privatise(np.zeros(400)) for _ in range(50)])
    expect = 8 * data.public["L"] ** 2 / 4.0
    assert proto.sigma2_dp == pytest.approx(expect)
    # Laplace: Var[Z²] = E Z⁴ − σ⁴ = 24 b⁴ − 4 b⁴ = 5 σ⁴
    assert abs(z.var() - expect) < 4 * math.sqrt(5 * expect**2 / len(z))
    none = protocol(epsilon=math.inf)
    Driver(none, data)
    assert none.sigma2_dp == 0.0 and np.array_equal(none.privatise(np.ones(3)), np.ones(3))


# --------------------------------------------------------------------------------------------
# the options


def two_class_line():
    """0–1–2–3 on a path; agents 0, 1 in class 0 (mean 0), agents 2, 3 in class 1 (mean 5)."""
    g = Graph.from_edges(4, [0, 1, 2], [1, 2, 3])
    return g, GraphData(g, [0, 0, 1, 1], [0.0, 5.0], sigma=0.1)


def test_decisions_learn_the_classes_and_report_the_links():
    g, data = two_class_line()
    for name in ("c-colme", "private-c-colme"):
        proto = protocol(name, epsilon=math.inf)
        simulate(proto, data, 200)
        a, b, kept = proto.neighbour_decisions()
        np.testing.assert_array_equal(kept, data.classes[a] == data.classes[b])


def test_irrevocable_never_re_adds_and_retest_does():
    g, data = two_class_line()
    proto = protocol("c-colme", cls=RandomDecisions, decisions="irrevocable")
    proto.coin, proto.keep_p, proto.checked = np.random.default_rng(1), 0.7, 0
    h = np.array(decisions_per_slot(proto, data, 40))
    assert np.all(h[1:] <= h[:-1])  # once dropped, never back
    proto = protocol("c-colme", cls=RandomDecisions, decisions="retest", initial="none")
    proto.coin, proto.keep_p, proto.checked = np.random.default_rng(1), 0.5, 0
    h = np.array(decisions_per_slot(proto, data, 40))
    assert np.any(h[1:] > h[:-1])  # a dropped neighbour came back


def decisions_per_slot(proto: CColME, data: GraphData, t_max: int) -> list[np.ndarray]:
    """b ∈ C_a per directed edge after each slot (`neighbour_decisions`)."""
    d = Driver(proto, data)
    rng = np.random.default_rng(0)
    out = []
    for t in range(1, t_max + 1):
        d.slot(t, data.sample(rng, 1)[0])
        out.append(proto.neighbour_decisions()[2])
    return out


def changed_agents(proto: CColME, before: np.ndarray) -> np.ndarray:
    """The agents whose C_a differs from the decisions `before` (one per directed edge)."""
    a, _, kept = proto.neighbour_decisions()
    return np.bincount(a[kept != before], minlength=proto.graph.n) > 0


def test_hard_restart_sets_y_to_the_private_mean_and_galante_halves_alpha_next_slot():
    """A change at slot t: hard gives α = 0 at t (Y = X̃); galante keeps the old α at t; both
    then run from age 2 (1−α = 1/2) at t + 1."""
    g, data = two_class_line()
    for restart in ("hard", "galante"):
        proto = protocol("c-colme", restart=restart, reset="agent", values="fresh")
        d = Driver(proto, data)
        rng = np.random.default_rng(0)
        for t in range(1, 80):  # at t = 1 every neighbour is kept (β = ∞); the cross link goes
            before = proto.neighbour_decisions()[2]
            d.slot(t, data.means + 0.1 * rng.standard_normal(4))
            changed = changed_agents(proto, before)
            if t > 1 and changed.any():
                break
        assert changed[[1, 2]].all() and 1 < t < 79
        at_private_mean = np.isclose(proto.y, proto.priv_sum / t)[changed]
        assert at_private_mean.all() == (restart == "hard")
        assert np.all((t - proto.start)[changed] == 1)
        y_old, x_next = proto.y.copy(), (proto.priv_sum + data.means) / (t + 1)
        d.slot(t + 1, data.means)
        w = proto.mixing_matrix().toarray()
        expect = 0.5 * x_next + 0.5 * (w @ y_old)  # age 2: 1 − α = 1/2
        np.testing.assert_allclose(proto.y[changed], expect[changed])


def test_global_reset_restarts_everyone_agent_reset_only_the_changed():
    g, data = two_class_line()
    g2 = Graph.from_edges(6, [0, 1, 2, 4], [1, 2, 3, 5])  # plus a separate same-class pair
    data2 = GraphData(g2, [0, 0, 1, 1, 0, 0], [0.0, 5.0], sigma=0.1)
    for reset in ("global", "agent"):
        proto = protocol("c-colme", reset=reset, restart="hard", values="fresh")
        d = Driver(proto, data2)
        for t in range(1, 60):
            before = proto.neighbour_decisions()[2]
            d.slot(t, data2.means)
            changed = changed_agents(proto, before)
            if t > 1 and changed.any():
                break
        assert changed[[1, 2]].all() and not changed[[4, 5]].any()
        restarted = proto.start == t - 1
        assert restarted[[4, 5]].all() == (reset == "global")


def test_fallback_to_the_local_mean_for_components_of_one_or_two():
    # 0–1 a pair, 2 alone (its neighbour 3 is of another class), 3–4–5 a triangle path
    g = Graph.from_edges(6, [0, 2, 3, 4], [1, 3, 4, 5])
    data = GraphData(g, [0, 0, 1, 0, 0, 0], [0.0, 9.0], sigma=0.1)
    proto = protocol(rule="oracle", epsilon=math.inf, fallback="local")
    simulate(proto, data, 30)
    local = proto.raw_sum / proto.t
    est = proto.estimates()
    np.testing.assert_array_equal(est[[0, 1, 2]], local[[0, 1, 2]])
    np.testing.assert_array_equal(est[[3, 4, 5]], proto.y[[3, 4, 5]])
    assert not np.allclose(est[[3, 4, 5]], local[[3, 4, 5]])
    noisy = protocol(rule="oracle", epsilon=1.0, fallback="private-local")
    simulate(noisy, data, 30)
    np.testing.assert_array_equal(
        noisy.estimates()[[0, 1, 2]], (noisy.priv_sum / noisy.t)[[0, 1, 2]]
    )


def test_stale_values_compare_with_the_neighbours_previous_state():
    g, data = two_class_line()
    proto = protocol("c-colme", values="stale", rule="optimistic")
    d = Driver(proto, data)
    for t in range(1, 6):  # the state before the newest is the last slot's (none at t = 1)
        d.slot(t, data.means)
        assert np.all(proto.nb_n == t) and np.all(proto.nb_n_prev == t - 1)


def test_non_ideal_links_use_the_slow_path_and_still_learn():
    g, data = two_class_line()
    s = desim.run(
        Scenario(
            "private-c-colme",
            {"epsilon": math.inf},
            {"model": "classes", "agents": 60, "class_means": [0.0, 3.0], "sigma": 0.5},
            t_max=300,
            seed=2,
            network={"links": "fixed-latency", "slots": 1.0},
            topology={"model": "regular", "degree": 4},
            metrics=("links",),
        )
    )
    last = s.metrics[s.metrics.t == 300].set_index("metric").value
    assert last["wrong_kept"] == 0 and last["wrong_dropped"] == 0


def test_same_seed_same_bytes():
    s = Scenario(
        "private-c-colme",
        {"epsilon": 2.0},
        {"model": "classes", "agents": 40},
        t_max=200,
        seed=4,
        topology={"model": "regular", "degree": 4},
        metrics=("accuracy", "links", "corollary1"),
    )
    a, b = desim.run(s).metrics, desim.run(s).metrics
    assert a.to_csv().encode() == b.to_csv().encode()


# --------------------------------------------------------------------------------------------
# errors


def test_errors_are_one_line():
    with pytest.raises(ValueError, match="needs initial = 'all'"):
        CColMEParams(decisions="irrevocable", initial="none")
    with pytest.raises(ConfigError, match="needs a communication graph"):
        desim.run(Scenario("private-c-colme", {}, {"model": "classes", "agents": 10}))
    with pytest.raises(ConfigError, match="r·M = 33 is odd"):
        desim.run(
            Scenario(
                "c-colme",
                {},
                {"model": "classes", "agents": 11},
                topology={"model": "regular", "degree": 3},
            )
        )
    with pytest.raises(ConfigError, match="rule = 'bernstien'"):
        build(PrivateCColMEParams, {"rule": "bernstien"}, "scenario")
    with pytest.raises(ConfigError, match="unknown metric 'acuracy'.*did you mean 'accuracy'"):
        desim.run(Scenario("local", {}, {"model": "classes", "agents": 10}, metrics=("acuracy",)))
