"""C-ColME under asynchrony: zero-latency paths bit for bit, states exactly L slots old, ages and
max_age, out-of-order messages ignored, mixing matrices, and a lossy, laggy run that still beats
local estimation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from desim.kernel.engine import Simulation
from desim.kernel.links import IdealLinks, LinkModel
from desim.kernel.messages import Batch
from desim.kernel.params import ConfigError, build
from desim.kernel.protocol import Context, DataSource
from desim.kernel.randomness import Streams
from desim.kernel.registry import PROTOCOLS, TOPOLOGIES
from desim.models.ccolme.edges import EdgeSlots
from desim.models.ccolme.metrics import corollary1
from desim.models.ccolme.protocol import CColME, CColMEParams
from desim.models.metrics import accuracy, links
from desim.network_models.links import FixedLatency
from desim.testing import ScriptedLinks
from desim.topologies.graph import Graph


class GraphData(DataSource):
    """Gaussian data on a given graph, one mean per class (`shift` moves chosen agents' data)."""

    def __init__(self, graph: Graph, classes, class_means, sigma=1.0, shift=None):
        self.n_agents = graph.n
        self.classes = np.asarray(classes)
        self.means = np.asarray(class_means, dtype=float)[self.classes]
        self.sigma = sigma
        self.shift = np.zeros(graph.n) if shift is None else np.asarray(shift, dtype=float)
        self.public = {
            "L": 3 * sigma,
            "sigma2": np.full(graph.n, sigma**2),
            "distribution": "gaussian",
            "graph": graph,
        }

    def sample(self, rng, n_slots):
        noise = self.sigma * rng.standard_normal((n_slots, self.n_agents))
        return self.means + self.shift + noise


class PatternData(GraphData):
    """Deterministic samples X_a^(t) = sin(0.7 t + a) + a / 2 (t = 1, 2, …), for hand sums."""

    def __init__(self, graph: Graph) -> None:
        super().__init__(graph, np.zeros(graph.n, int), [0.0])
        self.slots_done = 0

    def sample(self, rng, n_slots):
        t = self.slots_done + 1 + np.arange(n_slots)[:, None]
        self.slots_done += n_slots
        return np.sin(0.7 * t + np.arange(self.n_agents)) + np.arange(self.n_agents) / 2


def protocol(name: str = "c-colme", cls: type | None = None, **params) -> CColME:
    base = PROTOCOLS.get(name)
    cls = cls or base
    return cls(build(base.Params, params, "test"))


def simulate(
    proto: CColME,
    data: DataSource,
    t_max: int,
    links: LinkModel | None = None,
    seed: int = 0,
    metrics=(),
):
    sim = Simulation(
        proto,
        data,
        t_max,
        Streams(seed, 0, 11, 22),
        links=links,
        checkpoints=np.arange(1, t_max + 1),
        per_agent=True,
        metrics=metrics,
    )
    return sim.run()


def path(n: int) -> Graph:
    return Graph.from_edges(n, np.arange(n - 1), np.arange(1, n))


def link_between(a: int, b: int):
    """A `down` mask function for the link a–b (both directions)."""
    return lambda src, dst: ((src == a) & (dst == b)) | ((src == b) & (dst == a))


class Spy:
    """Mix-in recording, at every consensus step, what the agent mixed and held."""

    def _update(self):
        super()._update()
        self.steps.append(
            {
                "t": self.t,
                "W": self.mixing_matrix().toarray(),
                "nb_n": self.nb_n.copy(),
                "nb_n_prev": self.nb_n_prev.copy(),
                "nb_size_at": self.nb_size_at.copy(),
                "kept": self.kept.copy(),
            }
        )


def spied(name="c-colme", **params) -> CColME:
    base = PROTOCOLS.get(name)
    proto = protocol(name, type("Spied", (Spy, base), {}), **params)
    proto.steps = []
    return proto


# --------------------------------------------------------------------------------------------
# zero latency, always up: the synchronous protocol bit for bit, whichever path


class Lookup:
    """Mix-in forcing the general delivery path: every batch is reversed (new arrays, so no
    batch is "as sent" and every edge slot is looked up)."""

    def on_deliver(self, batch):
        super().on_deliver(batch.select(np.arange(len(batch))[::-1]))


OPTIONS = [
    ("c-colme", {}),
    (
        "c-colme",
        {
            "symmetric": True,
            "values": "fresh",
            "restart": "hard",
            "reset": "agent",
            "fallback": "local",
        },
    ),
    ("c-colme", {"decisions": "retest", "initial": "none", "symmetric": True, "max_age": 0}),
    ("private-c-colme", {}),
    (
        "private-c-colme",
        {
            "rule": "optimistic",
            "values": "stale",
            "weights": "max-degree",
            "fallback": "private-local",
            "restart": "galante",
        },
    ),
    ("private-c-colme", {"rule": "oracle", "symmetric": False, "reset": "global"}),
]


def graphs():
    rng = np.random.default_rng(5)
    yield TOPOLOGIES.get("regular")(degree=4).make(60, rng)
    yield TOPOLOGIES.get("erdos-renyi")(p=0.05).make(60, rng)  # isolated agents too


@pytest.mark.parametrize(
    "name, params",
    # the first of each family in the default set, all of them with `-m slow`
    [
        o if o in (OPTIONS[0], OPTIONS[3]) else pytest.param(*o, marks=pytest.mark.slow)
        for o in OPTIONS
    ],
)
def test_zero_latency_always_up_is_bit_identical_to_ideal_links(name, params):
    """Ideal links, fixed latency 0 (the network's non-ideal path) and the protocol's general
    delivery path (lookups, reversed batches) give the same bytes: same operations, same order."""
    for g in graphs():
        data = GraphData(g, np.arange(g.n) % 3, [0.0, 0.6, 1.5], sigma=0.5)
        outs = []
        for cls, links_ in (
            (None, IdealLinks()),
            (None, FixedLatency(slots=0.0)),
            ("lookup", ScriptedLinks()),
        ):
            base = PROTOCOLS.get(name)
            proto = protocol(name, type("L", (Lookup, base), {}) if cls else None, **params)
            out = simulate(proto, data, 80, links_, seed=3, metrics=(links, accuracy))
            m = out.metrics[~out.metrics.metric.str.startswith("dropped_")].reset_index(drop=True)
            if not links_.ideal:
                assert (out.metrics[out.metrics.metric.str.startswith("dropped_")].value == 0).all()
            outs.append(
                (
                    m.to_csv().encode(),
                    out.agents.to_csv().encode(),
                    proto.y.tobytes(),
                    proto.kept.tobytes(),
                )
            )
        assert outs[0] == outs[1] == outs[2]


@pytest.mark.parametrize("table_keys", [1 << 22, 0])  # a direct table, a hash index
def test_edge_slots_are_the_positions_of_the_sorted_edge_keys(monkeypatch, table_keys):
    """The receiver's slot of every directed edge, asked in a shuffled order with repeats, is
    where a binary search of the sorted keys (CSR order) puts it, whichever look-up runs."""
    monkeypatch.setattr("desim.models.ccolme.edges.TABLE_KEYS", table_keys)
    rng = np.random.default_rng(3)
    for g in graphs():
        keys = g.src * g.n + g.dst
        slot_of = EdgeSlots(g.n, keys)
        assert slot_of.direct == (table_keys > 0)
        e = rng.integers(0, len(keys), 3 * len(keys))
        slots = slot_of.find(g.src[e], g.dst[e])
        assert slots.dtype == np.int64
        np.testing.assert_array_equal(slots, e)


# --------------------------------------------------------------------------------------------
# latency: the consensus mixes states exactly ⌈L⌉ slots old


def hand_consensus(data: PatternData, g: Graph, t_max: int, lag: int) -> np.ndarray:
    """Y^(t_max) of C-ColME on a one-class graph (every link kept, Metropolis W, 1−α = 1/t),
    when the state of slot s is used in slot s + lag: Y_a^(t) = X̄_a^(t)/t + (1 − 1/t)
    (Y_a^(t−1) + Σ_b W_ab (Y_b^(t−lag−1) − Y_a^(t−1))), b mixed only once t − lag ≥ 1."""
    x = data.sample(None, t_max)
    data.slots_done = 0
    deg = g.degree
    ys = [np.zeros(g.n)]
    for t in range(1, t_max + 1):
        xbar = x[:t].sum(axis=0) / t
        y = ys[-1]
        mixed = y.copy()
        if t - lag >= 1:
            y_b = ys[t - lag - 1]  # Y_b^(t_b − 1): what b's state of slot t_b = t − lag carries
            for a, b in zip(g.src, g.dst, strict=True):
                mixed[a] += (y_b[b] - y[a]) / (1 + max(deg[a], deg[b]))
        ys.append(xbar / t + (1 - 1 / t) * mixed)
    return ys[-1]


@pytest.mark.parametrize("latency, lag", [(0.0, 0), (1.0, 1), (2.0, 2), (3.0, 3), (1.5, 2)])
def test_fixed_latency_mixes_states_exactly_ceil_L_slots_old(latency, lag):
    """Path 0–1–2 and a star, no privacy, oracle decisions (all kept, no restart): Y after 9 slots
    is the hand recursion with states ⌈L⌉ slots old (a state sent at s arrives at s + L, before
    the deadline of slot s + ⌈L⌉), to rounding."""
    star = Graph.from_edges(4, [0, 0, 0], [1, 2, 3])
    for g in (path(3), star):
        data = PatternData(g)
        expect = hand_consensus(data, g, 9, lag)
        proto = spied(rule="oracle", fallback="none")
        simulate(proto, data, 9, FixedLatency(slots=latency))
        np.testing.assert_allclose(proto.y, expect, rtol=1e-12, atol=0)
        ages = [s["t"] - s["nb_n"] for s in proto.steps if s["t"] > lag]
        assert all(np.all(a == lag) for a in ages)


# --------------------------------------------------------------------------------------------
# ages: links down, max_age


def test_neighbour_behind_a_link_that_is_always_down_is_never_mixed():
    """Path 0–1–2 with 0–1 always down: Y_0 is its own data only and Y_1 ignores agent 0 (the
    same bytes whatever the other side observes), though b stays in C_a (nothing to test on)."""
    g = path(3)
    down = link_between(0, 1)
    runs = []
    for shift in ([0.0, 0.0, 0.0], [0.0, 4.0, 4.0], [4.0, 0.0, 0.0]):
        proto = spied()
        simulate(
            proto,
            GraphData(g, [0, 0, 0], [0.0], shift=shift),
            30,
            ScriptedLinks(down=lambda rng, t, s, d: down(s, d)),
        )
        runs.append(proto)
    same, far1, far0 = runs
    assert same.y[0].tobytes() == far1.y[0].tobytes()
    assert same.y[[1, 2]].tobytes() == far0.y[[1, 2]].tobytes()
    e01 = np.flatnonzero(((g.src == 0) & (g.dst == 1)) | ((g.src == 1) & (g.dst == 0)))
    assert all(
        s["W"][0, 1] == 0 and s["W"][1, 0] == 0 and s["kept"][e01].all() and s["W"][1, 2] > 0
        for s in same.steps
    )


@pytest.mark.parametrize("max_age", [0, 2, 5, math.inf])
def test_max_age_stops_mixing_a_neighbour_silent_for_longer(max_age):
    """Link 0–1 up before slot D = 8, down from then on, zero latency: 0 last hears 1 at slot 7,
    so it mixes 1 exactly while t − 7 ≤ max_age; the link 1–2, always up, is always mixed."""
    g, d = path(3), 8
    down = link_between(0, 1)
    proto = spied(rule="oracle", max_age=max_age)
    simulate(
        proto,
        GraphData(g, [0, 0, 0], [0.0]),
        20,
        ScriptedLinks(down=lambda rng, t, s, dd: down(s, dd) & (t >= d)),
    )
    for s in proto.steps:
        assert (s["W"][0, 1] > 0) == (s["t"] - (min(s["t"], d - 1)) <= max_age), s["t"]
        assert s["W"][1, 2] > 0 and s["W"][2, 1] > 0


def test_max_age_is_validated():
    with pytest.raises(ConfigError, match="max_age"):
        build(CColMEParams, {"max_age": -1.0}, "scenario")


# --------------------------------------------------------------------------------------------
# non-FIFO links: older messages are ignored


def test_states_arriving_out_of_order_are_ignored():
    """A message sent at slot s < K arrives at 2K − s, later ones at once: states reach the agents
    in reverse order (at K + j the states of K + j and K − j arrive together). Every consensus
    step holds the newest state (t_b = t from K on, none before), the one before it for stale
    tests, and at its first deadline the size of the previous slot, not an older one."""
    k = 6
    g = TOPOLOGIES.get("regular")(degree=2).make(8, np.random.default_rng(0))
    reverse = ScriptedLinks(delay=lambda rng, t, n: max(0.0, 2.0 * (k - t)))
    proto = spied(rule="oracle", values="stale")
    at_decided = []
    orig = proto._decided

    def decided():
        at_decided.append((proto.t, proto.nb_size_at.copy()))
        orig()

    proto._decided = decided
    simulate(proto, GraphData(g, np.zeros(8, int), [0.0]), 2 * k + 3, reverse)
    for s in proto.steps:
        t = s["t"]
        assert np.all(s["nb_n"] == (t if t >= k else 0)), t
        assert np.all(s["nb_n_prev"] == (t - 1 if t > k else 0)), t
        assert np.all(s["nb_size_at"] == (t if t >= k else 0)), t
    assert proto.kept.all()  # one class, oracle decisions: sizes on every edge
    for t, size_at in at_decided:
        assert np.all(size_at == (t - 1 if t > k else 0)), t


def test_decisions_and_sizes_older_than_held_are_ignored():
    """Delivered by hand: a newer decision / size then an older one for the same edges, and both
    in one batch in either order: the newer stays (ties by time: the last to arrive)."""
    g = path(3)
    proto = protocol(symmetric=True, decisions="retest", initial="none")
    data = GraphData(g, [0, 0, 0], [0.0])
    proto.setup(
        Context(
            3,
            10,
            dict(data.public),
            Streams(0, 0, 1, 2),
            lambda *a: None,
            lambda: 0.0,
            call_at=lambda when, fn: None,
        )
    )
    kinds = proto.message_kinds
    src, dst = g.dst.copy(), g.src.copy()  # b tells a: filed in a's slot of edge (a, b)

    def deliver(kind, value, at):
        n = len(src)
        payload = np.column_stack([np.full(n, value, dtype=float), np.full(n, float(at))])
        proto.on_deliver(
            Batch(
                src.copy(),
                dst.copy(),
                np.full(n, kinds.index(kind)),
                payload,
                np.zeros(n),
                kinds,
                kinds.index(kind),
            )
        )

    deliver("decision", 1.0, 5)
    deliver("decision", 0.0, 4)
    deliver("size", 7.0, 5)
    deliver("size", 3.0, 4)
    assert proto.their_chi.all() and np.all(proto.nb_size == 7)
    assert np.all(proto.their_chi_at == 5) and np.all(proto.nb_size_at == 5)
    n = len(src)
    for first, second in (((0.0, 6), (1.0, 7)), ((1.0, 9), (0.0, 8)), ((0.0, 10), (1.0, 10))):
        payload = np.array([[first[0], first[1]]] * n + [[second[0], second[1]]] * n)
        code = kinds.index("decision")
        proto.on_deliver(
            Batch(
                np.tile(src, 2),
                np.tile(dst, 2),
                np.full(2 * n, code),
                payload,
                np.zeros(2 * n),
                kinds,
                code,
            )
        )
        assert proto.their_chi.all()
        assert np.all(proto.their_chi_at == max(first[1], second[1]))


# --------------------------------------------------------------------------------------------
# mixing matrices


def test_mixing_matrix_doubly_stochastic_in_sync_and_row_stochastic_under_asynchrony():
    """Symmetric decisions with ideal links: W symmetric, rows and columns sum to 1. With random
    latencies and drops, rows still sum to 1 with W_ab ≥ 0 and W_aa ≥ 1/(1 + |C_a|) (a mixes at
    most its |C_a| kept neighbours, each with weight ≤ 1/(1 + |C_a|)), columns need not."""
    g = TOPOLOGIES.get("regular")(degree=4).make(40, np.random.default_rng(1))
    data = GraphData(g, np.arange(40) % 2, [0.0, 0.8], sigma=0.5)
    laggy = ScriptedLinks(
        down=lambda rng, t, s, d: rng.random(len(s)) < 0.3,
        delay=lambda rng, t, n: rng.integers(0, 4, n).astype(float),
    )
    for links_, sync in ((IdealLinks(), True), (laggy, False)):
        proto = spied("private-c-colme", epsilon=5.0, symmetric=True)
        simulate(proto, data, 60, links_, seed=2)
        asymmetric = 0
        for s in proto.steps:
            w, size = s["W"], np.bincount(g.src[s["kept"]], minlength=40)
            assert np.all(w >= 0)
            np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=0, atol=1e-12)
            assert np.all(np.diag(w) >= 1 / (1 + size) - 1e-15)
            if sync:
                np.testing.assert_array_equal(w, w.T)
                np.testing.assert_allclose(w.sum(axis=0), 1.0, rtol=0, atol=1e-12)
            asymmetric += not np.array_equal(w, w.T)
        assert sync or asymmetric > 0


