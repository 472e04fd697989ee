"""A graph change's compiled passes (`colme.change_kernels`, `topologies.rewire_kernels`) give
the numpy paths' integers: the new graph's pair numbering, the map of the pairs kept, the
rewiring draw's graph and link keys, and whole runs on a rewired graph."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import desim
from desim.kernel.plugins import load_plugins
from desim.models.colme import change_kernels
from desim.models.colme.compiled import CompiledPairs
from desim.models.colme.graph import EdgeBeliefs, Neighbours
from desim.models.colme.rewire import _Carry, carried
from desim.study.scenario import Scenario
from desim.topologies import dynamic
from desim.topologies.generators import ErdosRenyi, RandomRegular
from desim.topologies.graph import Graph

pytest.importorskip("numba")
load_plugins()

DATA = {"model": "classes", "class_means": [0.2, 0.4, 0.8], "sigma": 0.5, "agents": 40}
REWIRED = {"model": "regular", "degree": 4, "rewire": {"every": 5, "fraction": 0.3}}
NUMBERING = ("below", "csr_pairs", "src", "dst", "_rr", "following", "numbers", "floats")


def _assert_same_numbering(graph: Graph) -> None:
    """`Neighbours` of `graph` laid out by the kernel and by numpy: the same arrays."""
    plain, fast = Neighbours(graph), Neighbours(graph, compiled=True, previous=Neighbours(graph))
    for name in NUMBERING:
        x, y = getattr(plain, name), getattr(fast, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)
    if fast.ahead is not None:  # (RR's rows: the next pair and its neighbour)
        np.testing.assert_array_equal(fast.ahead[:, 0], plain.following)
        np.testing.assert_array_equal(fast.ahead[:, 1], plain.dst[plain.following])


def _chain(graph: Graph, changes: int, fraction: float, seed: int) -> list[Graph]:
    """`graph` and its next `changes` rewirings (the numpy draw)."""
    rng, out, keys = np.random.default_rng(seed), [graph], None
    for _ in range(changes):
        new, _, _, keys = dynamic._rewiring(out[-1], fraction, rng, keys)
        out.append(new)
    return out


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 60), p=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_the_compiled_numbering_is_numpys_on_any_graph(n, p, seed):
    _assert_same_numbering(ErdosRenyi(p=p).make(n, np.random.default_rng(seed)))


def test_the_compiled_numbering_is_numpys_on_rewired_regular_graphs():
    for graph in _chain(RandomRegular(degree=6).make(200, np.random.default_rng(3)), 5, 0.3, 4):
        _assert_same_numbering(graph)


def test_a_degree_beyond_the_counting_keys_takes_the_numpy_layout():
    star = Graph.from_edges(1100, np.zeros(1099, dtype=np.int64), np.arange(1, 1100))
    _assert_same_numbering(star)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(3, 50),
    p=st.floats(0.05, 0.9),
    fraction=st.floats(0.05, 1.0),
    seed=st.integers(0, 2**16),
)
def test_the_compiled_carry_map_is_carried(n, p, fraction, seed):
    g = ErdosRenyi(p=p).make(n, np.random.default_rng(seed))
    if g.n_links == 0 or dynamic.moved_links(g, fraction) > n * (n - 1) // 2 - g.n_links:
        return
    old, new = Neighbours(g), Neighbours(dynamic.rewired(g, fraction, np.random.default_rng(seed)))
    fast, gone, gone_src = _Carry.merged(old, new)
    plain = _Carry(carried(old, new))
    for name in ("index", "new", "fresh"):
        x, y = getattr(fast, name), getattr(plain, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)
    assert fast.any_kept == plain.any_kept
    lost = np.ones(old.n_pairs, dtype=bool)
    lost[plain.index[~plain.new]] = False
    assert gone.dtype == np.int64
    # the lost pairs in CSR order (the ledger's integer sums do not depend on it)
    np.testing.assert_array_equal(gone, old.csr_pairs[lost[old.csr_pairs]])
    np.testing.assert_array_equal(gone_src, old.src[gone])


def test_compiled_beliefs_carry_gives_numpys_beliefs_and_counts():
    g = ErdosRenyi(p=0.2).make(50, np.random.default_rng(8))
    old, new = Neighbours(g), Neighbours(dynamic.rewired(g, 0.4, np.random.default_rng(9)))
    flat = np.random.default_rng(10).random(old.n_pairs) < 0.6
    carry, *_ = _Carry.merged(old, new)
    plain = np.ones(new.n_pairs, dtype=bool)
    carry.into(plain, flat)
    fast, counts = np.ones(new.n_pairs, dtype=bool), np.zeros(new.n, dtype=np.int64)
    args = carry.index, carry.new, new.indptr, new.csr_pairs, counts
    change_kernels.carried_beliefs(fast, flat, *args)
    np.testing.assert_array_equal(fast, plain)
    np.testing.assert_array_equal(counts, EdgeBeliefs(plain, new).n_included)


@pytest.mark.parametrize("topology", ["regular", "erdos-renyi"])
def test_compiled_and_numpy_draws_give_the_same_graphs_and_keys(monkeypatch, topology):
    rng = np.random.default_rng(11)
    g = (
        RandomRegular(degree=8).make(300, rng)
        if topology == "regular"
        else ErdosRenyi(p=0.05).make(300, rng)
    )
    monkeypatch.setattr(dynamic, "COMPILED_ABOVE", 0)
    runs = []
    for compiled in ("1", "0"):
        monkeypatch.setenv("DESIM_COMPILED", compiled)
        rng, graph, keys, out = np.random.default_rng(5), g, None, []
        for fraction in (0.1, 0.5, 1.0, 0.02):
            graph, added, lost, keys = dynamic._rewiring(graph, fraction, rng, keys)
            out += [graph.indptr, graph.indices, added, lost, keys]
        runs.append(out)
    for x, y in zip(*runs, strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


def test_a_draw_that_meets_its_own_and_existing_links_keeps_the_first_new_ones():
    # a tiny dense graph: most candidates are links already or drawn twice
    g = ErdosRenyi(p=0.7).make(12, np.random.default_rng(2))
    cand = np.random.default_rng(3).integers(0, 66, size=200)
    from desim.topologies import rewire_kernels
    from desim.topologies.generators import _pair_from_index

    i, j = _pair_from_index(cand)
    keys, fresh = dynamic.link_keys(g), (i * 12 + j)[:3]
    fresh = fresh[~np.isin(fresh, keys)]
    want = dynamic._first_new(i * 12 + j, keys, fresh)
    got = rewire_kernels.first_new(i * 12 + j, g.indptr, g.indices, fresh)
    np.testing.assert_array_equal(got, want)
    for most in range(len(want) + 2):  # the first `most` of them, the rest not looked at
        got = rewire_kernels.first_new(i * 12 + j, g.indptr, g.indices, fresh, most)
        np.testing.assert_array_equal(got, want[:most])


def _rewired_run(params: dict, **options: Any) -> Any:
    """Private-ColME over its neighbours on the rewired graph, 40 slots, with `params`."""
    scenario = Scenario(
        protocol="private-colme",
        topology=REWIRED,
        seed=3,
        data=DATA,
        params={"peers": "topology", **params},
        t_max=40,
        **options,
    )
    return desim.run(scenario)


@pytest.mark.parametrize(
    "params", [{}, {"schedule": "rrr"}, {"mechanism": "pm2"}, {"forget": {"window": 10}}]
)
def test_runs_on_a_rewired_graph_give_the_same_bytes_both_ways(monkeypatch, params):
    monkeypatch.setattr(CompiledPairs, "above", 0)
    monkeypatch.setattr(dynamic, "COMPILED_ABOVE", 0)
    runs = []
    for compiled in ("1", "0"):
        monkeypatch.setenv("DESIM_COMPILED", compiled)
        out = _rewired_run(params, checkpoints=4, per_agent=True, metrics=("accuracy", "privacy"))
        runs.append((out.metrics["value"].to_numpy(float), out.agents.to_numpy()))
    for x, y in zip(*runs, strict=True):
        np.testing.assert_array_equal(x, y)


def test_rr_over_a_compiled_layout_takes_the_numpy_targets_slot_after_slot():
    # an irregular graph: RR's next pairs and neighbours from `ahead` rows in one kernel,
    # against the numpy look-ups of `following` and `dst`, over more slots than any degree
    from desim.models.colme.graph import NeighbourRoundRobin

    g = _chain(RandomRegular(degree=6).make(300, np.random.default_rng(5)), 3, 0.3, 6)[-1]
    plain, fast = Neighbours(g), Neighbours(g, compiled=True)
    assert plain.ahead is None and fast.ahead is not None and fast.min_degree() < 6
    rr_plain, rr_fast = NeighbourRoundRobin(plain), NeighbourRoundRobin(fast)
    assert rr_fast._step is not None
    for t in [*range(1, 40), 45, 46, 47]:  # (45: not the next slot, the table's look-up)
        for x, y in zip(rr_plain.targets(t), rr_fast.targets(t), strict=True):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)


def test_the_checkpoints_sums_on_a_compiled_layout_make_no_querier_of_every_pair(monkeypatch):
    # ``last`` PM-I above `incremental_above`: the sums read the CSR arrays, not `src`, which a
    # compiled layout makes only when read (every pair's querier, scattered: a change's cost)
    from desim.models.colme.protocol import PrivateColME

    monkeypatch.setattr(CompiledPairs, "above", 0)
    monkeypatch.setattr(dynamic, "COMPILED_ABOVE", 0)
    monkeypatch.setattr(PrivateColME, "incremental_above", 0)
    made: list[int] = []  # (reads on a compiled layout: the set-up one is numpy's, with `src`)
    src = Neighbours.__dict__["src"].func

    def counted(nb: Neighbours) -> np.ndarray:
        made.extend([nb.n] if nb.ahead is not None else [])
        return src(nb)

    monkeypatch.setattr(Neighbours, "src", property(counted))
    out = _rewired_run({}, checkpoints=8, metrics=("accuracy",))
    assert len(out.metrics) > 0 and made == []
