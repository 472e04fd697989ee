"""Private-ColME on an irregular graph: the compiled per-pair update (`colme.compiled`) and RR's
next-neighbour look-up give the numpy path's bytes, on static and on changing graphs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import desim
from desim.kernel.plugins import load_plugins
from desim.models.colme.compiled import CompiledPairs
from desim.models.colme.graph import NeighbourRoundRobin, Neighbours
from desim.models.colme.pair_kernels import (
    CompiledRelease,
    CompiledStatistic,
    revise_pairs,
)
from desim.models.colme.pairs import revise
from desim.models.colme.statistic import PairStatistic
from desim.models.privacy.release import PSumRelease
from desim.study.scenario import Scenario
from desim.topologies.generators import ErdosRenyi

load_plugins()

DATA = {"model": "classes", "class_means": [0.2, 0.4, 0.8], "sigma": 0.5}
ER = {"model": "erdos-renyi", "p": 0.15}
REWIRED = {"model": "regular", "degree": 4, "rewire": {"every": 5, "fraction": 0.3}}
LATENCY = {"links": "ideal", "latency": {"model": "exponential", "mean": 1.0}}
LOSS = {"links": "bernoulli", "p_link": 0.8}


def _run(topology: dict, params: dict, network: dict | None = None, agents: int = 40):
    """Metrics and per-agent errors of one Private-ColME run on `topology` (T = 40)."""
    kwargs = {"network": network} if network is not None else {}
    out = desim.run(
        Scenario(
            protocol="private-colme",
            topology=topology,
            seed=7,
            data={**DATA, "agents": agents},
            params={"peers": "topology", **params},
            t_max=40,
            checkpoints=4,
            per_agent=True,
            metrics=("accuracy", "privacy", "colme-async"),
            **kwargs,
        )
    )
    return out.metrics["value"].to_numpy(float), out.agents.to_numpy()


def _same_both_ways(monkeypatch, *args, **kwargs) -> None:
    """The run with the compiled kernels and with the numpy path give the same bytes."""
    monkeypatch.setattr(CompiledPairs, "above", 0)  # (small populations take them too)
    monkeypatch.setenv("DESIM_COMPILED", "1")
    compiled = _run(*args, **kwargs)
    monkeypatch.setenv("DESIM_COMPILED", "0")
    plain = _run(*args, **kwargs)
    for x, y in zip(compiled, plain, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"mechanism": "pm2"},
        {"schedule": "rrr"},
        {"budget": {"epsilon": 3.0}},
        {"forget": {"window": 10}},
        {"noise": "laplace"},
    ],
    ids=["pm1-rr", "pm2", "rrr", "budget", "forget", "laplace"],
)
@pytest.mark.parametrize("topology", [ER, REWIRED], ids=["erdos-renyi", "rewired"])
def test_compiled_and_numpy_runs_give_the_same_bytes(monkeypatch, topology, params):
    _same_both_ways(monkeypatch, topology, params)


@pytest.mark.parametrize("network", [LATENCY, LOSS], ids=["latency", "loss"])
@pytest.mark.parametrize("schedule", ["rr", "rrr"])
def test_compiled_and_numpy_runs_give_the_same_bytes_over_links(monkeypatch, network, schedule):
    _same_both_ways(monkeypatch, REWIRED, {"schedule": schedule}, network)


def test_compiled_and_numpy_runs_give_the_same_bytes_above_a_thousand_agents(monkeypatch):
    # (above `incremental_above` the estimates sum edge by edge: the other summation path)
    _same_both_ways(monkeypatch, {"model": "erdos-renyi", "p": 0.01}, {}, agents=1200)


def _pairs(rng: np.random.Generator, n_pairs: int, k: int) -> np.ndarray:
    """k distinct pair indices among n_pairs, in a random order."""
    return rng.permutation(n_pairs)[:k].astype(np.int64)


@settings(max_examples=30, deadline=None)
@given(n_pairs=st.integers(1, 300), seed=st.integers(0, 2**16), rounds=st.integers(1, 4))
def test_the_kernels_give_the_numpy_updates_bytes(n_pairs, seed, rounds):
    rng = np.random.default_rng(seed)
    mechs = [
        cls(isqrt_side(n_pairs), "pm1", "gaussian", 0.7, np.random.default_rng(seed), 100)
        for cls in (PSumRelease, CompiledRelease)
    ]
    stats = [
        cls(4, "pm1", "last", 0.7, 7, n_pairs=n_pairs) for cls in (PairStatistic, CompiledStatistic)
    ]
    flats = [rng.random(n_pairs) < 0.5 for _ in range(2)]
    flats[1][:] = flats[0]
    counts = [np.zeros(5, dtype=np.int64) for _ in range(2)]
    for r in range(rounds):
        k = int(rng.integers(0, n_pairs + 1))
        pair = _pairs(rng, n_pairs, k)
        sums, t = rng.normal(size=k), np.full(k, float(r + 1))
        outs = [m.release(None, None, sums, t, pair=pair) for m in mechs]
        for x, y in zip(*outs, strict=True):
            np.testing.assert_array_equal(x, y)
        values, j, _ = outs[0]
        updates = [s.update(None, None, values, t, j.astype(np.int64), True, pair) for s in stats]
        for x, y in zip(*updates, strict=True):
            np.testing.assert_array_equal(x, y)
        a = rng.integers(0, 5, size=k)
        decision = rng.random(k) < 0.5
        revise(flats[0], counts[0], a, pair, decision)
        revise_pairs(flats[1], counts[1], a, pair, decision)
    np.testing.assert_array_equal(mechs[0].count, mechs[1].count)
    for x, y in zip(*(s.pair_columns(slice(None)) for s in stats), strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(flats[0], flats[1])
    np.testing.assert_array_equal(counts[0], counts[1])


def isqrt_side(n_pairs: int) -> int:
    """The side of the mechanisms' square over `n_pairs` pairs (as the protocol sizes it)."""
    return max(1, int(np.ceil(np.sqrt(n_pairs))))


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(2, 40),
    p=st.floats(0.05, 1.0),
    seed=st.integers(0, 2**16),
    slots=st.lists(st.integers(1, 60), min_size=1, max_size=12),
)
def test_rr_on_an_irregular_graph_asks_each_neighbour_in_turn(n, p, seed, slots):
    nb = Neighbours(ErdosRenyi(p=p).make(n, np.random.default_rng(seed)))
    rr = NeighbourRoundRobin(nb)
    for t in sorted(slots) + [max(slots) + 1, max(slots) + 2]:  # jumps, then slot after slot
        a, b, e = rr.targets(t)
        d = nb.degree[a]
        np.testing.assert_array_equal(e, nb.edge(a, (t - 1) % np.maximum(d, 1) + 1))
        np.testing.assert_array_equal(nb.src[e], a)
        np.testing.assert_array_equal(b, nb.dst[e])


def test_a_slot_on_an_irregular_graph_is_a_run_of_pairs_per_degree():
    nb = Neighbours(ErdosRenyi(p=0.2).make(60, np.random.default_rng(3)))
    rr = NeighbourRoundRobin(nb)
    for t in range(1, 12):
        a, _, e = rr.targets(t)
        for d in np.unique(nb.degree[a]):
            run = np.sort(e[nb.degree[a] == d])
            np.testing.assert_array_equal(np.diff(run), 1)
