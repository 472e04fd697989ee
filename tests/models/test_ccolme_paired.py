"""The live-first path with the compiled passes (`desim.models.ccolme.paired`).

Whole runs on this path are compared with the numpy path bit for bit in
tests/models/test_ccolme_compiled.py; here: which class a run takes, what it shows of the
states it holds (the per-edge views, the mixing matrix) against `LiveFirst` on the same run,
and the new kernels against numpy on random arrays.
"""

from __future__ import annotations

import numpy as np
import pytest
from _ccolme_helpers import GraphData, regular
from hypothesis import given, settings
from hypothesis import strategies as st

from desim import fast
from desim.kernel.engine import Simulation
from desim.kernel.links import IdealLinks
from desim.kernel.params import build
from desim.kernel.randomness import Streams
from desim.kernel.registry import PROTOCOLS
from desim.models.ccolme import compiled, edges, live_first, paired, protocol
from desim.models.ccolme.compiled import CompiledPass
from desim.models.ccolme.live_first import LiveFirst
from desim.models.ccolme.model import edge_weight
from desim.models.ccolme.paired import PairedLiveFirst

needs_numba = pytest.mark.skipif(not fast.AVAILABLE, reason="the kernels need numba")
VIEWS = ("nb_x", "nb_n", "nb_y", "nb_x_prev", "nb_n_prev")


def _small_graphs_take_the_compiled_path(monkeypatch) -> None:
    """Switch on, at 60 agents, every pass a large graph takes (blocks of four senders)."""
    monkeypatch.setenv("DESIM_COMPILED", "1")
    monkeypatch.setattr(compiled, "COMPILED_FROM", 0)
    monkeypatch.setattr(live_first, "BLOCKED_FROM", 0)
    monkeypatch.setattr(edges, "BLOCK_BITS", 2)
    monkeypatch.setattr(PairedLiveFirst, "block_bits", 2)
    monkeypatch.setattr(protocol, "CHUNK", 16)
    monkeypatch.setattr(live_first, "CHUNK", 16)


def _run(params: dict, t_max: int = 60):
    """C-ColME on 60 agents of two close classes (6-regular graph) over ideal links; returns
    the protocol after `t_max` slots."""
    base = PROTOCOLS.get("c-colme")
    proto = base(build(base.Params, params, "test"))
    g = regular(60, 6, seed=4)
    data = GraphData(g, np.arange(60) % 2, [0.0, 1.0], sigma=0.3)
    Simulation(proto, data, t_max, Streams(5, 0, 11, 22), links=IdealLinks()).run()
    return proto


def test_the_run_takes_the_paired_path_only_with_the_kernels(monkeypatch):
    """`live_first` gives `PairedLiveFirst` when the graph takes the compiled passes, else
    `LiveFirst`; a small graph without them keeps `LiveFirst`."""
    g = regular(60, 6, seed=4)
    kept = np.arange(g.n_directed)
    monkeypatch.setattr(compiled, "COMPILED_FROM", 0)
    monkeypatch.setenv("DESIM_COMPILED", "0")
    assert type(paired.live_first(g, kept, False)) is LiveFirst
    monkeypatch.setenv("DESIM_COMPILED", "1")
    expected = PairedLiveFirst if fast.AVAILABLE else LiveFirst
    assert type(paired.live_first(g, kept, False)) is expected
    monkeypatch.setattr(compiled, "COMPILED_FROM", g.n_directed + 1)
    assert type(paired.live_first(g, kept, False)) is LiveFirst


@needs_numba
@pytest.mark.parametrize("values", ["stale", "fresh"])
@pytest.mark.parametrize("t_max", [1, 2, 60])
def test_the_views_and_the_mixing_matrix_are_live_firsts(monkeypatch, values, t_max):
    """After 1, 2 and 60 slots (S compacted by then), the per-edge views of b's states a holds,
    the mixing matrix and the per-edge states a run would leave the path with are those
    `LiveFirst` holds on the same run, bit for bit (NaN where an edge carries no value)."""
    _small_graphs_take_the_compiled_path(monkeypatch)
    params = {"values": values}
    mine = _run(params, t_max)
    assert isinstance(mine.states, PairedLiveFirst)
    monkeypatch.setattr(protocol, "live_first", lambda g, kept, fresh: LiveFirst(g, kept))
    theirs = _run(params, t_max)
    assert type(theirs.states) is LiveFirst
    if t_max == 60:
        assert mine.states.version > 0  # S was compacted: its views cover fewer edges
    assert mine.y.tobytes() == theirs.y.tobytes()
    for name in VIEWS:
        assert getattr(mine, name).tobytes() == getattr(theirs, name).tobytes(), name
    assert (mine.mixing_matrix() != theirs.mixing_matrix()).nnz == 0
    left, right = mine.states.to_edge_states(), theirs.states.to_edge_states()
    for name in ("x", "n", "y", "x_prev", "n_prev"):
        assert getattr(left, name).tobytes() == getattr(right, name).tobytes(), name


def _blocked(rng, n, e, bits):
    """A random sender per edge and its block order (`CompiledPass.block_order`)."""
    sender = rng.integers(0, n, e)
    sorted_sender, back = CompiledPass().block_order(sender, bits, n)
    return sender, sorted_sender, back


