"""Private-ColME with peers = "topology" on a graph that changes during a run
(`desim.models.colme.rewire`): no change gives the static bytes, the pairs follow the new
graph (a new link starts as at set-up), the ledger keeps the releases of dropped links, and
over links that are not ideal a message of a link that changed is dropped at delivery."""

from __future__ import annotations

import numpy as np
import pytest
from _ccolme_helpers import GraphData, Switches
from _runs import validate_rewired
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.engine import Simulation
from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.kernel.registry import PROTOCOLS
from desim.study.scenario import Scenario, run
from desim.testing import ScriptedLinks
from desim.topologies.dynamic import Dynamics, Rewire
from desim.topologies.generators import RandomRegular
from desim.topologies.graph import Graph

load_plugins()

SCHEDULES = ("rr", "rrr")


def scenario(topology: dict, folder: str = "", **params) -> Scenario:
    """A small Private-ColME run on 30 agents, peers = topology (graph files in `folder`)."""
    return Scenario(
        protocol="private-colme",
        params={"peers": "topology", "epsilon": 5.0, **params},
        data={"model": "classes", "agents": 30},
        t_max=100,
        seed=11,
        checkpoints=8,
        topology=topology,
        metrics=("privacy",),
        folder=folder,
    )


def values(s: Scenario) -> np.ndarray:
    """Every recorded metric value of a run, in record order."""
    return run(s).metrics["value"].to_numpy()


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
def test_rewiring_that_moves_no_link_gives_the_static_bytes(schedule, mechanism):
    static = {"model": "regular", "degree": 4}
    tiny = {**static, "rewire": {"every": 10, "fraction": 1e-9}}  # round(q·|E|) = 0
    kw = {"schedule": schedule, "mechanism": mechanism}
    assert np.array_equal(values(scenario(static, **kw)), values(scenario(tiny, **kw)))


@pytest.mark.parametrize("variance", ["known", "sch-var-1", "sch-var-2"])
def test_a_sequence_of_the_same_graph_gives_the_static_bytes(tmp_path, variance):
    g = RandomRegular(degree=4).make(30, np.random.default_rng(3))
    u, v = g.links()
    (tmp_path / "g.edges").write_text("".join(f"{a} {b}\n" for a, b in zip(u, v, strict=True)))
    static = {"model": "file", "path": "g.edges"}
    seq = {**static, "sequence": [{"at": 30, "file": "g.edges"}, {"at": 77, "file": "g.edges"}]}
    kw = {"variance": variance, "weights": "mom", "folder": str(tmp_path)}
    assert np.array_equal(values(scenario(static, **kw)), values(scenario(seq, **kw)))


def simulate(graph: Graph, graphs_of, t_max: int, protocol="private-colme", links=None, **params):
    """Run Private-ColME (peers = topology) on `graph` by the engine with the schedule
    `graphs_of(graph)`; returns the protocol after the run."""
    classes = np.arange(graph.n) % 2
    data = GraphData(graph, classes, [0.0, 1.0], sigma=0.5)
    cls = PROTOCOLS.get(protocol)
    proto = cls(cls.Params(peers="topology", **params))
    sim = Simulation(proto, data, t_max, Streams(5, 0, 1, 2), links=links, graphs=graphs_of(graph))
    sim.run()
    return proto


