"""B-ColME and Private-B-ColME on a graph that changes during a run
(`desim.models.ccolme.brewire`): no change gives the static bytes, the tables after a change are
the hand-computed ones, the ledger is unchanged, messages in flight on a changed link are lost,
and the ``lost-in-flight`` metric counts them for every protocol that follows a changing graph;
PriCER refuses a changing graph, saying why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _ccolme_helpers import GraphData, Switches
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.engine import Simulation
from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.kernel.registry import METRICS, PROTOCOLS
from desim.study.cli import main
from desim.study.scenario import Scenario, run
from desim.testing import ScriptedLinks
from desim.topologies.dynamic import Dynamics, Rewire, difference, dynamics
from desim.topologies.generators import RandomRegular
from desim.topologies.graph import Graph

load_plugins()

FAMILY = ("b-colme", "private-b-colme")


def scenario(protocol: str, topology: dict, folder: str = "", **kw) -> Scenario:
    """A small run of `protocol` on 40 agents (ε = 5 for the private one)."""
    return Scenario(
        protocol=protocol,
        params={"epsilon": 5.0} if protocol.startswith("private") else {},
        data={"model": "classes", "agents": 40},
        t_max=150,
        seed=11,
        checkpoints=8,
        topology=topology,
        folder=folder,
        **kw,
    )


def values(s: Scenario) -> np.ndarray:
    """Every recorded metric value of a run, in record order."""
    return run(s).metrics["value"].to_numpy()


def _write(path: Path, edges: list[tuple[int, int]]) -> None:
    path.write_text("".join(f"{u} {v}\n" for u, v in edges))


@pytest.mark.parametrize("protocol", FAMILY)
def test_rewiring_that_moves_no_link_gives_the_static_bytes(protocol):
    static = {"model": "regular", "degree": 4}
    tiny = {**static, "rewire": {"every": 10, "fraction": 1e-9}}  # round(q·|E|) = 0
    assert np.array_equal(values(scenario(protocol, static)), values(scenario(protocol, tiny)))


@pytest.mark.parametrize("protocol", FAMILY)
def test_a_sequence_of_the_same_graph_gives_the_static_bytes(tmp_path, protocol):
    g = RandomRegular(degree=4).make(40, np.random.default_rng(3))
    u, v = g.links()
    _write(tmp_path / "g.edges", list(zip(u, v, strict=True)))
    static = {"model": "file", "path": "g.edges"}
    seq = {**static, "sequence": [{"at": 30, "file": "g.edges"}, {"at": 77, "file": "g.edges"}]}
    a = values(scenario(protocol, static, str(tmp_path)))
    b = values(scenario(protocol, seq, str(tmp_path)))
    assert np.array_equal(a, b)


# --------------------------------------------------------------------------------------------
# a hand-checked path of 4


PATH = [(0, 1), (1, 2), (2, 3)]  # G0: 0–1–2–3
G1 = [(0, 1), (1, 2), (0, 3)]  # from slot 5: 2–3 dropped, 0–3 made (the path 3–0–1–2)
G2 = [(0, 3), (1, 2), (2, 3)]  # from slot 8: 0–1 dropped, 2–3 made again (0–3–2–1)
X = [1.0, 2.0, 4.0, 8.0]  # every agent's sample, the same every slot


def _run(tmp_path: Path, t_max: int):
    """B-ColME (the oracle rule, one class: every neighbour kept; κ = 5) on the path of 4 with
    constant samples X, G1 from slot 5 and G2 from slot 8 (a sequence of two graph files),
    run to t_max: its tables are then the messages of slot t_max, read in slot t_max + 1."""
    for name, edges in (("g0.edges", PATH), ("g1.edges", G1), ("g2.edges", G2)):
        _write(tmp_path / name, edges)
    g0 = _graph(PATH)
    data = GraphData(g0, [0, 1, 2, 3], X, sigma=0.0)  # means X (σ = 0: the samples are X)
    data.classes = np.zeros(4, dtype=int)  # one class: the oracle keeps every neighbour
    data.public["sigma2"] = np.ones(4)
    table = {"sequence": [{"at": 5, "file": "g1.edges"}, {"at": 8, "file": "g2.edges"}]}
    schedule = dynamics(table, 8).schedule(g0, 8, np.random.default_rng, str(tmp_path))
    cls = PROTOCOLS.get("b-colme")
    proto = cls(cls.Params(rule="oracle"))
    Simulation(proto, data, t_max, Streams(5, 0, 1, 2), graphs=schedule).run()
    return proto


def _graph(edges: list[tuple[int, int]]) -> Graph:
    return Graph.from_edges(4, *np.array(edges).T)


def _switched(proto, edges: list[tuple[int, int]], t: int):
    """`proto` after the change to the graph of `edges` before slot t, as the engine makes it."""
    graph = _graph(edges)
    added, dropped = difference(proto.graph, graph)
    proto.ctx.public["graph"] = graph
    proto.on_graph_change(t, added, dropped)
    return proto


def _by_edge(proto) -> dict[tuple[int, int], tuple[list[float], list[float]]]:
    """a's tables per directed edge (a, b): (S at depths 0…3, c at depths 0…3)."""
    s, c = proto.tables()
    edges = zip(proto.graph.src.tolist(), proto.graph.dst.tolist(), strict=True)
    return {e: (s[:, i].tolist(), c[:, i].tolist()) for i, e in enumerate(edges)}


