"""Window batching is exact for the graph protocols too: C-ColME (both parameter sets) and
PriCER give bit for bit what one-message-per-instant delivery gives, under random latencies,
losses, outages and stragglers (`tests/desim/test_windows.py` does Private-ColME)."""

from __future__ import annotations

import numpy as np
import pytest

from desim.kernel.engine import Simulation
from desim.kernel.links import IdealLinks
from desim.kernel.params import build
from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.kernel.registry import DATA, PROTOCOLS, TOPOLOGIES
from desim.network_models.realistic import realistic_links
from desim.testing import ScriptedLinks

load_plugins()

DATA_PARAMS = {
    "agents": 24,
    "class_means": [0.0, 1.0, 0.4],
    "sigma": 1.0,
    "distribution": "gaussian",
}


def run(protocol: str, params: dict, links, windows: bool, t_max: int = 120, seed: int = 5):
    cls = PROTOCOLS.get(protocol)
    proto = cls(build(cls.Params, params, "test"))
    data = build(DATA.get("classes"), DATA_PARAMS, "data").make(np.random.default_rng(seed))
    topology = build(TOPOLOGIES.get("regular"), {"degree": 5}, "topology")
    data.public["graph"] = topology.build(data.n_agents, np.random.default_rng(seed + 1))
    sim = Simulation(
        proto,
        data,
        t_max,
        Streams(seed, 0, 1, 2),
        links=links,
        checkpoints=np.arange(1, t_max + 1),
        per_agent=True,
        windows=windows,
    )
    return proto, sim, sim.run()


def scripted():
    """20 % losses, exponential delays (mean 1.5 slots): every message its own instant."""
    return ScriptedLinks(
        down=lambda rng, t, src, dst: rng.random(len(src)) < 0.2,
        delay=lambda rng, t, n: rng.exponential(1.5, n),
    )


def tied():
    """Delays of whole quarter slots: several states of one edge at one instant, others
    apart within one window (the instant-by-instant filing matters)."""
    return ScriptedLinks(delay=lambda rng, t, n: rng.integers(0, 9, n) / 4.0)


REALISTIC = {
    "latency": {"model": "exponential", "mean": 2.0},
    "outages": {"model": "markov", "mean_up": 8.0, "mean_down": 3.0},
    "stragglers": {"fraction": 0.3, "slowdown": 3.0},
}

CCOLME = [
    ("c-colme", {}),
    ("private-c-colme", {}),
    (
        "c-colme",
        {
            "symmetric": True,
            "values": "fresh",
            "decisions": "retest",
            "initial": "none",
            "reset": "agent",
            "restart": "hard",
            "fallback": "local",
            "max_age": 3.0,
        },
    ),
    (
        "private-c-colme",
        {
            "epsilon": 5.0,
            "alpha_p": 0.5,
            "rule": "optimistic",
            "weights": "max-degree",
            "values": "stale",
        },
    ),
]


def assert_same(one, sim_one, out_one, win, sim_win, out_win, arrays):
    assert sim_win.network.windows and not sim_one.network.windows
    assert out_one.metrics.to_csv().encode() == out_win.metrics.to_csv().encode()
    assert out_one.agents.to_csv().encode() == out_win.agents.to_csv().encode()
    for name in arrays:
        np.testing.assert_array_equal(getattr(one, name), getattr(win, name), err_msg=name)
    np.testing.assert_array_equal(sim_one.network.sent, sim_win.network.sent)
    np.testing.assert_array_equal(sim_one.network.dropped, sim_win.network.dropped)


CCOLME_STATE = (
    "y",
    "chi",
    "their_chi",
    "kept",
    "nb_x",
    "nb_n",
    "nb_y",
    "nb_x_prev",
    "nb_n_prev",
    "nb_size",
    "start",
)


#: the same on a delivery grid of a quarter slot (many states of an edge share an instant)
GRID = {**REALISTIC, "latency": {"model": "exponential", "mean": 2.0, "resolution": 0.25}}