@needs_numba
@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    every=st.booleans(),
    blocked=st.booleans(),
    strict=st.booleans(),
    loose=st.booleans(),
)
def test_the_fused_test_is_the_numpy_test_and_its_filing(seed, every, blocked, strict, loose):
    """`test_pairs` on random receivers, pairs and alive flags: the same kept flags as
    |X̃_a − X̃_b| against the bound in numpy, the edges that died and, when any did, those
    kept (as graph edges: S's, or every edge) in CSR order, and Y_b of the kept ones; the
    buffer of kept edges is left as it was when none died."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    counts = rng.integers(0, 12, n)
    k = int(counts.sum())
    receiver = np.repeat(np.arange(n), counts)
    mean, y = rng.normal(size=n), rng.normal(size=n)
    sender, sorted_sender, back = _blocked(rng, n, k, 2)
    pairs = np.empty((k, 2))
    k_pass = CompiledPass()
    if blocked:
        k_pass.gather_pairs(mean, y, sorted_sender, pairs)
    else:
        k_pass.gather_pairs(mean, y, sender, pairs)
    alive = rng.random(k) < 0.8
    s = None if every else np.sort(rng.choice(10 * k + 1, k, replace=False)).astype(np.int64)
    bound = float(rng.uniform(0.0, 2.0))
    if k:  # a bound met exactly: strict or not decides (the first death anywhere in S)
        bound = float(abs(mean[receiver[0]] - mean[sender[0]]))
    if loose:  # none dies
        bound = float(np.abs(mean[receiver] - mean[sender]).max(initial=0.0)) + 1.0
    died, y_kept, kept = np.empty(k, np.int64), np.empty(k), np.full(k, -7, np.int64)
    after = alive.copy()
    n_died, n_kept = k_pass.test_pairs(
        mean,
        receiver,
        (pairs, back if blocked else None),
        after,
        s,
        (bound, strict),
        (died, y_kept, kept),
    )
    diff = np.abs(mean[receiver] - mean[sender])
    keep = (diff < bound if strict else diff <= bound) & alive
    edge = np.arange(k) if s is None else s
    assert after.tobytes() == keep.tobytes()
    assert died[:n_died].tobytes() == edge[alive & ~keep].tobytes()
    if n_died:
        assert kept[:n_kept].tobytes() == edge[keep].tobytes()
    else:
        assert (kept == -7).all()
    assert y_kept[:n_kept].tobytes() == y[sender[keep]].tobytes()


@needs_numba
@pytest.mark.parametrize("seed", range(4))
def test_weights_refreshed_around_agents_are_numpys(seed):
    """`refresh_rows` around some agents gives |C_b| and W_ab = 1/(1 + max(|C_a|, |C_b|)) of
    numpy's `edge_weight` on their own and reverse edges, and leaves every other edge."""
    rng = np.random.default_rng(seed)
    g = regular(50, 4, seed=seed)
    size = rng.integers(0, 5, g.n)
    size_dst, w = rng.random(g.n_directed), rng.random(g.n_directed)
    before = size_dst.copy(), w.copy()
    agents = rng.choice(g.n, 7, replace=False)
    CompiledPass().refresh_rows(agents, g, size, size_dst, w)
    touched = np.isin(g.src, agents) | np.isin(g.dst, agents)
    e = np.flatnonzero(touched)
    assert size_dst[e].tobytes() == size[g.dst[e]].astype(float).tobytes()
    assert w[e].tobytes() == edge_weight(size[g.src[e]], size[g.dst[e]].astype(float)).tobytes()
    assert size_dst[~touched].tobytes() == before[0][~touched].tobytes()
    assert w[~touched].tobytes() == before[1][~touched].tobytes()


@needs_numba
@pytest.mark.parametrize(("values", "taken"), [("stale", True), ("fresh", False)])
def test_the_consensus_step_writes_the_next_sends_rows(monkeypatch, values, taken):
    """With stale values, each slot's consensus step writes (X̃_a, Y_a) for the next send,
    whose gather reads them from slot 2 on (the same arrays: `PairTable.holds`); with fresh
    values (X̃ of the next slot, not known yet) nothing is written."""
    _small_graphs_take_the_compiled_path(monkeypatch)
    held = []
    original = compiled.PairTable.holds

    def holds(self, x, y):
        held.append(original(self, x, y))
        return held[-1]

    monkeypatch.setattr(compiled.PairTable, "holds", holds)
    proto = _run({"values": values}, 30)
    if taken:
        assert held == [False] + [True] * 29
    else:
        assert proto.states.table is None and not held


def test_a_pair_table_holds_only_the_arrays_it_was_written_from():
    """`PairTable.holds` asks for the same objects: equal values in another array do not do."""
    table = compiled.PairTable(3)
    x, y = np.arange(3.0), np.ones(3)
    assert not table.holds(x, y)
    table.buffer()[:] = np.stack([x, y], axis=1)
    table.of = (x, y)
    assert table.holds(x, y)
    assert not table.holds(x.copy(), y) and not table.holds(x, y.copy())
    table.buffer()  # about to be written again: nothing valid
    assert not table.holds(x, y)