NONE, ONE, TWO, THREE = [0.0] * 4, [1.0, 0, 0, 0], [1.0, 1, 0, 0], [1.0, 1, 1, 0]


def test_the_tables_after_each_change_are_the_hand_computed_ones(tmp_path):
    """What each slot reads (the tables sent in the slot before). Slot 5, on G1: the kept links
    hold G0's steady tables, the new 0–3 none. Slot 6: 3 hears 0's table of slot 5, which still
    counts 3 itself at depth 3 (through 1, 2 and the dropped 2–3: what lay beyond a dropped
    link leaves k slots later), while 1's sums lost 2–3's at once. Slot 8, on G2: 1–2 and 0–3
    keep the steady tables of 3–0–1–2, 0–1 is gone, 2–3 starts again with none."""
    assert _by_edge(_switched(_run(tmp_path, 4), G1, 5)) == {
        (0, 1): ([2, 4, 8, 0], THREE),
        (0, 3): (NONE, NONE),  # new: no table yet
        (1, 0): ([1, 0, 0, 0], ONE),
        (1, 2): ([4, 8, 0, 0], TWO),
        (2, 1): ([2, 1, 0, 0], TWO),
        (3, 0): (NONE, NONE),
    }
    at6 = _by_edge(_run(tmp_path, 5))
    assert at6[(0, 3)] == ([8, 0, 0, 0], ONE)  # 3 has no neighbour but 0 in G1
    assert at6[(3, 0)] == ([1, 2, 4, 8], [1.0, 1, 1, 1])
    assert at6[(1, 2)] == ([4, 0, 0, 0], ONE)  # 2 lost 3: the dropped table left 2's sums
    at7 = _by_edge(_run(tmp_path, 6))
    assert at7[(3, 0)] == ([1, 2, 4, 8], [1.0, 1, 1, 1])  # 1's table of slot 5 still had 3
    assert at7[(1, 0)] == ([1, 8, 0, 0], TWO)
    assert _by_edge(_switched(_run(tmp_path, 7), G2, 8)) == {
        (0, 3): ([8, 0, 0, 0], ONE),
        (1, 2): ([4, 0, 0, 0], ONE),
        (2, 1): ([2, 1, 8, 0], THREE),
        (2, 3): (NONE, NONE),  # made again: the earlier incarnation's table is not back
        (3, 0): ([1, 2, 4, 0], THREE),
        (3, 2): (NONE, NONE),
    }


def test_the_estimate_after_a_change_weighs_the_tables_held(tmp_path):
    """μ̂_a = (t X_a + Σ_b Σ_k (n_b − k) S^(k)) / (t + Σ_b Σ_k (n_b − k) c^(k)) over the tables
    above, n_b = t − 1: slot 5 (G1) and slot 8 (G2) of the run through both graph files."""
    expected5 = [
        (5 * 1 + 4 * 2 + 3 * 4 + 2 * 8) / (5 + 4 + 3 + 2),
        (5 * 2 + 4 * 1 + 4 * 4 + 3 * 8) / (5 + 4 + 4 + 3),
        (5 * 4 + 4 * 2 + 3 * 1) / (5 + 4 + 3),
        8.0,  # 3's only link is new: its own mean
    ]
    np.testing.assert_allclose(_run(tmp_path, 5).estimates(), expected5, rtol=1e-15, atol=0)
    expected8 = [
        (8 * 1 + 7 * 8) / (8 + 7),
        (8 * 2 + 7 * 4) / (8 + 7),
        (8 * 4 + 7 * 2 + 6 * 1 + 5 * 8) / (8 + 7 + 6 + 5),
        (8 * 8 + 7 * 1 + 6 * 2 + 5 * 4) / (8 + 7 + 6 + 5),
    ]
    np.testing.assert_allclose(_run(tmp_path, 8).estimates(), expected8, rtol=1e-15, atol=0)