def _edges(src: np.ndarray, dst: np.ndarray) -> set[tuple[int, int]]:
    return set(zip(src.tolist(), dst.tolist(), strict=True))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_after_a_switch_the_pairs_are_those_of_the_new_graph(schedule):
    g1 = RandomRegular(degree=4).make(30, np.random.default_rng(0))
    g2 = RandomRegular(degree=4).make(30, np.random.default_rng(9))
    tau, t_max = 40, 61
    proto = simulate(
        g1,
        lambda g: Switches(g, [g2], [tau]),
        t_max,
        protocol="private-colme-oracle",
        schedule=schedule,
    )
    nb = proto.graph
    assert _edges(nb.src, nb.dst) == _edges(g2.src, g2.dst)  # N_a of G2, every a
    classes = np.arange(30) % 2
    assert np.array_equal(proto.included, classes[nb.src] == classes[nb.dst])  # oracle C_a
    # a link of G2 only started at τ with no release: under RR a asks its neighbour at
    # position q in the slots t ≥ τ with (t − 1) mod 4 + 1 = q, one release each
    if schedule == "rr":
        new = _edges(g2.src, g2.dst) - _edges(g1.src, g1.dst)
        kappa = proto.mech.count.ravel()[: nb.n_pairs]
        slots = np.arange(tau, t_max + 1)
        for e in range(nb.n_pairs):
            a = nb.src[e]
            place = int(np.flatnonzero(nb.at_place(np.full(4, a), np.arange(4)) == e)[0])
            expected = int(((slots - 1) % 4 == place).sum())
            if (int(a), int(nb.dst[e])) in new:
                assert kappa[e] == expected
            else:
                assert kappa[e] > expected  # kept its releases from before τ


def _path(edges: list[tuple[int, int]]) -> Graph:
    u, v = np.array(edges).T
    return Graph.from_edges(4, u, v)


def test_the_ledger_keeps_the_releases_of_dropped_links_by_hand():
    """G1 = 0–1–2–3; from slot 10 G2 = 0–2, 1–2, 2–3 (0–1 dropped, 0–2 new); from slot 20 G1
    again (0–1 made again, 0–2 dropped). Under PM-I b's first sample is in one p-sum per
    querier and link incarnation that released: 0 was told twice by 1 and once by 2, 1 twice
    by 0 and once by 2, 2 once each by 0, 1 and 3, 3 once by 2."""
    g1 = _path([(0, 1), (1, 2), (2, 3)])
    g2 = _path([(0, 2), (1, 2), (2, 3)])
    proto = simulate(g1, lambda g: Switches(g, [g2, g1], [10, 20]), 30, mechanism="pm1")
    spend = proto.privacy_spend()
    assert spend.against["one"][1].tolist() == [2, 2, 1, 1]
    assert spend.against["all"][1].tolist() == [3, 3, 3, 1]
    static = simulate(g1, lambda g: Switches(g, [], []), 30, mechanism="pm1").privacy_spend()
    assert static.against["one"][1].tolist() == [1, 1, 1, 1]
    assert static.against["all"][1].tolist() == [1, 2, 2, 1]  # the degrees
    for name, eps in spend.epsilons().items():
        assert (eps >= static.epsilons()[name]).all()
        assert (eps > static.epsilons()[name]).any()


@settings(max_examples=6, deadline=None)
@given(
    schedule=st.sampled_from(SCHEDULES),
    every=st.integers(1, 9),
    fraction=st.floats(0.05, 1.0),
    seed=st.integers(0, 2**16),
)
def test_every_pair_state_follows_each_rewiring(schedule, every, fraction, seed):
    def schedule_of(g):
        return Dynamics(rewire=Rewire(every=every, fraction=fraction)).schedule(
            g, 36, lambda: np.random.default_rng(seed)
        )

    g = RandomRegular(degree=4).make(20, np.random.default_rng(seed % 7))
    proto = simulate(g, schedule_of, 36, schedule=schedule, variance="sch-var-2")
    nb = proto.graph
    now = schedule_of(g).graph_at(36)
    assert _edges(nb.src, nb.dst) == _edges(now.src, now.dst)
    assert len(proto.included) == len(proto.v_hat) == nb.n_pairs
    assert np.array_equal(
        proto.beliefs.n_included, np.bincount(nb.src[proto.included], minlength=20)
    )
    est = proto.estimates()
    assert np.isfinite(est).all()


