"""C-ColME's size and state sends as `SenderBatch`es (ideal links): b's row (|C_b|, t) over C's
edges, and b's row (X̃_b, t, Y_b) over S's edges then NaN rows, their columns made only when
read. Runs with them give the bytes of runs that send the columns (`Context.send_batch`
withheld: the per-edge sends of before), and their columns, when made, are those the per-edge
sends carry."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from _ccolme_helpers import GraphData, regular

from desim import fast
from desim.kernel.engine import Simulation
from desim.kernel.links import IdealLinks
from desim.kernel.messages import Batch, SenderBatch
from desim.kernel.params import build
from desim.kernel.randomness import Streams
from desim.kernel.registry import PROTOCOLS
from desim.kernel.transports.base import Transport
from desim.kernel.transports.synchronous import Synchronous
from desim.models.ccolme import compiled, edges, live_first, protocol
from desim.models.ccolme.edges import Rows
from desim.models.ccolme.sizes import Sizes
from desim.topologies.generators import ErdosRenyi

PRIVATE_LIVE = {"decisions": "irrevocable", "initial": "all", "symmetric": False, "epsilon": 50.0}
#: (protocol, parameters): live-first and per-edge paths, symmetric C, the fallback (which
#: reads the whole column of sizes heard), privacy
VARIANTS = [
    ("c-colme", {}),
    ("c-colme", {"symmetric": True}),
    ("c-colme", {"fallback": "local", "values": "fresh"}),
    ("c-colme", {"decisions": "retest", "restart": "hard", "reset": "agent"}),
    ("private-c-colme", PRIVATE_LIVE),
    ("private-c-colme", {"epsilon": 20.0}),
    ("c-colme", {"weights": "max-degree", "reset": "agent"}),
    ("c-colme", {"adversaries": {"fraction": 0.2, "behaviour": "shift", "shift": 0.2}}),
]


class Columns:
    """Mixin: set up without `Context.send_batch` (the size send's columns, as before)."""

    def setup(self, ctx):
        super().setup(dataclasses.replace(ctx, send_batch=None))


def run(name, params, graph, mode, t_max=40):
    """(metrics, final Y, C, messages sent per kind, |C_b| as each b told a) of a run on
    `graph` (two close classes);
    `mode`: "batch" (the size send a `SenderBatch`), "columns" (sent per edge) or
    "materialised" (a `SenderBatch` whose columns the transport reads, as a drawing one does)."""
    base = PROTOCOLS.get(name)
    cls = type("Columns", (Columns, base), {}) if mode == "columns" else base
    proto = cls(build(base.Params, params, "test"))
    data = GraphData(graph, np.arange(graph.n) % 2, [0.0, 1.0], sigma=0.3)
    sim = Simulation(
        proto,
        data,
        t_max,
        Streams(5, 0, 11, 22),
        links=IdealLinks(),
        checkpoints=np.arange(1, t_max + 1),
    )
    out = sim.run()
    sent = sim.network.sent.copy()
    # |C_b| per edge: on the edges C dropped, what the last size send before the drop told
    told = proto.nb_size.tobytes()
    return out.metrics.to_csv(), proto.y.tobytes(), proto.kept.tobytes(), sent.tobytes(), told


def graphs():
    """Regular graphs of degree 3, 10 and 40, and an irregular one (isolated agents too)."""
    yield regular(60, 3, seed=1)
    yield regular(80, 10, seed=2)
    yield regular(90, 40, seed=3)
    yield ErdosRenyi(p=0.08).make(70, np.random.default_rng(4))


@pytest.mark.parametrize(("name", "params"), VARIANTS)
@pytest.mark.parametrize("kernels", [False, True] if fast.AVAILABLE else [False])
def test_a_sender_batch_gives_the_bytes_of_the_per_edge_send(monkeypatch, name, params, kernels):
    """Every slot's metrics, Y, C, the message counts and the sizes filed for the edges C
    dropped: the same bytes, sent as a batch, per edge, or as a batch whose columns are read."""
    monkeypatch.setenv("DESIM_COMPILED", "1" if kernels else "0")
    monkeypatch.setattr(compiled, "COMPILED_FROM", 0)
    # the large graphs' state send (by block of senders) and test (in pieces)
    monkeypatch.setattr(live_first, "BLOCKED_FROM", 0)
    monkeypatch.setattr(edges, "BLOCK_BITS", 2)
    monkeypatch.setattr(protocol, "CHUNK", 16)
    for graph in graphs():
        batch = run(name, params, graph, "batch")
        assert batch == run(name, params, graph, "columns")
        with monkeypatch.context() as m:
            m.setattr(Synchronous, "send_batch", Transport.send_batch)
            assert batch == run(name, params, graph, "materialised")


def test_its_columns_are_the_per_edge_sends():
    """src, dst and payload of a `SenderBatch` are the senders, receivers and rows `Sizes`
    sends per edge; `len` and a recognised read make none of them; select and concat give the
    columns' batches."""
    g = regular(50, 6, seed=7)
    rng = np.random.default_rng(0)
    kept = rng.random(g.n_directed) < 0.7
    kept_idx = np.flatnonzero(kept)
    size = Rows(g).count(kept)
    sizes = Sizes(g, size, True, True)
    sender, receiver, payload = sizes.payload(kept_idx, 1, size, 3.0)
    sent = []

    def send_batch(kind, batch):
        sent.append((kind, batch))

    ctx = type("Ctx", (), {"send_batch": staticmethod(send_batch)})()
    made = []
    lazy = Sizes(g, size, True, True)
    batch, _, slots = lazy.send(ctx, kept_idx, 1, size, 3.0, None)  # type: ignore[arg-type]
    make = batch.make_table
    batch.make_table = lambda: made.append(1) or make()
    assert sent == [("size", batch)] and slots is kept_idx
    assert len(batch) == len(kept_idx) and not made
    rows = np.array([0, 5, len(kept_idx) - 1])
    assert batch.rows(rows).tobytes() == payload[rows].tobytes() and made == [1]
    assert np.array_equal(batch.src, sender) and np.array_equal(batch.dst, receiver)
    assert batch.payload.tobytes() == np.ascontiguousarray(payload).tobytes()
    batch.kind, batch.sent_at, batch.kinds, batch.single_kind = (
        np.zeros(len(rows), dtype=np.int64),
        np.zeros(len(rows)),
        ("size",),
        0,
    )
    batch.kind, batch.sent_at = np.zeros(len(batch), dtype=np.int64), np.zeros(len(batch))
    part = batch.select(rows)
    assert isinstance(part, Batch) and not isinstance(part, SenderBatch)
    assert part.payload.tobytes() == payload[rows].tobytes()
    both = Batch.concat([part, part])
    assert np.array_equal(both.src, np.concatenate([sender[rows]] * 2))


class Sent:
    """A context's sends, recorded: (kind, batch) of `send_batch`, (kind, columns) of `send`."""

    def __init__(self, batches: bool) -> None:
        self.sent: list = []
        self.send_batch = (lambda kind, batch: self.sent.append((kind, batch))) if batches else None

    def send(self, kind, src, dst, payload):
        self.sent.append((kind, (src, dst, payload)))


@pytest.mark.parametrize("kernels", [False, True] if fast.AVAILABLE else [False])
@pytest.mark.parametrize("blocked", [False, True])
def test_the_state_send_carries_each_senders_row_over_s_then_nan(monkeypatch, kernels, blocked):
    """Message i goes from b = dst[e] to a = src[e] (e: S's edges first, then the others) and
    carries (X̃_b, t, Y_b) over S, NaN rows after; sent as columns without `send_batch`. The
    receiver reads X̃_b and Y_b over S from the send's buffers, gathered by block or not."""
    monkeypatch.setenv("DESIM_COMPILED", "1" if kernels else "0")
    monkeypatch.setattr(compiled, "COMPILED_FROM", 0)
    monkeypatch.setattr(live_first, "BLOCKED_FROM", 0 if blocked else 1 << 30)
    monkeypatch.setattr(edges, "BLOCK_BITS", 2)
    g = regular(50, 6, seed=7)
    rng = np.random.default_rng(1)
    s = np.flatnonzero(rng.random(g.n_directed) < 0.6)
    mean, y = rng.standard_normal(g.n), rng.standard_normal(g.n)
    mean[:2] = -0.0
    order = np.concatenate([s, np.setdiff1d(np.arange(g.n_directed), s)])
    expected = np.full((g.n_directed, 3), np.nan)
    expected[: len(s)] = np.column_stack([mean[g.dst[s]], np.full(len(s), 4.0), y[g.dst[s]]])
    for batches in (True, False):
        live = live_first.LiveFirst(g, s)
        ctx = Sent(batches)
        batch, _, slots = live.send(ctx, mean, y, 4.0)  # type: ignore[arg-type]
        assert np.array_equal(slots, order) and len(ctx.sent) == 1
        kind, sent = ctx.sent[0]
        src, dst, payload = (batch.src, batch.dst, batch.payload) if batches else sent
        assert kind == "state" and (sent is batch) == batches
        assert np.array_equal(src, g.dst[order]) and np.array_equal(dst, g.src[order])
        assert payload.tobytes() == expected.tobytes()
        assert live.receive(batch, 4.0) is s
        x, n_all, _ = live.read(s, True)
        assert n_all == 4.0 and x.tobytes() == mean[g.dst[s]].tobytes()
        assert live.view("x")[s].tobytes() == mean[g.dst[s]].tobytes()
        assert live.y_of(s, None)[0].tobytes() == y[g.dst[s]].tobytes()
