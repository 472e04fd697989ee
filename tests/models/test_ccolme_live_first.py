"""C-ColME's live-first state sends (ideal links, irrevocable decisions) against the per-edge
path: the same results bit for bit, and messages that carry exactly the values the per-edge
send gives on every edge still tested (NaN on the others)."""

from __future__ import annotations

import numpy as np
import pytest
from _ccolme_helpers import GraphData, protocol, regular
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.engine import Simulation
from desim.kernel.messages import Batch
from desim.kernel.randomness import Streams
from desim.kernel.registry import PROTOCOLS
from desim.models.ccolme import edges, live_first
from desim.models.ccolme.edges import EdgeStates
from desim.models.ccolme.live_first import LiveFirst
from desim.topologies.graph import Graph


def per_edge(base: type) -> type:
    """`base` with live-first sends turned off: states gathered and held on every edge."""

    class PerEdge(base):
        def setup(self, ctx):
            super().setup(ctx)
            self.states = EdgeStates(self.graph.n_directed)

    return PerEdge


def checked(base: type) -> type:
    """`base` checking every state send it receives against a direct computation."""

    class Checked(base):
        def setup(self, ctx):
            super().setup(ctx)
            self.sends = 0
            self.compactions = 0
            self.last_set = self.states.s

        def on_deliver(self, batch: Batch) -> None:
            if batch.single_kind == 0:  # states: delivered at once, before the slot moved on
                self.check_states(batch)
            super().on_deliver(batch)

        def check_states(self, batch: Batch) -> None:
            g, e = self.graph, self.graph.n_directed
            s = self.states.s
            assert isinstance(self.states, LiveFirst) and len(batch) == e  # every edge gets one
            # one message per directed edge: b = src of the message tells a = dst, slot (a, b)
            slot = np.searchsorted(g.src * g.n + g.dst, batch.dst * g.n + batch.src)
            np.testing.assert_array_equal(np.sort(slot), np.arange(e))
            np.testing.assert_array_equal(g.src[slot], batch.dst)
            np.testing.assert_array_equal(g.dst[slot], batch.src)
            valued = np.zeros(e, dtype=bool)
            valued[s] = True
            rows = valued[slot]
            # S holds every edge still tested, and S comes first
            assert not (self.chi & ~valued).any()
            assert rows[: len(s)].all() and not rows[len(s) :].any()
            x, n, y = batch.payload[:, 0], batch.payload[:, 1], batch.payload[:, 2]
            mean = self.priv_sum / self.t
            np.testing.assert_array_equal(x[rows], mean[g.dst[slot[rows]]])
            np.testing.assert_array_equal(y[rows], self.y[g.dst[slot[rows]]])
            assert (n[rows] == self.t).all()
            assert np.isnan(batch.payload[~rows]).all()
            self.sends += 1
            if len(s) != len(self.last_set):
                assert len(s) < len(self.last_set)
                self.compactions += 1
                self.last_set = s

    return Checked


def run(cls: type, params: dict, data: GraphData, t_max: int, seed: int):
    proto = protocol(cls=cls, **params)
    sim = Simulation(
        proto,
        data,
        t_max,
        Streams(seed, 0, 5, 6),
        per_agent=True,
        checkpoints=np.arange(1, t_max + 1),
    )
    return proto, sim, sim.run()


