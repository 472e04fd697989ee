"""The shortcuts of Private-ColME on a graph give what the direct forms give: RR's stepped
cursor the edges of `Neighbours.edge` in any slot order, and a release named by its flat pair
the release named by (b, a), with the same draws."""

from __future__ import annotations

import numpy as np
import pytest

from desim.models.colme.graph import NeighbourRoundRobin, Neighbours
from desim.models.privacy.release import PSumRelease
from desim.topologies.graph import Graph


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
