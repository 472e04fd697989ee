"""Bernoulli intermittent links, deadlines (`Context.call_at`) and the parameter server."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from desim.kernel.engine import Simulation
from desim.kernel.links import Connectivity, IdealLinks, counter_uniform
from desim.kernel.params import ConfigError, build
from desim.kernel.protocol import Context, Protocol
from desim.kernel.randomness import Streams
from desim.kernel.server import ParameterServer, Round, RoundCollector, server_address, tag
from desim.network_models.links import (
    BernoulliLinks,
    FixedLatency,
    IntermittentLinks,
    reciprocity_matrix,
)
from desim.testing import Zeros


def _links(p, P, rho, seed=0):
    P = np.asarray(P, dtype=float)
    conn = Connectivity(np.asarray(p, dtype=float), P, reciprocity_matrix(P, rho))
    return IntermittentLinks(conn, rho), np.random.default_rng(seed)


def test_counter_uniform_is_uniform_and_depends_only_on_key_and_counter():
    u = counter_uniform(np.uint64(7), np.arange(200_000))
    assert 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / len(u))
    assert np.histogram(u, bins=10, range=(0, 1))[0].min() > 19_000
    again = counter_uniform(np.uint64(7), np.arange(200_000)[::-1])[::-1]
    assert np.array_equal(u, again)
    assert not np.array_equal(u, counter_uniform(np.uint64(8), np.arange(200_000)))


@pytest.mark.parametrize("rho", [0.0, 0.4, 1.0])
def test_link_rates_and_reciprocity_match_p_P_and_E(rho):
    p = [0.3, 0.9, 0.5]
    P = [[1, 0.7, 0.2], [0.4, 1, 0.9], [0.6, 0.9, 1]]
    links, rng = _links(p, P, rho)
    slots = 20_000
    s = np.repeat(np.arange(slots), 6)
    src = np.tile([0, 1, 0, 2, 1, 2], slots)
    dst = np.tile([1, 0, 2, 0, 2, 1], slots)
    tau = links.realise(rng, s, src, dst).reshape(slots, 6)
    P = np.asarray(P)
    for k, (i, j) in enumerate(zip([0, 1, 0, 2, 1, 2], [1, 0, 2, 0, 2, 1], strict=True)):
        se = np.sqrt(P[i, j] * (1 - P[i, j]) / slots)
        assert abs(tau[:, k].mean() - P[i, j]) < 5 * se
    E = links.conn.E
    for a, b in ((0, 1), (2, 3), (4, 5)):
        i, j = [0, 0, 1][a // 2], [1, 2, 2][a // 2]
        joint = (tau[:, a] & tau[:, b]).mean()
        assert abs(joint - E[i, j]) < 5 * np.sqrt(E[i, j] * (1 - E[i, j]) / slots) + 1e-12
    # distinct unordered pairs are independent
    both = (tau[:, 0] & tau[:, 2]).mean()
    assert abs(both - P[0, 1] * P[0, 2]) < 5 * np.sqrt(0.25 / slots)
    # server uplinks: Ber(p_i), address n
    up = links.realise(rng, s[::2], np.tile(np.arange(3), slots), np.full(3 * slots, 3))
    up = up.reshape(slots, 3)
    assert np.all(np.abs(up.mean(axis=0) - p) < 5 * np.sqrt(0.25 / slots))


def test_one_realisation_per_slot_and_link_and_fresh_draws_across_slots():
    links, rng = _links([0.5, 0.5], [[1, 0.5], [0.5, 1]], 0.0)
    src, dst = np.array([0, 0, 0, 1]), np.array([1, 1, 1, 0])
    for slot in range(50):
        tau = links.available(rng, slot + 0.25, src, dst)
        assert tau[0] == tau[1] == tau[2]
        assert tau[0] == links.available(rng, slot + 0.75, src[:1], dst[:1])[0]
    seq = [bool(links.available(rng, float(t), src[:1], dst[:1])[0]) for t in range(400)]
    assert 150 < sum(seq) < 250
    # the server's downlink and a node to itself are always up
    assert links.available(rng, 3.0, np.array([2, 0]), np.array([0, 0])).all()


def test_the_links_stream_fixes_the_realisation():
    a, _ = _links([0.5] * 4, np.full((4, 4), 0.5) + 0.5 * np.eye(4), 0.5)
    b, _ = _links([0.5] * 4, np.full((4, 4), 0.5) + 0.5 * np.eye(4), 0.5)
    src, dst = np.repeat(np.arange(4), 5), np.tile(np.arange(5), 4)
    ra = [a.realise(np.random.default_rng(3), t, src, dst) for t in range(20)]
    rb = [b.realise(np.random.default_rng(3), t, src, dst) for t in range(20)]
    assert all(np.array_equal(x, y) for x, y in zip(ra, rb, strict=True))


def test_reciprocity_interpolates_between_independent_and_reciprocal():
    P = np.array([[1, 0.3], [0.8, 1]])
    assert reciprocity_matrix(P, 0)[0, 1] == pytest.approx(0.24)
    assert reciprocity_matrix(P, 1)[0, 1] == pytest.approx(0.3)
    assert reciprocity_matrix(P, 0.5)[1, 0] == pytest.approx(0.27)
    with pytest.raises(ValueError, match="reciprocity"):
        reciprocity_matrix(P, 1.5)


def test_connectivity_rejects_invalid_probabilities():
    P = np.array([[1, 0.5], [0.5, 1]])
    with pytest.raises(ValueError, match="p_ii must be 1"):
        Connectivity(np.ones(2), np.full((2, 2), 0.5), np.full((2, 2), 0.25))
    with pytest.raises(ValueError, match=r"\[p_ij p_ji, min"):
        Connectivity(np.ones(2), P, np.array([[1, 0.9], [0.9, 1]]))
    with pytest.raises(ValueError, match="lie in"):
        Connectivity(np.array([1.2, 0.5]), P, reciprocity_matrix(P, 0))


@dataclass
class _Graph:
    src: np.ndarray
    dst: np.ndarray
    positions: np.ndarray | None = None


def test_bernoulli_params_build_p_and_P_from_good_nodes_graph_and_distance():
    links = build(
        BernoulliLinks,
        {"good": 2, "p_good": 0.9, "p_bad": 0.2, "p_link": 0.8, "reciprocity": 1.0},
        "network",
    )
    ring = _Graph(np.array([0, 1, 1, 2, 2, 3, 3, 0]), np.array([1, 0, 2, 1, 3, 2, 0, 3]))
    bound = links.bind(4, {"graph": ring}, Streams(0, 0, 0, 0))
    conn = bound.probabilities(4)
    assert np.array_equal(conn.p, [0.9, 0.9, 0.2, 0.2])
    assert conn.P[0, 1] == 0.8 and conn.P[0, 2] == 0 and np.all(np.diag(conn.P) == 1)
    assert np.allclose(conn.E, np.minimum(conn.P, conn.P.T))
    complete = links.probabilities(3)  # no graph: every pair linked (the paper's ER set-up)
    assert np.all(complete.P[~np.eye(3, dtype=bool)] == 0.8)
    geo = _Graph(np.array([0, 1]), np.array([1, 0]), np.array([[0, 0], [0.3, 0.4]]))
    far = build(BernoulliLinks, {"p_link": 1.0, "decay": 0.5}, "network").connectivity(2, geo)
    assert far.P[0, 1] == pytest.approx(np.exp(-1.0))
    explicit = build(
        BernoulliLinks,
        {"p_server": [0.1, 1.0], "p_nodes": [[0, 0.3], [0.6, 0]], "reciprocity": 0.0},
        "network",
    ).connectivity(2)
    assert np.array_equal(explicit.P, [[1, 0.3], [0.6, 1]]) and explicit.E[0, 1] == 0.18


def test_bernoulli_params_report_bad_input_in_one_line():
    with pytest.raises(ConfigError, match="reciprocity = 2"):
        build(BernoulliLinks, {"reciprocity": 2}, "network")
    with pytest.raises(ConfigError, match="square"):
        build(BernoulliLinks, {"p_nodes": [[1, 0.5]]}, "network")
    with pytest.raises(ValueError, match="p_server has 2 values; the data have 3"):
        build(BernoulliLinks, {"p_server": [0.5, 0.5]}, "network").connectivity(3)
    with pytest.raises(ValueError, match="good = 5"):
        build(BernoulliLinks, {"good": 5}, "network").connectivity(3)
    with pytest.raises(RuntimeError, match="bound"):
        BernoulliLinks().available(np.random.default_rng(0), 1.0, np.zeros(1), np.ones(1))


def test_links_that_never_fail_report_probability_one():
    for links in (IdealLinks(), FixedLatency(2.0)):
        conn = links.probabilities(3)
        assert np.all(conn.p == 1) and np.all(conn.P == 1) and np.all(conn.E == 1)


# ---- deadlines and the parameter server -------------------------------------------------------


@dataclass(frozen=True)
class _NoParams:
    deadline: float = 0.0


class _Uplink(Protocol):
    """Every node sends (round, node id) to the server each slot; the server logs each round."""

    Params = _NoParams
    message_kinds = ("up",)

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self.closed: list[tuple[float, int, list[int]]] = []
        self.server = ParameterServer(ctx, "up", 1, self._close)

    def _close(self, r: Round) -> None:
        self.closed.append((self.ctx.now(), r.r, sorted(r.src.tolist())))

    def on_samples(self, t: int, samples: np.ndarray) -> None:
        n = self.ctx.n_agents
        self.server.open(t, self.ctx.now() + self.params.deadline)
        self.ctx.send(
            "up", np.arange(n), np.full(n, server_address(n)), tag(t, np.arange(n, dtype=float))
        )

    def on_deliver(self, batch) -> None:
        self.server.receive(batch)

    def estimates(self) -> np.ndarray:
        return np.zeros(self.ctx.n_agents)


def _run(links, deadline=0.0, t_max=40, n=4):
    proto = _Uplink(_NoParams(deadline))
    sim = Simulation(
        proto, Zeros(n), t_max, Streams(1, 0, 1, 2), links=links, checkpoints=np.array([t_max])
    )
    out = sim.run()
    return proto, out


def test_a_zero_deadline_closes_after_the_instants_deliveries_and_before_the_recorder():
    proto, _ = _run(IdealLinks(), t_max=3)
    assert proto.closed == [(1, 1, [0, 1, 2, 3]), (2, 2, [0, 1, 2, 3]), (3, 3, [0, 1, 2, 3])]
    assert proto.server.late == 0


def test_the_server_receives_what_the_uplinks_let_through():
    links = build(BernoulliLinks, {"p_server": [0.0, 0.5, 1.0, 1.0]}, "network")
    proto, out = _run(links, t_max=400)
    got = np.zeros(4)
    for _, _, src in proto.closed:
        got[src] += 1
    assert got[0] == 0 and got[2] == got[3] == 400 and 150 < got[1] < 250
    dropped = out.metrics.query("metric == 'dropped_up'")["value"].iloc[-1]
    assert dropped == 1600 - got.sum()


def test_messages_after_the_deadline_are_late_and_counted():
    proto, _ = _run(FixedLatency(2.0), deadline=1.0, t_max=5)
    assert all(src == [] for _, _, src in proto.closed)
    assert proto.server.late == 4 * 3  # rounds 1–3 arrive (late) within the horizon
    proto, _ = _run(FixedLatency(2.0), deadline=2.0, t_max=5)
    assert [c[2] for c in proto.closed] == [[0, 1, 2, 3]] * 3


def test_a_collector_refuses_a_round_opened_twice_and_needs_timers():
    ctx = Context(
        2, 1, {}, Streams(0, 0, 0, 0), lambda *a: None, lambda: 0.0, call_at=lambda when, fn: None
    )
    col = RoundCollector(ctx, "x", 1, lambda r: None)
    col.open(1, 0.0)
    with pytest.raises(ValueError, match="already open"):
        col.open(1, 0.0)
    bare = Context(2, 1, {}, Streams(0, 0, 0, 0), lambda *a: None, lambda: 0.0)
    with pytest.raises(ValueError, match="timers"):
        RoundCollector(bare, "x", 1, lambda r: None)
