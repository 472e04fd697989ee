"""Every bundled protocol family gives the same bytes in every delivery mode it declares
(`desim.testing.check_modes`): one message per instant, windows, and slot batches where the
protocol is `SlotBatched`, on random latencies, losses, outages, churn and stragglers."""

from __future__ import annotations

import pytest

from desim.kernel.params import build
from desim.kernel.plugins import load_plugins
from desim.kernel.protocol import SlotBatched, WindowSafe
from desim.kernel.registry import PROTOCOLS
from desim.network_models.links import BernoulliLinks
from desim.testing import WINDOW_NETWORKS, check_modes

load_plugins()

#: A network of each kind a window asks its links in (see `WINDOW_NETWORKS`): slotted outages
#: and stragglers, then continuous churn with heavy-tailed latency.
NETWORKS = WINDOW_NETWORKS[:2]


@pytest.mark.parametrize("schedule, batched", [("rr", True), ("rrr", False)])
def test_private_colme_modes(schedule, batched):
    for runs in check_modes(PROTOCOLS.get("private-colme"), {"schedule": schedule}, t_max=80):
        assert ("slot batches" in runs) == batched
        assert runs["windows"].simulation.network.dropped.sum() > 0


@pytest.mark.parametrize(
    "protocol, params",
    [
        ("c-colme", {}),
        ("private-c-colme", {"epsilon": 5.0, "rule": "optimistic", "values": "stale"}),
    ],
)
def test_ccolme_modes(protocol, params):
    check_modes(
        PROTOCOLS.get(protocol),
        params,
        networks=NETWORKS,
        data=("classes", {"agents": 16, "class_means": [0.0, 1.0], "distribution": "gaussian"}),
        topology=("regular", {"degree": 4}),
        t_max=60,
        state=("kept",),
    )


def test_pricer_modes():
    check_modes(
        PROTOCOLS.get("pricer"),
        {"epsilon_low": 2.0, "trust": "ring", "trusted": 1, "relay_deadline": 1.25},
        networks=[
            {"latency": {"model": "exponential", "mean": 0.6}},
            {
                "latency": {"model": "lognormal", "mean": 1.0, "cv": 2.0},
                "outages": {"model": "markov", "mean_up": 6.0, "mean_down": 2.0},
                "stragglers": {"fraction": 0.3, "slowdown": 3.0},
            },
        ],
        data=("vectors", {"agents": 8, "dimension": 5, "radius": 2.0, "distribution": "normal"}),
        base=build(BernoulliLinks, {"p_server": [0.9, 0.5] * 4, "p_link": 0.7}, "network"),
        t_max=40,
        metrics=("pricer",),
    )


@pytest.mark.parametrize(
    "protocol, data",
    [
        ("eb-gaussian", ("hierarchical-gaussian", {"agents": 16, "sigma_theta": 0.2})),
        ("eb-bernoulli", ("bernoulli-prior", {"agents": 16, "prior": "beta"})),
        ("eb-mixture", ("classes", {"agents": 18, "class_means": [0.2, 0.5, 0.8]})),
    ],
)
def test_eb_modes(protocol, data):
    check_modes(
        PROTOCOLS.get(protocol),
        {"round": 1, "deadline": 1.5},
        networks=NETWORKS,
        data=data,
        t_max=50,
        metrics=("eb",),
    )


def test_the_bundled_families_declare_their_modes_as_types():
    for name in ("c-colme", "private-c-colme", "pricer", "eb-gaussian", "eb-mixture"):
        cls = PROTOCOLS.get(name)
        assert issubclass(cls, WindowSafe) and not issubclass(cls, SlotBatched), name
    assert issubclass(PROTOCOLS.get("private-colme"), SlotBatched)
    assert not issubclass(PROTOCOLS.get("local"), WindowSafe)
