"""The pair numbering of `desim.models.colme.graph.Neighbours` (RR position, then the querier's
degree, then the querier) from one radix sort of a 16-bit key where it fits and two stable
sorts where it does not (a degree of 256 or more), and RR's next pair (`following`)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.models.colme.graph import Neighbours
from desim.topologies.generators import ErdosRenyi
from desim.topologies.graph import Graph


def _positions(g: Graph) -> np.ndarray:
    """The RR position (from 0) of every CSR edge: its place in a's row from the first
    neighbour above a, cyclic."""
    place = np.arange(g.n_directed) - g.indptr[g.src]
    below = np.bincount(g.src[g.dst < g.src], minlength=g.n)
    return (place - below[g.src]) % np.maximum(g.degree[g.src], 1)


def _check(g: Graph) -> None:
    nb = Neighbours(g)
    position = _positions(g)
    order = np.lexsort((g.src, g.degree[g.src], position))
    np.testing.assert_array_equal(nb.src, g.src[order])
    np.testing.assert_array_equal(nb.dst, g.dst[order])
    # block q: the first pair at RR position q + 1
    np.testing.assert_array_equal(
        nb.block, np.concatenate(([0], np.cumsum(np.bincount(position, minlength=1))))
    )
    # RR's next pair: the same querier's neighbour at the next position, cyclic
    a = nb.src
    np.testing.assert_array_equal(
        nb.following, nb.edge(a, position[order] + 2)
    )  # (positions from 1: the next is + 2)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), p=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_pairs_and_rr_next_pair_on_random_graphs(n, p, seed):
    _check(ErdosRenyi(p=p).make(n, np.random.default_rng(seed)))


def test_a_degree_above_255_takes_the_two_sorts_and_numbers_the_same():
    # a hub linked to 300 agents, a ring among them: position · top + degree exceeds 16 bits
    n = 301
    u = np.concatenate([np.zeros(n - 1, dtype=np.int64), np.arange(1, n)])
    v = np.concatenate([np.arange(1, n), np.arange(2, n + 1) % n + (np.arange(2, n + 1) == n)])
    g = Graph.from_edges(n, u, v)
    assert g.degree.max() == 300
    _check(g)
