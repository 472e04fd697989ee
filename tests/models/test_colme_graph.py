"""Private-ColME on a graph (``peers = "topology"``): agents query only their neighbours.

On a complete graph it is the all-peers protocol bit for bit (same random streams); on a sparse
graph every delivery mode gives the same bytes, the oracle variant meets the restricted Prop. 3
curve (`oracle-neighbours`) within its standard errors, the pair state is per edge, and a study
must say `peers` beside a [topology] (saying "all" keeps every hash).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from desim.kernel.params import build
from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.kernel.registry import CURVES, DATA, PROTOCOLS
from desim.models.colme.graph import NeighbourRoundRobin, Neighbours
from desim.study.cli import main
from desim.study.scenario import Scenario, run
from desim.study.spec import load_study
from desim.testing import WINDOW_NETWORKS, check_modes
from desim.topologies.graph import Graph

load_plugins()
SMALL = {"model": "classes", "agents": 12, "class_means": [0.2, 0.8], "sigma": 0.5}
LATENCY = {"links": "ideal", "latency": {"model": "exponential", "mean": 2.0}}
GRID = {
    "links": "ideal",
    "latency": {"model": "exponential", "mean": 1.5, "resolution": 0.25},
    "outages": {"model": "markov", "mean_up": 8.0, "mean_down": 3.0},
}


def _both(params: dict, network: dict, data: dict = SMALL, t_max: int = 120):
    """The runs with peers = "all" and "topology" on a complete graph, on the same streams."""
    out = []
    for peers in ("all", "topology"):
        s = Scenario(
            protocol="private-colme",
            params={**params, "peers": peers},
            data=data,
            network=network,
            t_max=t_max,
            checkpoints=15,
            topology={"model": "complete"},
            per_agent=True,
            metrics=("privacy", "colme-async"),
        )
        out.append(run(s, streams=Streams(1, 0, 5, 7)))
    return out


@pytest.mark.parametrize(
    ("params", "network"),
    [
        ({}, {"links": "ideal"}),
        ({}, LATENCY),
        ({}, GRID),
        ({"schedule": "rrr"}, GRID),
        pytest.param(
            {"mechanism": "pm2", "weights": "wmom", "calibration": "tight-tree"},
            {"links": "ideal"},
            marks=pytest.mark.slow,
        ),
        ({"variance": "sch-var-1"}, LATENCY),
        ({"schedule": "rrr", "variance": "sch-var-2-bayes"}, {"links": "ideal"}),
        ({"budget": {"epsilon": 3.0, "against": "colluding"}, "timeout": 2.0}, LATENCY),
    ],
)
def test_a_complete_graph_gives_the_bytes_of_all_peers(params, network):
    every, graph = _both(params, network)
    pd.testing.assert_frame_equal(every.metrics, graph.metrics, check_exact=True)
    pd.testing.assert_frame_equal(every.agents, graph.agents, check_exact=True)


@pytest.mark.slow
def test_a_complete_graph_above_incremental_above_differs_from_all_peers_by_rounding_only():
    # all peers keep Lemma 4's sums up to date release by release there; on a graph they are
    # summed edge by edge at each estimate: the same terms, added in another order
    data = {**SMALL, "agents": 1002}
    every, graph = _both({"schedule": "rrr"}, LATENCY, data, t_max=12)
    a, b = every.metrics, graph.metrics
    pd.testing.assert_frame_equal(a[a.metric != "mse"], b[b.metric != "mse"], check_exact=True)
    np.testing.assert_allclose(b[b.metric == "mse"].value, a[a.metric == "mse"].value, rtol=1e-9)


@pytest.mark.parametrize(
    ("params", "network"),
    # the first case in the default set, all of them with `-m slow`
    [
        case if i == 0 else pytest.param(*case, marks=pytest.mark.slow)
        for i, case in enumerate(
            zip(
                [
                    {"peers": "topology"},
                    {"peers": "topology", "schedule": "rrr", "variance": "sch-var-2"},
                    {
                        "peers": "topology",
                        "mechanism": "pm2",
                        "variance": "sch-var-1",
                        "budget": {"epsilon": 4},
                    },
                ],
                WINDOW_NETWORKS,
                strict=True,
            )
        )
    ],
)
def test_every_delivery_mode_gives_the_same_bytes_on_a_sparse_graph(params, network):
    data = ("classes", {"agents": 20, "class_means": [0.2, 0.8], "sigma": 0.5})
    check_modes(
        PROTOCOLS.get("private-colme"),
        params,
        networks=[network],
        data=data,
        topology=("regular", {"degree": 4}),
        metrics=["privacy", "colme-async"],
        t_max=60,
    )


def test_rr_over_neighbours_queries_each_neighbour_once_per_degree_slots():
    # agent 0: neighbours 1, 3; agent 2: 1, 3 — a 4-cycle plus the chord {1, 3}
    g = Graph.from_edges(4, np.array([0, 1, 2, 3, 1]), np.array([1, 2, 3, 0, 3]))
    nb = Neighbours(g)
    rr = NeighbourRoundRobin(nb)
    seen = {a: [] for a in range(4)}
    for t in range(1, 7):
        a, b, e = rr.targets(t)
        np.testing.assert_array_equal(nb.src[e], a)
        np.testing.assert_array_equal(nb.dst[e], b)
        for x, y in zip(a, b, strict=True):
            seen[int(x)].append(int(y))
    assert seen[0] == [1, 3] * 3  # from the first neighbour above a, cyclically
    assert seen[1] == [2, 3, 0] * 2
    assert seen[3] == [0, 1, 2] * 2


def test_the_pair_state_is_held_per_edge():
    s = Scenario(
        protocol="private-colme",
        params={"peers": "topology", "variance": "sch-var-2"},
        data={**SMALL, "agents": 200},
        network=LATENCY,
        t_max=5,
        topology={"model": "regular", "degree": 6},
    )
    cls = PROTOCOLS.get("private-colme")
    params = build(cls.Params, {"peers": "topology"}, "params")
    assert set(cls.memory_per_unit(params, 100)) == {"edge"}
    from desim.kernel.engine import Simulation
    from desim.study.scenario import resolve

    r = resolve(s)
    source = r.data_params.make(np.random.default_rng(0))
    source.public["graph"] = r.topology.build(200, np.random.default_rng(1))
    proto = cls(r.protocol_params)
    Simulation(proto, source, 5, Streams(0, 0, 1, 2), links=r.links).run()
    edges = 200 * 6
    assert proto.n_pairs == edges and proto.stat._flat.shape[0] == edges
    assert proto.v_hat.shape == (edges,) and proto.schvar2._state.shape[0] == edges
    assert proto.delivery.last.value.shape == (edges,)
    assert proto.mech.count.size < edges + 2 * math.isqrt(edges) + 2


@pytest.mark.slow
def test_the_oracle_on_a_sparse_graph_meets_the_restricted_curve():
    data = {
        "model": "classes",
        "agents": 300,
        "class_means": [0.2, 0.4, 0.8],
        "sigma": 0.5,
        "assignment": "random",  # neighbours are class-mates independently, as Prop. 3 has
    }
    topology = {"model": "regular", "degree": 10}
    runs = []
    for seed in range(12):
        s = Scenario(
            protocol="private-colme-oracle",
            params={"peers": "topology"},
            data=data,
            t_max=400,
            checkpoints=8,
            topology=topology,
            seed=seed,
        )
        m = run(s).metrics
        runs.append(m[m.metric == "mse"].set_index("t")["value"])
    mse = pd.concat(runs, axis=1)
    t = mse.index.to_numpy()
    data_params = build(DATA.get("classes"), {k: v for k, v in data.items() if k != "model"}, "")
    curve = CURVES.get("oracle-neighbours")(topology=topology, method="exact")
    expected, se_curve = curve.curve(t, data_params)
    mean = mse.mean(axis=1).to_numpy()
    se = mse.std(axis=1, ddof=1).to_numpy() / math.sqrt(mse.shape[1])
    z = (mean - expected) / np.sqrt(se**2 + se_curve**2)
    assert np.all(np.abs(z) < 4.0), (t, mean, expected, z)
    # and the graph matters: the all-peers curve (M − 1 = 299 others) is far below at the end
    dense = CURVES.get("oracle")().curve(t, data_params)[0]
    assert dense[-1] < 0.5 * expected[-1]


STUDY = """
[study]
title = "peers"
seed = 1
replicates = 1
t_max = 20
checkpoints = 4

