"""A rewiring's new graph is made by editing the old one's CSR arrays, and a schedule keeps each
change's link keys for the next draw (`desim.topologies.dynamic`): the same draws, in the same
order, and the same graphs as the rewiring's definition (drop round(q·|E|) uniform links, link
as many uniform non-links, the graph of that link set), checked here against a reference that
builds every graph from its link set."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.topologies.dynamic import Dynamics, Rewire, link_keys, moved_links, rewired
from desim.topologies.generators import ErdosRenyi, RandomRegular
from desim.topologies.graph import Graph


def _reference(graph: Graph, fraction: float, rng: np.random.Generator) -> Graph:
    """The rewiring's definition, drawn as `rewired` draws: the links dropped (one draw without
    replacement), then pairs k of the upper triangle in batches, new non-links kept in draw
    order; the new graph built from its whole link set."""
    n, keys = graph.n, link_keys(graph)
    m = moved_links(graph, fraction)
    dropped = np.sort(rng.choice(len(keys), size=m, replace=False))
    triangle = np.arange(n + 1) * (np.arange(n + 1) - 1) // 2  # pairs below column j
    fresh: list[int] = []
    while len(fresh) < m:
        k = rng.integers(0, n * (n - 1) // 2, size=2 * (m - len(fresh)) + 8)
        j = np.searchsorted(triangle, k, side="right") - 1
        for key in (k - triangle[j]) * n + j:
            if key not in keys and key not in fresh:
                fresh.append(int(key))
    links = np.concatenate([np.delete(keys, dropped), np.asarray(fresh[:m], dtype=np.int64)])
    return Graph.from_edges(n, links // n, links % n)


def _same(a: Graph, b: Graph) -> None:
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 40),
    p=st.floats(0.01, 0.9),
    fraction=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**16),
)
def test_a_rewired_graph_is_the_graph_of_its_link_set_drawn_in_the_same_order(n, p, fraction, seed):
    g = ErdosRenyi(p=p).make(n, np.random.default_rng(seed))
    free = n * (n - 1) // 2 - g.n_links
    if g.n_links == 0 or moved_links(g, fraction) > free:
        return
    _same(
        rewired(g, fraction, np.random.default_rng(seed)),
        _reference(g, fraction, np.random.default_rng(seed)),
    )


def test_a_schedules_graphs_are_the_chained_rewirings_of_one_stream():
    # the schedule keeps each change's link keys for the next draw: the same graphs as each
    # drawn from its graph alone, and a rewired 10-regular graph becomes irregular
    g = RandomRegular(degree=10).make(500, np.random.default_rng(3))
    schedule = Dynamics(rewire=Rewire(every=10, fraction=0.1)).schedule(
        g, 100, lambda: np.random.default_rng(11)
    )
    rng, expected = np.random.default_rng(11), g
    for t in schedule.times:
        new, added, dropped = schedule.change(int(t))
        before, expected = expected, _reference(expected, 0.1, rng)
        _same(new, expected)
        assert len(added) == len(dropped) == 250  # round(0.1 · 2500)
        assert not np.isin(added[:, 0] * 500 + added[:, 1], link_keys(before)).any()
        assert np.isin(dropped[:, 0] * 500 + dropped[:, 1], link_keys(before)).all()
    assert expected.degree.min() < 10 < expected.degree.max()