def test_in_flight_messages_of_a_dropped_link_are_lost_at_delivery():
    """Messages take 1.4 slots (a release answers a query on its arrival: 2.8 slots after
    it). G1 = 0–1–2–3 becomes G2 = 0–2, 1–2, 2–3 before slot 10. On link 0–1, 0 asks 1 in
    every slot and 1 asks 0 in even slots (RR over 2, 0). In flight at 10 and lost: 0's query
    of slot 9, and the releases answering the queries of slot 8 (0's and 1's)."""
    g1 = _path([(0, 1), (1, 2), (2, 3)])
    g2 = _path([(0, 2), (1, 2), (2, 3)])
    links = ScriptedLinks(delay=lambda rng, t, n: np.full(n, 1.4))
    proto = simulate(g1, lambda g: Switches(g, [g2], [10]), 20, links=links, mechanism="pm1")
    assert proto.follower.lost.tolist() == [1, 2]  # [queries, releases]
    nb = proto.graph
    assert _edges(nb.src, nb.dst) == _edges(g2.src, g2.dst)
    # the new link 0 → 2 starts at slot 10: release j answers 0's query of slot 9 + j, made
    # on its arrival (9 + j + 1.4 ≤ 20.4: j ≤ 10) and taken 1.4 later (before the end, 21:
    # j ≤ 9), from j = 1 on: nothing stale
    e = int(np.flatnonzero((nb.src == 0) & (nb.dst == 2))[0])
    assert proto.mech.count.ravel()[e] == 10
    assert proto.stat.last_index(np.array([e]))[0] == 9
    assert proto.stale.sum() == 0


def test_a_link_made_again_drops_the_messages_of_its_earlier_incarnation():
    """0–1 is dropped before slot 10 and made again before slot 11: the messages sent on it
    before 10 and still in flight at 11 belong to the first incarnation and are dropped
    (messages take 2.4 slots: 0's query of slot 9 arrives at 11.4)."""
    g1 = _path([(0, 1), (1, 2), (2, 3)])
    g2 = _path([(0, 2), (1, 2), (2, 3)])
    links = ScriptedLinks(delay=lambda rng, t, n: np.full(n, 2.4))
    proto = simulate(g1, lambda g: Switches(g, [g2, g1], [10, 11]), 20, links=links)
    e = int(np.flatnonzero((proto.graph.src == 0) & (proto.graph.dst == 1))[0])
    # 0 → 1 from slot 11: its queries of slots 11…18 answered (t + 2.4 < 21), the releases
    # of 11…16 taken (t + 4.8 < 21), j = 1…6; the query of slot 9 was not answered
    assert proto.mech.count.ravel()[e] == 8
    assert proto.stat.last_index(np.array([e]))[0] == 6
    assert proto.stale.sum() == 0


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ('budget = {epsilon = 8.0, action = "degrade"}', "degrade"),
        ('calibration = "tight-tree"', "tight-tree"),
    ],
)
def test_runs_bound_by_the_set_up_degrees_are_refused(tmp_path, capsys, extra, fragment):
    assert validate_rewired(tmp_path, extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


@pytest.mark.parametrize("protocol", ["private-colme", "c-colme", "private-c-colme"])
def test_windows_and_instants_agree_across_graph_changes(protocol):
    """Delivery in windows (and slot batches) leaves what one instant at a time leaves, bit
    for bit, across graph changes with messages in flight (delays of 1.4 and 2.4 slots)."""
    g1 = _path([(0, 1), (1, 2), (2, 3)])
    g2 = _path([(0, 2), (1, 2), (2, 3)])
    classes = np.array([0, 0, 1, 1])
    runs = []
    for windows in (False, True):
        data = GraphData(g1, classes, [0.0, 1.0], sigma=0.5)
        cls = PROTOCOLS.get(protocol)
        params = {"peers": "topology"} if protocol == "private-colme" else {}
        proto = cls(cls.Params(**params))
        links = ScriptedLinks(delay=lambda rng, t, n: np.where(np.arange(n) % 2, 1.4, 2.4))
        switches = Switches(g1, [g2, g1], [10, 11])
        sim = Simulation(
            proto, data, 20, Streams(5, 0, 1, 2), links=links, graphs=switches, windows=windows
        )
        sim.run()
        lost = proto.follower.lost if protocol == "private-colme" else proto.in_flight.lost
        runs.append((proto.estimates(), lost.copy()))
    assert np.array_equal(runs[0][0], runs[1][0])
    assert np.array_equal(runs[0][1], runs[1][1]) and runs[0][1].sum() > 0
