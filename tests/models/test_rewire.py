"""C-ColME and Private-C-ColME on a graph that changes during a run
(`desim.models.ccolme.rewire`): no change gives the static bytes, the neighbour sets follow
the new graph, and the mixing stays a valid averaging."""

from __future__ import annotations

import numpy as np
import pytest
from _ccolme_helpers import GraphData, Switches
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.engine import Simulation
from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.study.scenario import Scenario, run
from desim.topologies.dynamic import Dynamics, Rewire, difference
from desim.topologies.generators import RandomRegular
from desim.topologies.graph import Graph

load_plugins()

PROTOCOLS = ("c-colme", "private-c-colme")


def scenario(protocol: str, topology: dict, **kw) -> Scenario:
    """A small run of `protocol` on 40 agents."""
    return Scenario(
        protocol=protocol,
        data={"model": "classes", "agents": 40},
        t_max=150,
        seed=11,
        checkpoints=8,
        topology=topology,
        **kw,
    )


def values(s: Scenario) -> np.ndarray:
    """Every recorded metric value of a run, in record order."""
    return run(s).metrics["value"].to_numpy()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_rewiring_that_moves_no_link_gives_the_static_bytes(protocol):
    static = {"model": "regular", "degree": 4}
    tiny = {**static, "rewire": {"every": 10, "fraction": 1e-9}}  # round(q·|E|) = 0
    assert np.array_equal(values(scenario(protocol, static)), values(scenario(protocol, tiny)))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_sequence_of_the_same_graph_gives_the_static_bytes(tmp_path, protocol):
    g = RandomRegular(degree=4).make(40, np.random.default_rng(3))
    u, v = g.links()
    (tmp_path / "g.edges").write_text("".join(f"{a} {b}\n" for a, b in zip(u, v, strict=True)))
    static = {"model": "file", "path": "g.edges"}
    seq = {**static, "sequence": [{"at": 30, "file": "g.edges"}, {"at": 77, "file": "g.edges"}]}
    folder = str(tmp_path)
    a = values(scenario(protocol, static, folder=folder))
    b = values(scenario(protocol, seq, folder=folder))
    assert np.array_equal(a, b)


class Switch:
    """A schedule that switches once, before slot `at`, to `graph` (the engine's interface)."""

    def __init__(self, old: Graph, graph: Graph, at: int) -> None:
        self.times = np.array([at])
        self._change = (graph, *difference(old, graph))

    def change(self, t: int):
        """The switch."""
        return self._change


def simulate(protocol: str, graphs_of, n: int = 30, t_max: int = 60, **params):
    """Run `protocol` by the engine on a regular graph whose schedule `graphs_of(G)` makes;
    returns the protocol after the run."""
    from desim.kernel.registry import PROTOCOLS as REGISTRY

    g = RandomRegular(degree=4).make(n, np.random.default_rng(0))
    classes = np.arange(n) % 2
    data = GraphData(g, classes, [0.0, 1.0], sigma=0.5)
    cls = REGISTRY.get(protocol)
    proto = cls(cls.Params(**params))
    streams = Streams(5, 0, 1, 2)
    Simulation(proto, data, t_max, streams, graphs=graphs_of(g, streams)).run()
    return proto


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_after_a_switch_the_neighbour_sets_are_those_of_the_new_graph(protocol):
    g2 = RandomRegular(degree=4).make(30, np.random.default_rng(9))
    proto = simulate(protocol, lambda g, _: Switch(g, g2, 40), rule="oracle")
    a, b, kept = proto.neighbour_decisions()
    assert np.array_equal(a, g2.src) and np.array_equal(b, g2.dst)  # N_a of G2, every a
    classes = np.arange(30) % 2
    assert np.array_equal(kept, classes[a] == classes[b])  # C_a: same-class neighbours in G2
    w = proto.mixing_matrix().tocoo()
    off = w.row != w.col
    linked = set(zip(g2.src.tolist(), g2.dst.tolist(), strict=True))
    assert set(zip(w.row[off].tolist(), w.col[off].tolist(), strict=True)) <= linked


