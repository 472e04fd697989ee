"""The shortcuts of Private-ColME on a graph give what the direct forms give: RR's stepped
cursor the edges of `Neighbours.edge` in any slot order, a release named by its flat pair
the release named by (b, a), with the same draws; pairs numbered by RR position name every
edge once, a slot's pairs on a regular graph are one block, and the beliefs' counts follow
every revision; every agent's checkpoint sums at once are each agent's in turn, bit for bit."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from desim.models.colme.graph import NeighbourRoundRobin, Neighbours, edge_row_sums
from desim.models.colme.pairs import ClassBeliefs
from desim.models.colme.statistic import PairStatistic
from desim.models.colme.view import OneSlot, every_agent
from desim.models.privacy.calibration import sample_noise
from desim.models.privacy.release import PSumRelease
from desim.topologies.generators import RandomRegular
from desim.topologies.graph import Graph

IRREGULAR = Graph.from_edges(6, np.array([0, 0, 0, 1, 2, 3, 4]), np.array([1, 2, 3, 2, 4, 5, 5]))


def test_rr_over_neighbours_gives_the_same_edges_in_any_slot_order():
    # degrees 1 to 4, so each querier's cursor wraps at its own degree
    g = Graph.from_edges(6, np.array([0, 0, 0, 1, 2, 3, 4]), np.array([1, 2, 3, 2, 4, 5, 5]))
    nb = Neighbours(g)
    stepped = NeighbourRoundRobin(nb)
    for t in [1, 2, 3, 4, 5, 9, 10, 11, 3, 4, 12]:  # in order, then jumps back and forth
        a, b, e = stepped.targets(t)
        np.testing.assert_array_equal(e, nb.edge(a, (t - 1) % nb.degree[a] + 1))
        np.testing.assert_array_equal(b, nb.dst[e])


@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
def test_a_release_named_by_its_flat_pair_is_the_release_named_by_b_and_a(mechanism):
    side, rounds = 5, 6
    by_agents, by_pair = (
        PSumRelease(side, mechanism, "gaussian", 0.3, np.random.default_rng(4), rounds)
        for _ in range(2)
    )
    b, a = np.array([0, 2, 4, 1]), np.array([1, 2, 0, 4])
    sums, counts = np.array([1.0, 2.0, -0.5, 3.0]), np.full(4, 2.0)
    for _ in range(rounds):
        got = by_agents.release(b, a, sums, counts)
        again = by_pair.release(None, None, sums, counts, pair=b * side + a)
        for x, y in zip(got, again, strict=True):
            np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(by_agents.count, by_pair.count)


@pytest.mark.parametrize(
    "graph", [IRREGULAR, RandomRegular(degree=4).make(30, np.random.default_rng(2))]
)
def test_pairs_name_every_directed_edge_once_in_rr_order(graph):
    nb = Neighbours(graph)
    assert sorted(nb.csr_pairs) == list(range(graph.n_directed))
    np.testing.assert_array_equal(nb.src[nb.csr_pairs], graph.src)
    np.testing.assert_array_equal(nb.dst[nb.csr_pairs], graph.dst)
    for a in range(graph.n):  # RR position k: the k-th neighbour from the first above a
        row = graph.dst[graph.indptr[a] : graph.indptr[a + 1]]
        rr = np.concatenate((row[row > a], row[row < a]))
        for k, b in enumerate(rr, start=1):
            e = nb.edge(np.array([a]), np.array([k]))
            assert (nb.src[e][0], nb.dst[e][0]) == (a, b)
            # block k − 1 holds position k of every agent of degree ≥ k, in agent order
            assert nb.block[k - 1] <= e[0] < nb.block[k]


def test_a_slot_on_a_regular_graph_is_one_block_of_pairs():
    nb = Neighbours(RandomRegular(degree=4).make(30, np.random.default_rng(2)))
    rr = NeighbourRoundRobin(nb)
    for t in range(1, 10):
        a, b, e = rr.targets(t)
        first = nb.block[(t - 1) % 4]
        np.testing.assert_array_equal(e, np.arange(first, first + 30))
        np.testing.assert_array_equal(e, nb.edge(a, np.full(30, (t - 1) % 4 + 1)))
        np.testing.assert_array_equal(b, nb.dst[e])


def test_revised_beliefs_keep_their_counts():
    rng = np.random.default_rng(5)
    m = 7
    beliefs = ClassBeliefs(np.ones((m, m), dtype=bool))
    for _ in range(20):
        a = rng.permutation(m)[:4]
        b = rng.integers(0, m, 4)
        decision = rng.random(4) < 0.5
        beliefs.revise(a, b, decision)
        np.testing.assert_array_equal(beliefs.included[a, b], decision)
        np.testing.assert_array_equal(beliefs.n_included, beliefs.included.sum(axis=1))


@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
def test_a_release_of_a_run_of_pairs_is_the_release_of_their_indices(mechanism):
    by_index, by_run = (
        PSumRelease(4, mechanism, "gaussian", 0.3, np.random.default_rng(4), 6) for _ in range(2)
    )
    sums, counts = np.array([1.0, 2.0, -0.5, 3.0, 0.25]), np.full(5, 2.0)
    for start in [3, 3, 0, 11, 3]:  # runs that repeat and overlap
        got = by_index.release(None, None, sums, counts, pair=np.arange(start, start + 5))
        again = by_run.release(None, None, sums, counts, pair=slice(start, start + 5))
        for x, y in zip(got, again, strict=True):
            np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(by_index.count, by_run.count)


def test_a_run_of_pairs_is_found_only_in_a_view_of_the_pair_numbers():
    nb = Neighbours(RandomRegular(degree=4).make(30, np.random.default_rng(2)))
    assert nb.span(nb.numbers[5:35]) == slice(5, 35)
    assert nb.span(nb.floats[40:70]) == slice(40, 70)
    assert nb.span(nb.floats[40:70][:, None][:, 0]) == slice(40, 70)  # a payload's column
    assert nb.span(np.arange(5, 35)) is None  # equal values, but not known without a pass
    assert nb.span(nb.numbers[5:35:2]) is None
    assert nb.span(nb.numbers) is None


def test_beliefs_revised_by_a_run_of_pairs_are_those_revised_by_its_indices():
    rng = np.random.default_rng(6)
    by_index, by_run = (ClassBeliefs(np.ones((6, 6), dtype=bool)) for _ in range(2))
    for _ in range(10):
        start = int(rng.integers(0, 30))
        a = np.arange(start, start + 6) // 6
        decision = rng.random(6) < 0.5
        by_index.revise_pairs(a, np.arange(start, start + 6), decision)
        by_run.revise_pairs(a, slice(start, start + 6), decision)
        np.testing.assert_array_equal(by_index.included, by_run.included)
        np.testing.assert_array_equal(by_index.n_included, by_run.n_included)


def test_gaussian_p_sum_noise_has_the_bits_of_rng_normal():
    for sigma2 in [0.0, 1e-300, 0.3, 4e6]:
        direct, ours = np.random.default_rng(9), np.random.default_rng(9)
        want = direct.normal(0.0, np.sqrt(sigma2), 10_000)
        got = sample_noise(ours, "gaussian", sigma2, 10_000)
        np.testing.assert_array_equal(want.view(np.int64), got.view(np.int64))
        assert direct.random() == ours.random()  # the same draws consumed


def _graph_protocol(seed: int, known: bool, taken: float = 2 / 3):
    """The parts of a Private-ColME run on a 6-regular graph of 40 agents that its combination
    sums read, after releases to a random fraction `taken` of the pairs (the rest never)."""
    rng = np.random.default_rng(seed)
    nb = Neighbours(RandomRegular(degree=6).make(40, rng))
    stat = PairStatistic(40, "pm1", "last", 0.7, 1, n_pairs=nb.n_pairs)
    pair = rng.permutation(nb.n_pairs)[: round(taken * nb.n_pairs)]
    t = rng.integers(1, 9, len(pair)).astype(float)
    values = rng.normal(0.0, 1.0, len(pair)) * t
    values[:5] = -0.0  # a −0.0 block sum, kept as +0.0 (0 + R)
    stat.update(nb.src[pair], nb.dst[pair], values, t, rng.integers(1, 4, len(pair)), pair=pair)
    return SimpleNamespace(
        graph=nb,
        stat=stat,
        known=known,
        sigma2=rng.uniform(0.1, 1.0, 40),
        sigma2_dp=0.7,
        v_hat=None if known else np.where(rng.random(nb.n_pairs) < 0.2, np.inf, 0.5),
        beliefs=SimpleNamespace(flat=rng.random(nb.n_pairs) < 0.6),
        incremental_above=10,
    )


@pytest.mark.parametrize(("known", "taken"), [(True, 2 / 3), (False, 2 / 3), (True, 1.0)])
def test_every_agents_combination_sums_are_those_of_each_agent_in_turn(known, taken):
    # every agent at once (buffers kept between checkpoints, masks by bits) against the rows
    # named one by one (new arrays, masked copies): the same sums in the same order, bit for bit
    p = _graph_protocol(3, known, taken)
    for _ in range(2):  # the second call reuses the first call's buffers
        every = edge_row_sums(p, slice(None))
        rows = edge_row_sums(p, np.arange(40))
        for x, y in zip(every, rows, strict=True):
            np.testing.assert_array_equal(x.view(np.int64), y.view(np.int64))


def test_last_pm1_columns_are_the_pair_columns():
    p = _graph_protocol(4, True)
    noise = np.empty(p.graph.n_pairs)
    kappa, total, data = p.stat.last_pm1_columns(noise)
    n, total2, data2, noise2 = p.stat.pair_columns(slice(None))
    np.testing.assert_array_equal(kappa > 0, n > 0)
    for x, y in [(total, total2), (data, data2), (noise, noise2)]:
        np.testing.assert_array_equal(x.view(np.int64), y.view(np.int64))


def test_every_agent_reads_a_view_and_other_agents_a_gather():
    sums, sumsq, counts = np.arange(5.0), np.arange(5.0) ** 2, np.full(5, 3.0)
    view = OneSlot(sums, sumsq, counts)
    got = view.own(every_agent(5), view.slots(None, 5))
    np.testing.assert_array_equal(got[0], sums)
    np.testing.assert_array_equal(got[1], sumsq)
    assert not got[0].flags.writeable  # the owner's array, never written through the view
    assert view.sums_of(np.arange(5), view.slots(None, 5)).flags.writeable  # a gather's copy
    assert every_agent(5) is every_agent(5)
    assert Neighbours(RandomRegular(degree=4).make(30, np.random.default_rng(2))).querying is (
        every_agent(30)
    )
