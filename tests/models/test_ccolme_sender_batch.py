"""C-ColME's size send as a `SenderBatch` (ideal links): b's row (|C_b|, t) over C's edges, its
columns made only when read. Runs with it give the bytes of runs that send the columns
(`Context.send_batch` withheld: the per-edge send of before), and its columns, when made, are
those the per-edge send carries."""

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
from desim.models.ccolme import compiled
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
]


class Columns:
    """Mixin: set up without `Context.send_batch` (the size send's columns, as before)."""

    def setup(self, ctx):
        super().setup(dataclasses.replace(ctx, send_batch=None))


def run(name, params, graph, mode, t_max=40):
    """(metrics, final Y, C, messages sent per kind) of a run on `graph` (two close classes);
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
    return out.metrics.to_csv(), proto.y.tobytes(), proto.kept.tobytes(), sent.tobytes()


def graphs():
    """Regular graphs of degree 3, 10 and 40, and an irregular one (isolated agents too)."""
    yield regular(60, 3, seed=1)
    yield regular(80, 10, seed=2)
    yield regular(90, 40, seed=3)
    yield ErdosRenyi(p=0.08).make(70, np.random.default_rng(4))


@pytest.mark.parametrize(("name", "params"), VARIANTS)
@pytest.mark.parametrize("kernels", [False, True] if fast.AVAILABLE else [False])
def test_a_sender_batch_gives_the_bytes_of_the_per_edge_send(monkeypatch, name, params, kernels):
    """Every slot's metrics, Y, C and the message counts: the same bytes, sent as a batch, per
    edge, or as a batch whose columns are read."""
    monkeypatch.setenv("DESIM_COMPILED", "1" if kernels else "0")
    monkeypatch.setattr(compiled, "COMPILED_FROM", 0)
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