def realistic():
    """Realistic links: exponential latency, Markov outages, stragglers."""
    return realistic_links(IdealLinks(), REALISTIC)


def grid():
    """The realistic links with deliveries on a quarter-slot grid."""
    return realistic_links(IdealLinks(), GRID)


LINKS = [scripted, tied, realistic, grid]
# Every parameter set and every kind of links in the default set (a Latin square's diagonal);
# the other pairs in the slow set.
CCOLME_CASES = [
    pytest.param(
        protocol,
        params,
        links,
        id=f"{protocol}-params{i}-{links.__name__}",
        marks=[] if i == j else [pytest.mark.slow],
    )
    for i, (protocol, params) in enumerate(CCOLME)
    for j, links in enumerate(LINKS)
]


@pytest.mark.parametrize(("protocol", "params", "links"), CCOLME_CASES)
def test_ccolme_windows_reproduce_one_message_per_instant_bit_for_bit(protocol, params, links):
    one = run(protocol, params, links(), windows=False)
    win = run(protocol, params, links(), windows=True)
    assert_same(*one, *win, CCOLME_STATE)
    assert one[1].network.sent[1:].sum() > 0 or not one[0].params.symmetric


# ---- PriCER: deadline rounds ------------------------------------------------------------------


class LoggedPricer(PROTOCOLS.get("pricer")):
    """PriCER keeping every round's estimate (the recorder sees only checkpoints)."""

    def setup(self, ctx):
        super().setup(ctx)
        self.rounds: list[np.ndarray] = []

    def _aggregate(self, r):
        super()._aggregate(r)
        self.rounds.append(self.estimate.copy())


PRICER_NETWORKS = [
    {"latency": {"model": "exponential", "mean": 0.6}},
    {
        "latency": {"model": "lognormal", "mean": 1.0, "cv": 2.0},
        "outages": {"model": "markov", "mean_up": 6.0, "mean_down": 2.0},
        "stragglers": {"fraction": 0.3, "slowdown": 3.0},
    },
    {"latency": {"model": "exponential", "mean": 0.6, "resolution": 0.25}},
]


@pytest.mark.parametrize("tables", PRICER_NETWORKS)
@pytest.mark.parametrize(
    "params",
    [
        {},
        {"strategy": "colrel", "relay_deadline": 0.5},
        {"strategy": "naive", "server_deadline": 2.5},
    ],
)
def test_pricer_windows_reproduce_one_message_per_instant_bit_for_bit(tables, params):
    from desim.models.pricer.data import VectorData
    from desim.network_models.links import BernoulliLinks

    def once(windows):
        data = VectorData(agents=8, dimension=5, radius=2.0, distribution="normal").make(
            np.random.default_rng(11)
        )
        base = build(BernoulliLinks, {"p_server": [0.9, 0.5] * 4, "p_link": 0.7}, "network")
        proto = LoggedPricer(
            build(
                LoggedPricer.Params,
                {
                    "epsilon_low": 2.0,
                    "trust": "ring",
                    "trusted": 1,
                    "relay_deadline": 1.25,
                    "server_deadline": 1.0,
                    **params,
                },
                "pricer",
            )
        )
        sim = Simulation(
            proto,
            data,
            80,
            Streams(4, 0, 1, 2),
            links=realistic_links(base, tables),
            checkpoints=np.arange(1, 81),
            windows=windows,
        )
        return proto, sim, sim.run()

    one, win = once(False), once(True)
    assert win[1].network.windows and not one[1].network.windows
    assert one[2].metrics.to_csv().encode() == win[2].metrics.to_csv().encode()
    np.testing.assert_array_equal(np.array(one[0].rounds), np.array(win[0].rounds))
    assert one[0].stage1.late == win[0].stage1.late and one[0].server.late == win[0].server.late
    assert one[0].stage1.late + one[0].server.late > 0  # some messages missed a deadline
    np.testing.assert_array_equal(one[1].network.sent, win[1].network.sent)
    np.testing.assert_array_equal(one[1].network.dropped, win[1].network.dropped)
