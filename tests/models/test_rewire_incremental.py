"""A graph change moves Private-ColME's pair state by the change itself
(`desim.models.colme.rewire.carried_by_change`, one gather per array): the same arrays, bit for
bit, as a rebuild from scratch that looks every new pair's link up among the old pairs."""

from __future__ import annotations

import numpy as np
import pytest
from _ccolme_helpers import GraphData
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.engine import Simulation
from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.kernel.registry import PROTOCOLS
from desim.models.colme import rewire
from desim.models.colme.graph import Neighbours
from desim.testing import ScriptedLinks
from desim.topologies.dynamic import Dynamics, Rewire, difference
from desim.topologies.generators import ErdosRenyi
from desim.topologies.graph import Graph

load_plugins()


def _graph(n: int, p: float, seed: int) -> Graph:
    return ErdosRenyi(p=p).make(n, np.random.default_rng(seed))


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 25),
    p=st.floats(0.0, 1.0),
    q=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_the_pairs_carried_by_the_change_are_those_a_search_of_every_link_finds(n, p, q, seed):
    old, new = _graph(n, p, seed), _graph(n, q, seed + 1)
    before, after = Neighbours(old), Neighbours(new)
    added, dropped = difference(old, new)
    by_change = rewire.carried_by_change(before, after, added, dropped)
    assert by_change is not None
    np.testing.assert_array_equal(by_change, rewire.carried(before, after))
    # a change that does not lead from `old` to `new` is not trusted
    if len(added):
        assert rewire.carried_by_change(before, after, added[:-1], dropped) is None


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 30), p=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_pairs_are_numbered_by_rr_position_then_degree_then_querier(n, p, seed):
    g = _graph(n, p, seed)
    nb = Neighbours(g)
    # the layout's definition: position (from the first neighbour above a, cyclic), then a's
    # degree, then a
    place = np.arange(g.n_directed) - g.indptr[g.src]
    below = np.bincount(g.src[g.dst < g.src], minlength=n)
    position = (place - below[g.src]) % np.maximum(g.degree[g.src], 1)
    order = np.argsort((position * (n + 1) + g.degree[g.src]) * n + g.src)
    np.testing.assert_array_equal(nb.src, g.src[order])
    np.testing.assert_array_equal(nb.dst, g.dst[order])
    np.testing.assert_array_equal(nb.src[nb.csr_pairs], g.src)
    np.testing.assert_array_equal(nb.dst[nb.csr_pairs], g.dst)
    np.testing.assert_array_equal(nb.csr_keys, g.src * n + g.dst)
    a = g.src
    np.testing.assert_array_equal(nb.edge(a, position + 1), nb.csr_pairs)


def _state(proto) -> dict[str, np.ndarray]:
    """Every per-pair array a change moves, read through public names, by pair."""
    e = np.arange(proto.graph.n_pairs)
    n, total, data, noise = proto.stat.pair_columns(slice(None))
    out = {
        "included": proto.included.copy(),
        "kappa": proto.stat.last_index(e).copy(),
        "n": n.copy(),
        "total": total.copy(),
        "data": data.copy(),
        "noise": np.asarray(noise, dtype=float).copy(),
        "made": proto.made(None, None, e).copy(),
    }
    if proto.v_hat is not None:
        out["v_hat"] = proto.v_hat.copy()
    return out


def _rebuilt(state: dict, before: Neighbours, after: Neighbours) -> dict:
    """The pair state over `after` from scratch: each new pair's link looked up among the
    old pairs (its arrays copied), a new link's as at set-up."""
    where = {(a, b): e for e, (a, b) in enumerate(zip(before.src, before.dst, strict=True))}
    fresh = {"included": True, "v_hat": np.inf}
    out = {}
    for name, values in state.items():
        new = np.full(after.n_pairs, fresh.get(name, 0), dtype=values.dtype)
        for e, (a, b) in enumerate(zip(after.src, after.dst, strict=True)):
            if (a, b) in where:
                new[e] = values[where[(a, b)]]
        out[name] = new
    return out


@settings(max_examples=5, deadline=None)
@given(
    schedule=st.sampled_from(["rr", "rrr"]),
    mechanism=st.sampled_from(["pm1", "pm2"]),
    variance=st.sampled_from(["known", "sch-var-1", "sch-var-2"]),
    ideal=st.booleans(),
    fraction=st.floats(0.05, 1.0),
    seed=st.integers(0, 2**16),
)
def test_each_change_leaves_the_pair_state_a_rebuild_from_scratch_gives(
    schedule, mechanism, variance, ideal, fraction, seed
):
    g = _graph(16, 0.3, seed)
    checked = []
    follow = rewire.follow

    def checked_follow(proto, graph, t, change=None):
        before, state = proto.graph, _state(proto)
        follow(proto, graph, t, change)
        want = _rebuilt(state, before, proto.graph)
        got = _state(proto)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        checked.append(t)

    data = GraphData(g, np.arange(16) % 2, [0.0, 1.0], sigma=0.5)
    cls = PROTOCOLS.get("private-colme")
    params = {"schedule": schedule, "mechanism": mechanism, "variance": variance}
    proto = cls(cls.Params(peers="topology", **params))
    links = None if ideal else ScriptedLinks(delay=lambda rng, t, n: np.full(n, 1.4))
    graphs = Dynamics(rewire=Rewire(every=5, fraction=fraction)).schedule(
        g, 30, lambda: np.random.default_rng(seed)
    )
    with pytest.MonkeyPatch.context() as patch:  # (each change checked as it happens)
        patch.setattr(rewire, "follow", checked_follow)
        Simulation(proto, data, 30, Streams(5, 0, 1, 2), links=links, graphs=graphs).run()
    assert checked == list(range(5, 31, 5))
    assert np.isfinite(proto.estimates()).all()
