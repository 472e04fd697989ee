"""Private-ColME's forgetting over links that are not ideal makes the releases of the run
without ``forget`` drawn with the same streams: a window only reads releases already made, so
with the same losses, delays and DP noise the same queries are lost, the same releases late."""

from __future__ import annotations

import dp_accounting  # noqa: F401  (the privacy metric's; imported once here, not in a test)
import numpy as np
import pandas as pd
import pytest

from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.study.scenario import Scenario, run

load_plugins()
DATA = {"model": "classes", "agents": 8, "class_means": [0.2, 0.8], "sigma": 0.5}
BERNOULLI = {"links": "bernoulli", "p_link": 0.7}
LATENCY = {"links": "ideal", "latency": {"model": "exponential"}}
LOSSY = {**BERNOULLI, "latency": {"model": "exponential"}}
GRAPH = ("topology", {"model": "regular", "degree": 3})
EVERY = ("all", None)
#: What the releases made decide: messages sent and lost, the ledger, repeats, stale, late.
RELEASES = ("messages_", "dropped_", "eps", "repeated", "stale", "timed_out")


def _scenario(params: dict, network: dict, peers: tuple, seed: int = 0) -> Scenario:
    return Scenario(
        protocol="private-colme",
        params={"mechanism": "pm1", "peers": peers[0], **params},
        data=DATA,
        network=network,
        t_max=40,
        seed=seed,
        checkpoints=8,
        topology=peers[1],
        metrics=("privacy", "colme-async"),
    )


def _same_streams(plain: Scenario, other: Scenario):
    """(plain's metrics, other's metrics), both drawn with plain's streams (a scenario's own
    key covers every parameter, `forget` too)."""
    streams = Streams(plain.seed, plain.replicate, plain.shared_key, plain.run_key)
    again = Streams(plain.seed, plain.replicate, plain.shared_key, plain.run_key)
    return run(plain, streams).metrics, run(other, again).metrics


def _releases(metrics: pd.DataFrame) -> pd.DataFrame:
    keep = metrics.metric.str.startswith(RELEASES)
    return metrics[keep].reset_index(drop=True)


@pytest.mark.parametrize("forget", [{"window": 6}, {"window": 15}, {"reset": 12}])
@pytest.mark.parametrize("network", [BERNOULLI, LATENCY, LOSSY])
@pytest.mark.parametrize("peers", [GRAPH, EVERY])
@pytest.mark.parametrize("seed", [0, 1])
def test_over_links_that_are_not_ideal_forget_makes_the_releases_without(
    forget, network, peers, seed
):
    """Messages sent and lost, repeats, stale and late releases, and every ε of the ledger are
    those of the run without ``forget`` (a static 3-regular graph of 8 agents, and every
    peer)."""
    plain, forgets = _same_streams(
        _scenario({}, network, peers, seed), _scenario({"forget": forget}, network, peers, seed)
    )
    ours = _releases(plain)
    assert ours.metric.str.startswith("messages_release").any()
    assert ours.metric.str.startswith("eps").any()
    pd.testing.assert_frame_equal(ours, _releases(forgets), check_exact=True)


@pytest.mark.parametrize("network", [BERNOULLI, LOSSY])
@pytest.mark.parametrize("peers", [GRAPH, EVERY])
def test_a_window_longer_than_the_run_draws_the_noise_of_the_run_without(network, peers):
    """W ≥ t_max is T over every release (T^W = t_j R_j / t_j): with the same losses, delays
    and DP noise the MSE is the one without ``forget`` up to the rounding of t_j R_j / t_j."""
    plain, window = _same_streams(
        _scenario({}, network, peers), _scenario({"forget": {"window": 40}}, network, peers)
    )
    assert list(plain.metric) == list(window.metric)
    np.testing.assert_allclose(window.value.to_numpy(), plain.value.to_numpy(), rtol=1e-9)
