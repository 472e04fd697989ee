"""Window batching is exact for the empirical-Bayes protocols: eb-gaussian, eb-bernoulli and
eb-mixture, with and without their upload mechanisms, give bit for bit what
one-message-per-instant delivery gives under random latencies, losses, outages, churn and
stragglers (`tests/desim/test_windows.py` does Private-ColME), including windows in which an
agent gets several broadcasts, an older round's after a newer one's."""

from __future__ import annotations

import numpy as np
import pytest

from desim.kernel.engine import Simulation
from desim.kernel.links import IdealLinks
from desim.kernel.params import build
from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.kernel.registry import DATA, METRICS, PROTOCOLS
from desim.models.eb.server import _first_of_latest
from desim.network_models.realistic import realistic_links
from desim.testing import WINDOW_NETWORKS, ScriptedLinks

load_plugins()

GAUSS = ("hierarchical-gaussian", {"agents": 16, "mean": 0.3, "sigma_theta": 0.2, "sigma_x": 0.5})
BERN = ("bernoulli-prior", {"agents": 16, "prior": "beta", "alpha": 2.0, "beta": 3.0})
CLASSES = ("classes", {"agents": 18, "class_means": [0.2, 0.5, 0.8], "sigma": 0.3})

#: A round every slot whose deadline is 1.5 slots later: two rounds open at once, and with
#: delays of a few slots broadcasts of consecutive rounds overtake each other.
OVERLAP = {"round": 1, "deadline": 1.5}
#: (protocol, params, data): every mechanism each protocol offers.
CASES = [
    ("eb-gaussian", {}, GAUSS),
    (
        "eb-gaussian",
        {"mechanism": "gaussian", "sigma_theta": 0.2, "epsilon": 0.5, "calibration": "tight"},
        GAUSS,
    ),
    ("eb-gaussian", {"mechanism": "quantiser", "clip": 2.0, "bits": 4}, GAUSS),
    ("eb-gaussian", {"mechanism": "pm1"}, GAUSS),
    ("eb-gaussian", {"mechanism": "pm2", "noise": "laplace"}, GAUSS),
    ("eb-bernoulli", {}, BERN),
    (
        "eb-bernoulli",
        {"mechanism": "rr", "epsilon": 2.0, "moments": "printed", "subtract": True},
        BERN,
    ),
    ("eb-mixture", {"lloyd": 2}, CLASSES),
    ("eb-mixture", {"mechanism": "pm1", "lloyd": 1}, CLASSES),
    ("eb-mixture", {"mechanism": "pm2"}, CLASSES),
]


def run(
    protocol: str,
    params: dict,
    data: tuple,
    links,
    windows: bool,
    t_max: int = 80,
    seed: int = 7,
    watch: list | None = None,
):
    """One run with a measurement every slot; `watch` collects every broadcast batch's
    (destinations, rounds) as the protocol receives them."""
    cls = PROTOCOLS.get(protocol)
    proto = cls(build(cls.Params, params, "test"))
    source = build(DATA.get(data[0]), data[1], "data").make(np.random.default_rng(seed))
    if watch is not None:
        deliver = proto.on_deliver

        def watched(batch):
            got = batch.of_kind("broadcast")
            watch.append((got.dst.copy(), got.payload[:, 0].astype(np.int64)))
            deliver(batch)

        proto.on_deliver = watched
    sim = Simulation(
        proto,
        source,
        t_max,
        Streams(seed, 0, 1, 2),
        links=links,
        checkpoints=np.arange(1, t_max + 1),
        per_agent=True,
        metrics=[METRICS.get("eb")],
        windows=windows,
    )
    return proto, sim, sim.run()


def assert_same(one, sim_one, out_one, win, sim_win, out_win) -> None:
    assert sim_win.network.windows and not sim_one.network.windows
    assert out_one.metrics.to_csv().encode() == out_win.metrics.to_csv().encode()
    assert out_one.agents.to_csv().encode() == out_win.agents.to_csv().encode()
    np.testing.assert_array_equal(one.received, win.received)
    np.testing.assert_array_equal(one.received_round, win.received_round)
    assert one.uploads_per_round == win.uploads_per_round
    assert one.server.late == win.server.late
    np.testing.assert_array_equal(sim_one.network.sent, sim_win.network.sent)
    np.testing.assert_array_equal(sim_one.network.dropped, sim_win.network.dropped)


