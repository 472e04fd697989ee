"""C-ColME's per-version arrays (C's edges and positions, the size send's ends, W_ab) in buffers
taken in turn: the same bytes as fresh arrays, and no send that can still be read is
overwritten (over ideal links the send of the version before; over links with latency every
send in flight, whose arrays stay fresh)."""

from __future__ import annotations

import numpy as np
import pytest
from _ccolme_helpers import GraphData, regular

from desim.kernel.engine import Simulation
from desim.kernel.links import IdealLinks
from desim.kernel.params import build
from desim.kernel.randomness import Streams
from desim.kernel.registry import PROTOCOLS
from desim.models.ccolme import edges, sizes
from desim.models.ccolme.edges import Rows, Turns, flatnonzero_into
from desim.network_models.links import FixedLatency


@pytest.mark.parametrize("piece", [1, 3, 64, 1 << 18])
def test_flatnonzero_into_is_np_flatnonzero(monkeypatch, piece):
    """Piece by piece into a buffer, the positions `np.flatnonzero` gives (empty, all, none,
    pieces that split the mask anywhere)."""
    monkeypatch.setattr(edges, "PIECE", piece)
    rng = np.random.default_rng(piece)
    for n in (0, 1, 7, 200):
        for p in (0.0, 0.3, 1.0):
            mask = rng.random(n) < p
            out = np.full(n + 2, -7, dtype=np.int64)
            got = flatnonzero_into(mask, out)
            np.testing.assert_array_equal(got, np.flatnonzero(mask))
            assert np.shares_memory(got, out) or len(got) == 0


def test_turns_keep_the_array_before_and_reuse_the_one_before_that():
    """With two buffers the array handed out last stays intact while the next is written and
    the third reuses the first's memory; with one, every array is the same memory."""
    turns = Turns(6)
    a = turns.next(5)
    a[:] = 1
    b = turns.next(4)
    b[:] = 2
    assert (a == 1).all() and not np.shares_memory(a, b)
    c = turns.next(3)
    assert np.shares_memory(a, c) and (b == 2).all()
    one = Turns(6, float, count=1)
    assert np.shares_memory(one.next(2), one.next(6))


def test_owners_reused_over_ideal_links_fresh_otherwise():
    """C's edges' agents are np.repeat's over their runs either way; with `reuse` they are
    one buffer, without it every version is its own array, left intact."""
    g = regular(30, 4, seed=1)
    rng = np.random.default_rng(2)
    kept = [rng.random(g.n_directed) < p for p in (0.9, 0.7, 0.5)]
    for reuse in (True, False):
        rows, held = Rows(g), []
        for version, k in enumerate(kept):
            counts = rows.count(k)
            got = rows.owners(counts, version, np.flatnonzero(k), reuse)
            np.testing.assert_array_equal(got, np.repeat(np.arange(g.n), counts))
            held.append((got, got.copy()))
        assert np.shares_memory(held[0][0], held[2][0]) == reuse
        if not reuse:
            for now, then in held:
                np.testing.assert_array_equal(now, then)


class Recording:
    """Mixin: remember every send (its arrays and a copy) and check, before each slot, that the
    sends that can still be read hold what they held when sent."""

    readable = 1  # slots back whose sends may still be read

    def setup(self, ctx):
        super().setup(ctx)
        self.sends, self.moves, self._last = [], 0, None
        send = ctx.send

        def recording(kind, src, dst, payload=None, **kw):
            copies = (src.copy(), dst.copy())
            self.sends.append((self.t, kind, (src, dst), copies))
            return send(kind, src, dst, payload, **kw)

        ctx.send = recording

    def on_samples(self, t, samples):
        for at, kind, arrays, copies in self.sends:
            if at >= t - self.readable:
                for now, then in zip(arrays, copies, strict=True):
                    np.testing.assert_array_equal(now, then, err_msg=f"{kind} of slot {at}")
        self.sends = [s for s in self.sends if s[0] >= t - self.readable]
        size = self.kept.sum()
        self.moves += self._last is not None and size != self._last
        self._last = size
        super().on_samples(t, samples)


def run(name: str, params: dict, links, readable: int, piece: int, monkeypatch):
    """A run on a 60-agent 6-regular graph of two close classes, C moving in most slots."""
    monkeypatch.setattr(edges, "PIECE", piece)
    base = PROTOCOLS.get(name)
    cls = type("Recorded", (Recording, base), {"readable": readable})
    proto = cls(build(base.Params, params, "test"))
    g = regular(60, 6, seed=4)
    data = GraphData(g, np.arange(60) % 2, [0.0, 1.0], sigma=0.3)
    sim = Simulation(
        proto, data, 60, Streams(5, 0, 11, 22), links=links, checkpoints=np.arange(1, 61)
    )
    m = sim.run().metrics
    m = m[~m.metric.str.startswith("dropped_")].reset_index(drop=True)  # non-ideal links: 0
    return proto, (m.to_csv().encode(), proto.y.tobytes(), proto.kept.tobytes())


PRIVATE_LIVE = {"decisions": "irrevocable", "initial": "all", "symmetric": False, "epsilon": 50.0}


@pytest.mark.parametrize(
    ("name", "params"),
    [("c-colme", {}), ("c-colme", {"symmetric": True}), ("private-c-colme", PRIVATE_LIVE)],
)
def test_reused_buffers_give_the_bytes_of_fresh_arrays(monkeypatch, name, params):
    """Ideal links (reused buffers, the positions in pieces of 5 flags) give the bytes of
    zero-latency links (the network's other path: fresh arrays), C moving often enough that
    every buffer is reused; no send of the slot before is overwritten."""
    ideal, ideal_bytes = run(name, params, IdealLinks(), 1, 5, monkeypatch)
    _, zero_bytes = run(name, params, FixedLatency(slots=0.0), 1, 5, monkeypatch)
    assert ideal_bytes == zero_bytes
    assert ideal.moves >= 3


def test_sends_in_flight_over_links_with_latency_are_never_overwritten(monkeypatch):
    """Messages three slots in flight: every send they belong to keeps its arrays until read."""
    proto, _ = run("c-colme", {}, FixedLatency(slots=3.0), 4, 5, monkeypatch)
    assert proto.moves >= 5


def test_sizes_moved_over_every_edge_or_only_the_changed_ones_are_the_same_bytes(monkeypatch):
    """|C_b| and W_ab recomputed on every edge in place, or only around the agents that
    changed: the same run, bit for bit."""
    outs = []
    for share in (0.0, float("inf")):
        monkeypatch.setattr(sizes, "EVERY_EDGE_FROM", share)
        proto, out = run("c-colme", {"fallback": "local"}, IdealLinks(), 1, 1 << 18, monkeypatch)
        assert proto.moves >= 3
        outs.append(out)
    assert outs[0] == outs[1]