@pytest.mark.parametrize("protocol", ["private-b-colme", "private-c-colme"])
def test_the_ledger_is_unchanged_by_a_change_that_isolates_an_agent(protocol):
    """Every sample is one Laplace release whatever the graph: an agent whose last link is
    dropped (3, before slot 5) keeps the release of each of its samples in the ledger."""
    spends = []
    for graphs in (None, Switches(_graph(PATH), [_graph([(0, 1), (1, 2), (0, 2)])], [5])):
        data = GraphData(_graph(PATH), [0, 0, 1, 1], [0.0, 1.0], sigma=0.5)
        cls = PROTOCOLS.get(protocol)
        proto = cls(cls.Params(epsilon=2.0))
        Simulation(proto, data, 20, Streams(3, 0, 1, 2), graphs=graphs).run()
        spends.append(proto.privacy_spend())
    static, changed = spends
    assert changed.against.keys() == static.against.keys() == {"one", "all"}
    for who, (m, shared) in changed.against.items():
        assert m == static.against[who][0] == 1 / 2.0  # b/2L = 1/ε
        assert shared.tolist() == static.against[who][1].tolist() == [1, 1, 1, 1]


# --------------------------------------------------------------------------------------------
# messages in flight


def _path4(edges: list[tuple[int, int]]) -> Graph:
    return Graph.from_edges(4, *np.array(edges).T)


P1 = _path4(PATH)
P2 = _path4([(0, 2), (1, 2), (2, 3)])


def _delayed(protocol: str, graphs, at, delay, windows=True, **params):
    """`protocol` on the path 0–1–2–3 (classes 0, 0, 1, 1) switching to `graphs` before the
    slots `at`, every message taking `delay` slots (an array: per message in send order), with
    the ``lost-in-flight`` metric at slots 9 and 20; returns (protocol, metric values)."""
    data = GraphData(P1, [0, 0, 1, 1], [0.0, 1.0], sigma=0.5)
    cls = PROTOCOLS.get(protocol)
    proto = cls(cls.Params(**params))
    links = ScriptedLinks(delay=delay)
    sim = Simulation(
        proto,
        data,
        20,
        Streams(5, 0, 1, 2),
        links=links,
        graphs=Switches(P1, graphs, at),
        checkpoints=np.array([9.0, 20.0]),
        metrics=[METRICS.get("lost-in-flight")],
        windows=windows,
    )
    m = sim.run().metrics
    return proto, m.loc[m["metric"] == "lost_in_flight", "value"].tolist()


def _constant(delay: float):
    return lambda rng, t, n: np.full(n, delay)


@pytest.mark.parametrize(
    ("protocol", "params", "lost"),
    [
        # B-ColME sends every neighbour its table each slot: 0 and 1 sent each other theirs in
        # slot 9, in flight (arriving at 10.4) when 0–1 is dropped before slot 10
        ("b-colme", {}, 2),
        ("private-b-colme", {"epsilon": 5.0}, 2),
        # C-ColME without sizes (max-degree weights) sends only states: the two of slot 9
        ("c-colme", {"weights": "max-degree"}, 2),
        # Private-ColME (PM-I): 0's query of slot 9 and the releases answering the queries of
        # slot 8, 0's and 1's (`test_rewire_colme`)
        ("private-colme", {"peers": "topology", "mechanism": "pm1"}, 3),
    ],
)
def test_the_metric_counts_the_messages_lost_in_flight(protocol, params, lost):
    """Messages take 1.4 slots; G1 = 0–1–2–3 becomes 0–2, 1–2, 2–3 before slot 10."""
    proto, recorded = _delayed(protocol, [P2], [10], _constant(1.4), **params)
    assert recorded[0] == 0.0  # nothing changed by slot 9
    assert recorded[1] == lost == proto.lost_in_flight()


def test_the_metric_counts_every_kind_c_colme_loses():
    """C-ColME with sizes and told decisions (Private-C-ColME): the metric is the sum over the
    kinds its `in_flight` counts, states included (two of slot 9)."""
    proto, recorded = _delayed("private-c-colme", [P2], [10], _constant(1.4), epsilon=5.0)
    assert recorded[1] == proto.in_flight.lost.sum() and proto.in_flight.lost[0] == 2