def overtaken(watch: list) -> int:
    """Batches in which some agent gets an older round's broadcast after a newer one's."""
    count = 0
    for dst, rounds in watch:
        order = np.lexsort((np.arange(len(dst)), dst))  # by agent, in delivery order
        d, r = dst[order], rounds[order]
        same = d[1:] == d[:-1]
        count += bool((same & (r[1:] < r[:-1])).any())
    return count


def scripted():
    """20 % losses, exponential delays (mean 2 slots): every message its own instant."""
    return ScriptedLinks(
        down=lambda rng, t, src, dst: rng.random(len(src)) < 0.2,
        delay=lambda rng, t, n: rng.exponential(2.0, n),
    )


@pytest.mark.parametrize("protocol,params,data", CASES)
def test_eb_windows_reproduce_one_message_per_instant_bit_for_bit(protocol, params, data):
    params = {**OVERLAP, **params}
    one, sim_one, out_one = run(protocol, params, data, scripted(), windows=False)
    watch: list = []
    win, sim_win, out_win = run(protocol, params, data, scripted(), windows=True, watch=watch)
    assert_same(one, sim_one, out_one, win, sim_win, out_win)
    # rounds 1..79 close before the run ends at 81 (round 80's deadline is 81.5)
    assert len(one.uploads_per_round) == 79 and sum(one.uploads_per_round) > 0
    assert one.server.late > 0 and (one.received_round > 0).all()
    assert overtaken(watch) > 0  # the windows held broadcasts out of round order


@pytest.mark.parametrize("tables", WINDOW_NETWORKS)
@pytest.mark.parametrize(
    "protocol,params,data",
    [
        ("eb-gaussian", {"mechanism": "pm1", **OVERLAP}, GAUSS),
        ("eb-mixture", {"mechanism": "pm2", "round": 5, "deadline": 4.0}, CLASSES),
        ("eb-bernoulli", {"mechanism": "rr", "round": 3, "deadline": 2.5}, BERN),
    ],
)
def test_eb_windows_are_exact_on_realistic_networks(tables, protocol, params, data):
    def links():
        return realistic_links(IdealLinks(), tables)

    one, sim_one, out_one = run(protocol, params, data, links(), windows=False)
    win, sim_win, out_win = run(protocol, params, data, links(), windows=True)
    assert_same(one, sim_one, out_one, win, sim_win, out_win)
    assert sim_win.network.dropped.sum() > 0  # the network did lose messages
    assert (win.received_round > 0).any()


def test_eb_windows_with_zero_latency_are_exact():
    """Bernoulli uplinks without delays (the server-vs-peers outages study): every upload is
    due at its tick and every broadcast at its deadline, each instant a window of its own."""
    from desim.network_models.links import BernoulliLinks

    params = {"mechanism": "pm1", **OVERLAP}
    one, sim_one, out_one = run(
        "eb-mixture", params, CLASSES, BernoulliLinks(p_link=1.0, p_server=0.5), windows=False
    )
    win, sim_win, out_win = run(
        "eb-mixture", params, CLASSES, BernoulliLinks(p_link=1.0, p_server=0.5), windows=True
    )
    assert_same(one, sim_one, out_one, win, sim_win, out_win)
    assert sim_win.network.dropped.sum() > 0


def test_first_of_latest_keeps_what_one_at_a_time_delivery_leaves():
    """Agent 0 gets rounds 2, 3, 1, 3 (in delivery order): the first round-3 message (index 1)
    stays, as one at a time (the second round 3 is not newer; round 1 is late). Agent 4 gets one
    message; agent 2 gets round 1 twice: the first (index 4)."""
    dst = np.array([0, 0, 4, 0, 2, 2, 0])
    rounds = np.array([2, 3, 5, 1, 1, 1, 3])
    keep = _first_of_latest(dst, rounds)
    np.testing.assert_array_equal(keep, [1, 4, 2])
    np.testing.assert_array_equal(_first_of_latest(dst[:0], rounds[:0]), [])