@settings(max_examples=12, deadline=None)
@given(
    protocol=st.sampled_from(PROTOCOLS),
    every=st.integers(1, 9),
    fraction=st.floats(0.05, 1.0),
    seed=st.integers(0, 2**16),
)
def test_mixing_stays_an_averaging_after_every_rewiring(protocol, every, fraction, seed):
    def schedule(g, streams):
        def rng():
            return np.random.default_rng(seed)

        return Dynamics(rewire=Rewire(every=every, fraction=fraction)).schedule(g, 36, rng)

    # t_max = 36 is a multiple of every k ≤ 9 but 5 and 7: the last step follows a change or two
    proto = simulate(protocol, schedule, n=20, t_max=36)
    w = proto.mixing_matrix().toarray()
    assert (w >= -1e-15).all()
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    g = proto.graph
    off = w - np.diag(np.diag(w))
    adjacency = g.adjacency().toarray() > 0
    assert not off[~adjacency].any()  # mixes only over links of the graph in force
    if proto.params.symmetric:  # symmetric decisions: W symmetric, doubly stochastic
        np.testing.assert_allclose(w, w.T, rtol=0, atol=1e-15)


def _path4(edges: list[tuple[int, int]]) -> Graph:
    u, v = np.array(edges).T
    return Graph.from_edges(4, u, v)


def _over_delayed_links(protocol: str, graphs: list[Graph], at: list[int], delay: float):
    """`protocol` on the path 0–1–2–3 switching to `graphs` before the slots `at`, every
    message taking `delay` slots; returns the protocol after 20 slots."""
    from desim.kernel.registry import PROTOCOLS as REGISTRY
    from desim.testing import ScriptedLinks

    g1 = _path4([(0, 1), (1, 2), (2, 3)])
    data = GraphData(g1, [0, 0, 1, 1], [0.0, 1.0], sigma=0.5)
    cls = REGISTRY.get(protocol)
    proto = cls(cls.Params())
    links = ScriptedLinks(delay=lambda rng, t, n: np.full(n, delay))
    schedule = Switches(g1, graphs, at)
    Simulation(proto, data, 20, Streams(5, 0, 1, 2), links=links, graphs=schedule).run()
    return proto


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_states_in_flight_on_a_dropped_link_are_lost_at_delivery(protocol):
    """Messages take 1.4 slots; 0–1 is dropped before slot 10: the states 0 and 1 sent each
    other in slot 9 are in flight then, and dropped on arrival (those of slot 8 arrived)."""
    g2 = _path4([(0, 2), (1, 2), (2, 3)])
    proto = _over_delayed_links(protocol, [g2], [10], 1.4)
    assert proto.in_flight.lost[0] == 2  # [state, decision, size]
    a, b, _ = proto.neighbour_decisions()
    assert set(zip(a.tolist(), b.tolist(), strict=True)) == set(
        zip(g2.src.tolist(), g2.dst.tolist(), strict=True)
    )
    assert np.isfinite(proto.estimates()).all()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_messages_of_a_links_earlier_incarnation_are_lost(protocol):
    """Messages take 2.4 slots; 0–1 is dropped (0–2 made) before slot 10 and made again (0–2
    dropped) before 11. On 0–1 the states of slot 8 arrive at 10.4 (link gone) and those of
    slot 9 at 11.4, sent before the link was made again; on 0–2 those of slot 10 arrive at
    12.4 (link gone): all six are dropped, and 0–1's first state is of slot 11."""
    g1 = _path4([(0, 1), (1, 2), (2, 3)])
    g2 = _path4([(0, 2), (1, 2), (2, 3)])
    proto = _over_delayed_links(protocol, [g2, g1], [10, 11], 2.4)
    assert proto.in_flight.lost[0] == 6
    e = int(np.flatnonzero((proto.graph.src == 0) & (proto.graph.dst == 1))[0])
    # the newest state of 1 that 0 holds: of slot 18 (18 + 2.4 < 21, the end)
    assert proto.nb_n[e] == 18