def test_tables_of_a_links_earlier_incarnation_are_lost():
    """Messages take 2.4 slots; 0–1 is dropped (0–2 made) before slot 10 and made again (0–2
    dropped) before 11. On 0–1 the tables of slot 8 arrive at 10.4 (link gone) and those of
    slot 9 at 11.4, sent before the link was made again; on 0–2 those of slot 10 arrive at
    12.4 (link gone): all six are lost, and 0's first table from 1 again is of slot 11."""
    proto, recorded = _delayed("b-colme", [P2, P1], [10, 11], _constant(2.4))
    assert recorded == [0.0, 6.0]
    e = int(np.flatnonzero((proto.graph.src == 0) & (proto.graph.dst == 1))[0])
    assert proto.held[1, e] == 18  # the newest table 0 holds from 1: 18 + 2.4 < 21, the end


@pytest.mark.parametrize("protocol", FAMILY)
def test_windows_and_instants_agree_across_graph_changes(protocol):
    """Delivery in windows leaves what one instant at a time leaves, bit for bit, across
    graph changes with tables in flight (delays of 1.4 and 2.4 slots)."""

    def delay(rng, t, n):
        return np.where(np.arange(n) % 2, 1.4, 2.4)

    runs = [_delayed(protocol, [P2, P1], [10, 11], delay, windows=w) for w in (False, True)]
    (a, lost_a), (b, lost_b) = runs
    assert np.array_equal(a.estimates(), b.estimates()) and np.array_equal(a.held, b.held)
    assert lost_a == lost_b and lost_a[1] > 0


@settings(max_examples=8, deadline=None)
@given(
    protocol=st.sampled_from(FAMILY),
    every=st.integers(1, 9),
    fraction=st.floats(0.05, 1.0),
    seed=st.integers(0, 2**16),
)
def test_the_tables_follow_every_rewiring(protocol, every, fraction, seed):
    """After any rewiring the tables are laid out on the graph in force: a column per edge,
    nothing held from a neighbour that is not kept, every estimate a finite mean."""
    g = RandomRegular(degree=4).make(20, np.random.default_rng(seed % 7))
    schedule = Dynamics(rewire=Rewire(every=every, fraction=fraction)).schedule(
        g, 36, lambda: np.random.default_rng(seed)
    )
    data = GraphData(g, np.arange(20) % 2, [0.0, 1.0], sigma=0.5)
    cls = PROTOCOLS.get(protocol)
    proto = cls(cls.Params())
    Simulation(proto, data, 36, Streams(5, 0, 1, 2), graphs=schedule).run()
    now = schedule.graph
    assert np.array_equal(proto.graph.src, now.src) and np.array_equal(proto.graph.dst, now.dst)
    s, c = proto.tables()
    assert s.shape[1] == c.shape[1] == now.n_directed
    assert not c[:, ~proto.kept].any()
    est = proto.estimates()
    assert np.isfinite(est).all()


# --------------------------------------------------------------------------------------------
# validation

STUDY = """\
[study]
title = "changing graph"
replicates = 1
t_max = 40
checkpoints = 4
{metrics}

[data]
model = "{data}"
agents = 12

[topology]
model = "regular"
degree = 4
rewire = {{every = 10, fraction = 0.2}}

[network]
links = "fixed-latency"
slots = 1.4

[[scenario]]
name = "S"
protocol = "{protocol}"
"""


@pytest.mark.parametrize("protocol", FAMILY)
def test_b_colme_on_a_changing_graph_validates_runs_and_records_its_losses(tmp_path, protocol):
    folder = tmp_path / "s"
    folder.mkdir()
    metrics = 'metrics = ["lost-in-flight"]'
    (folder / "study.toml").write_text(
        STUDY.format(data="classes", protocol=protocol, metrics=metrics)
    )
    assert main(["validate", str(folder)]) == 0
    s = Scenario(
        protocol=protocol,
        data={"model": "classes", "agents": 12},
        network={"links": "fixed-latency", "slots": 1.4},
        t_max=40,
        checkpoints=4,
        topology={"model": "regular", "degree": 4, "rewire": {"every": 10, "fraction": 0.2}},
        metrics=("lost-in-flight",),
    )
    m = run(s).metrics
    lost = m.loc[m["metric"] == "lost_in_flight", "value"]
    # every change before slot 10, 20, 30, 40 moves 5 of 24 links, each in flight in both ways
    assert len(lost) == 4 and (np.diff(lost) >= 0).all() and lost.iloc[-1] > 0


def test_pricer_refuses_a_changing_graph_saying_why(tmp_path, capsys):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "study.toml").write_text(STUDY.format(data="vectors", protocol="pricer", metrics=""))
    assert main(["validate", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "each slot is one round, complete in itself" in err, err