# --------------------------------------------------------------------------------------------
# a realistic run


@pytest.mark.slow
def test_random_latency_and_drops_still_beat_local_estimation():
    """Two well separated classes (means 0 and 4, σ = 1), 20% drops, latencies of 0 to 4 slots
    in half slots (non-FIFO). Within a class Y_a is a convex combination of privatised running
    means of the class (W row-stochastic), so it is unbiased once the decisions are right, and
    it averages many agents' samples at most a few slots old: its MSE is far below the local
    mean's σ²/T. We require it to be below σ²/T by more than 4 standard errors of the local
    MSE measured on M agents (the squared error of a Gaussian mean has variance 2(σ²/T)²); the
    metrics still read the protocol."""
    m, t_max = 200, 300
    g = TOPOLOGIES.get("regular")(degree=4).make(m, np.random.default_rng(4))
    data = GraphData(g, np.arange(m) % 2, [0.0, 4.0], sigma=1.0)
    laggy = ScriptedLinks(
        down=lambda rng, t, s, d: rng.random(len(s)) < 0.2,
        delay=lambda rng, t, n: rng.integers(0, 9, n) / 2.0,
    )
    proto = protocol("private-c-colme", epsilon=math.inf)
    out = simulate(proto, data, t_max, laggy, seed=6, metrics=(links, accuracy, corollary1))
    last = out.metrics[out.metrics.t == t_max].set_index("metric").value
    local = 1.0 / t_max
    assert math.isfinite(last["mse"])
    assert last["mse"] < local - 4 * local * math.sqrt(2 / m)
    assert last["dropped_state"] > 0
    assert {"wrong_kept", "wrong_dropped", "within_0.1", "cor1_rhs"} <= set(last.index)