def assert_same_run(params: dict, data: GraphData, t_max: int, seed: int, name: str):
    base = PROTOCOLS.get(name)
    live, sim_live, out_live = run(checked(base), params, data, t_max, seed)
    ref, sim_ref, out_ref = run(per_edge(base), params, data, t_max, seed)
    assert isinstance(live.states, LiveFirst) and isinstance(ref.states, EdgeStates)
    assert live.sends == (t_max if live.graph.n_directed else 0)  # none without links
    assert out_live.metrics.to_csv().encode() == out_ref.metrics.to_csv().encode()
    assert out_live.agents.to_csv().encode() == out_ref.agents.to_csv().encode()
    for attr in ("y", "chi", "their_chi", "kept", "size", "start", "estimates"):
        a, b = getattr(live, attr), getattr(ref, attr)
        np.testing.assert_array_equal(
            a() if callable(a) else a, b() if callable(b) else b, err_msg=attr
        )
    np.testing.assert_array_equal(sim_live.network.sent, sim_ref.network.sent)
    # the per-edge arrays made from the sends: equal wherever a value was sent
    for attr in ("nb_x", "nb_y", "nb_x_prev", "nb_n"):
        a, b = getattr(live, attr), getattr(ref, attr)
        sent = ~np.isnan(a)
        assert sent[live.chi].all(), attr
        np.testing.assert_array_equal(a[sent], b[sent], err_msg=attr)
    return live


def random_graph(n: int, p: float, rng: np.random.Generator) -> Graph:
    u, v = np.triu_indices(n, k=1)
    pick = rng.random(len(u)) < p
    return Graph.from_edges(n, u[pick], v[pick])


def live_first_sends_reproduce_the_per_edge_path_bit_for_bit(
    n, p, k, name, rule, symmetric, values, weights, fallback, epsilon, seed
):
    """On a random graph and any parameter set, live-first sends give the per-edge path's bytes."""
    rng = np.random.default_rng(seed)
    g = random_graph(n, p, rng)
    # classes far apart (in σ): cross-class links are dropped within the run
    data = GraphData(g, rng.integers(0, k, n), [0.0, 2.0, 4.0][:k], sigma=0.5)
    params = {
        "rule": rule,
        "decisions": "irrevocable",
        "initial": "all",
        "symmetric": symmetric,
        "values": values,
        "weights": weights,
        "fallback": fallback,
        "epsilon": epsilon,
    }
    assert_same_run(params, data, 40, seed, name)


LIVE_FIRST_CASES = given(
    n=st.integers(4, 40),
    p=st.floats(0.1, 0.9),
    k=st.integers(1, 3),
    name=st.sampled_from(["c-colme", "private-c-colme"]),
    rule=st.sampled_from(["optimistic", "bernstein", "oracle"]),
    symmetric=st.booleans(),
    values=st.sampled_from(["fresh", "stale"]),
    weights=st.sampled_from(["metropolis", "max-degree"]),
    fallback=st.sampled_from(["none", "local"]),
    epsilon=st.sampled_from([float("inf"), 8.0]),
    seed=st.integers(0, 10**6),
)
# A few cases in the default set, the full count in the slow set.
test_live_first_sends_reproduce_the_per_edge_path_bit_for_bit = settings(
    max_examples=15, deadline=None
)(LIVE_FIRST_CASES(live_first_sends_reproduce_the_per_edge_path_bit_for_bit))
test_live_first_sends_reproduce_the_per_edge_path_bit_for_bit_more_cases = pytest.mark.slow(
    settings(max_examples=60, deadline=None)(
        LIVE_FIRST_CASES(live_first_sends_reproduce_the_per_edge_path_bit_for_bit)
    )
)


@pytest.mark.slow
def test_live_first_compacts_and_stays_exact_on_a_large_regular_graph():
    """Many drops over the run: S is compacted several times, the results do not move."""
    g = regular(600, 10, seed=3)
    classes = np.arange(600) % 2
    data = GraphData(g, classes, [0.0, 1.0], sigma=1.0)
    live = assert_same_run({}, data, 250, 7, "c-colme")
    assert live.compactions >= 2
    assert len(live.states.s) < g.n_directed
    # every edge left out of S is dropped for good, and links between classes are gone
    left_out = np.ones(g.n_directed, dtype=bool)
    left_out[live.states.s] = False
    assert not live.chi[left_out].any()
    assert (classes[g.src] != classes[g.dst])[left_out].all()