[data]
model = "classes"
agents = {agents}
class_means = [0.2, 0.8]
sigma = 0.5

[topology]
model = "regular"
degree = 4

[[scenario]]
name = "P"
protocol = "private-colme"
{peers}
[[scenario]]
name = "C"
protocol = "c-colme"
"""


def _study(tmp_path, name: str, peers: str, agents: int = 20):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "study.toml").write_text(STUDY.format(peers=peers, agents=agents))
    return folder


def test_a_topology_without_peers_is_refused_naming_the_choice(tmp_path, capsys):
    assert main(["validate", str(_study(tmp_path, "s", ""))]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "scenario 'P'" in err[0] and 'peers = "all" or "topology"' in err[0]


def test_peers_topology_without_a_topology_is_refused(tmp_path, capsys):
    folder = _study(tmp_path, "s", 'peers = "topology"')
    text = (folder / "study.toml").read_text()
    text = text.replace('[topology]\nmodel = "regular"\ndegree = 4\n', "")
    (folder / "study.toml").write_text(text.split('[[scenario]]\nname = "C"')[0])
    assert main(["validate", str(folder)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "peers = 'topology': needs a [topology] table" in err[0]


def test_saying_peers_all_keeps_every_hash(tmp_path):
    def hashes(name: str, peers: str):
        folder = _study(tmp_path, name, peers)
        text = (folder / "study.toml").read_text()  # no [topology]: peers may go unsaid
        text = text.replace('[topology]\nmodel = "regular"\ndegree = 4\n', "")
        (folder / "study.toml").write_text(text.split('[[scenario]]\nname = "C"')[0])
        study = load_study(folder)
        return study.config_hash, [(r.config_hash, r.scenario.run_key) for r in study.runs]

    assert hashes("said", 'peers = "all"') == hashes("unsaid", "")
    assert hashes("topology", 'peers = "topology"') != hashes("unsaid2", "")


def test_peers_topology_reads_the_topology_and_validates_at_scale(tmp_path, capsys):
    folder = _study(tmp_path, "s", 'peers = "topology"', agents=100_000)
    assert main(["validate", str(folder)]) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "ignore" not in err  # both scenarios read the [topology]