def test_states_gathered_by_block_of_senders_are_the_same_bit_for_bit(monkeypatch):
    """Large graphs gather X̃_b and Y_b block of senders by block: forced on a small graph,
    with blocks of 4 agents, the run is the per-edge path's, bit for bit, through compactions
    (each makes the gather anew for the smaller S)."""
    monkeypatch.setattr(live_first, "BLOCKED_FROM", 0)
    monkeypatch.setattr(edges, "BLOCK_BITS", 2)
    g = regular(60, 6, seed=4)
    data = GraphData(g, np.arange(60) % 2, [0.0, 1.0], sigma=0.3)
    live = assert_same_run({}, data, 60, 5, "c-colme")
    assert live.compactions >= 1
    assert live.states.blocked is not None and live.states.blocked[0] == live.states.version


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 3000),
    k=st.integers(0, 5000),
    bits=st.integers(0, 12),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_blocked_take_is_np_take(n, k, bits, seed):
    """`BlockedTake` gives the values `np.take` gives, bit for bit (NaN and −0.0 included),
    whatever the blocks: one, many, or more than 256 (wider keys)."""
    rng = np.random.default_rng(seed)
    index = rng.integers(0, n, k)
    values = rng.standard_normal(n)
    values[rng.integers(0, n, 3)] = [np.nan, -0.0, np.inf]
    out = np.full(k, 7.0)
    got = edges.BlockedTake(index, n, bits).take(values, out)
    assert got is out
    assert np.array_equal(out.view(np.int64), values[index].view(np.int64))


@pytest.mark.parametrize(
    ("name", "params"),
    [("c-colme", {}), ("private-c-colme", {"epsilon": 5.0}), ("c-colme", {"values": "fresh"})],
)
def test_the_test_in_cache_sized_pieces_is_the_same_bit_for_bit(monkeypatch, name, params):
    """Large graphs test their edges a chunk at a time: forced on a small graph with chunks
    that split S and agents' rows, the run is the one tested over whole arrays, bit for bit."""
    from desim.models.ccolme import protocol as ccolme_protocol

    g = regular(60, 6, seed=4)
    data = GraphData(g, np.arange(60) % 2, [0.0, 1.0], sigma=0.3)
    cls = PROTOCOLS.get(name)
    whole = run(cls, params, data, 60, 5)[2]
    monkeypatch.setattr(ccolme_protocol, "CHUNK", 7)
    pieces = run(cls, params, data, 60, 5)[2]
    assert pieces.metrics.to_csv().encode() == whole.metrics.to_csv().encode()
    assert pieces.agents.to_csv().encode() == whole.agents.to_csv().encode()


@pytest.mark.parametrize("device", ["copied", "reversed"])
def test_a_state_send_copied_stays_live_first_one_reordered_falls_back(device):
    """A state send whose arrays the network copied is still the send as sent: live-first goes
    on. One that arrives reordered (ideal links never do that) is looked up edge by edge and the
    protocol holds per-edge arrays from then on. The same results either way."""
    base = PROTOCOLS.get("c-colme")

    class Moved(base):
        def on_deliver(self, batch: Batch) -> None:
            if batch.single_kind == 0 and self.t == 120:
                assert isinstance(self.states, LiveFirst)
                assert len(self.states.s) < self.graph.n_directed
                order = np.arange(len(batch))
                batch = batch.select(order if device == "copied" else order[::-1])
            super().on_deliver(batch)

    g = regular(200, 6, seed=1)
    data = GraphData(g, np.arange(200) % 2, [0.0, 1.5], sigma=1.0)
    live, sim_live, out_live = run(Moved, {}, data, 200, 4)
    ref, sim_ref, out_ref = run(per_edge(base), {}, data, 200, 4)
    assert isinstance(live.states, LiveFirst) == (device == "copied")
    assert out_live.metrics.to_csv().encode() == out_ref.metrics.to_csv().encode()
    assert out_live.agents.to_csv().encode() == out_ref.agents.to_csv().encode()
    np.testing.assert_array_equal(live.kept, ref.kept)
    np.testing.assert_array_equal(live.y, ref.y)
