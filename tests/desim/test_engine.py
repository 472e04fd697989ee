"""The engine: slot order, batching, link latency, message counts, named streams."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from desim.kernel.engine import Simulation
from desim.kernel.links import IdealLinks
from desim.kernel.messages import DST, DUE, KIND, PAYLOAD, SENT, SRC, Batch, RowBatch
from desim.kernel.params import param
from desim.kernel.protocol import Context, DataSource, Protocol
from desim.kernel.randomness import Streams
from desim.kernel.recorder import log_checkpoints
from desim.network_models.links import FixedLatency


class ConstantData(DataSource):
    """Agent i always observes i (so its running mean is exactly i)."""

    def __init__(self, n: int) -> None:
        self.n_agents = n
        self.means = np.arange(n, dtype=float)
        self.classes = np.zeros(n, dtype=np.int64)
        self.public = {}

    def sample(self, rng: np.random.Generator, n_slots: int) -> np.ndarray:
        return np.tile(self.means, (n_slots, 1))


@dataclass(frozen=True)
class ProbeParams:
    ping_until: int = param(3, "send pings in slots 1..ping_until", ge=0)


class Probe(Protocol):
    """Each agent pings the next one every slot; the receiver echoes. Logs every delivery."""

    Params = ProbeParams
    message_kinds = ("ping", "echo")

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self.log: list[tuple[float, Batch]] = []
        self.events: list[tuple[float, str]] = []
        self.sums = np.zeros(ctx.n_agents)

    def on_samples(self, t: int, samples: np.ndarray) -> None:
        self.events.append((self.ctx.now(), "tick"))
        self.sums += samples
        if t <= self.params.ping_until:
            src = np.arange(self.ctx.n_agents)
            dst = (src + 1) % self.ctx.n_agents
            self.ctx.send("ping", src, dst, np.column_stack([src * 10.0, np.full(len(src), t)]))

    def on_deliver(self, batch: Batch) -> None:
        self.events.append((self.ctx.now(), "deliver"))
        self.log.append((self.ctx.now(), batch))
        pings = batch.of_kind("ping")
        if len(pings):
            self.ctx.send("echo", pings.dst, pings.src, pings.payload[:, :1])

    def estimates(self) -> np.ndarray:
        self.events.append((self.ctx.now(), "record"))
        return self.sums / max(self.ctx.now(), 1)


def simulate(links, t_max=6, n=4, ping_until=3, seed=1):
    probe = Probe(ProbeParams(ping_until))
    sim = Simulation(
        probe,
        ConstantData(n),
        t_max,
        Streams(seed, 0, 1, 2),
        links=links,
        checkpoints=np.arange(1, t_max + 1),
    )
    out = sim.run()
    return probe, out


def test_zero_latency_delivers_in_the_same_slot_after_the_tick_and_before_the_recorder():
    probe, _ = simulate(IdealLinks(), t_max=2, ping_until=2)
    assert probe.events == [
        (1, "tick"),
        (1, "deliver"),
        (1, "deliver"),
        (1, "record"),
        (2, "tick"),
        (2, "deliver"),
        (2, "deliver"),
        (2, "record"),
    ]
    kinds = [b.kinds[b.kind[0]] for _, b in probe.log]
    assert kinds == ["ping", "echo", "ping", "echo"]


class DeadlineProbe(Probe):
    """A Probe that also sets a deadline at each tick, where it pings once more."""

    def on_samples(self, t: int, samples: np.ndarray) -> None:
        super().on_samples(t, samples)
        self.ctx.call_at(self.ctx.now(), self._deadline)

    def _deadline(self) -> None:
        self.events.append((self.ctx.now(), "deadline"))
        src = np.arange(self.ctx.n_agents)
        self.ctx.send("ping", src, (src + 1) % self.ctx.n_agents, np.zeros((len(src), 2)))


@pytest.mark.parametrize("links", [IdealLinks(), FixedLatency(slots=0.0)])
def test_zero_delay_sends_of_ticks_deliveries_and_deadlines_come_in_order(links):
    # tick → its pings → their echoes → deadline → its pings → their echoes → recorder, with
    # the tick's sends handed over without an event of their own (`Network.at_tick`)
    probe = DeadlineProbe(ProbeParams(2))
    Simulation(
        probe, ConstantData(3), 2, Streams(1, 0, 1, 2), links=links, checkpoints=np.arange(1, 3)
    ).run()
    slot = ["tick", "deliver", "deliver", "deadline", "deliver", "deliver", "record"]
    assert probe.events == [(t, e) for t in (1, 2) for e in slot]
    kinds = [b.kinds[b.kind[0]] for _, b in probe.log]
    assert kinds == ["ping", "echo"] * 4


@pytest.mark.parametrize("k", [1, 2, 5])
def test_fixed_latency_delivers_exactly_k_slots_later_in_order_in_one_batch(k):
    probe, _ = simulate(FixedLatency(slots=k), t_max=3 + 2 * k + 1, n=5, ping_until=3)
    pings = [(when, b.of_kind("ping")) for when, b in probe.log if len(b.of_kind("ping"))]
    assert [when for when, _ in pings] == [1 + k, 2 + k, 3 + k]
    for when, b in pings:
        assert len(b) == 5  # all messages due at one instant come as one batch
        np.testing.assert_array_equal(b.src, np.arange(5))  # in send order
        np.testing.assert_array_equal(b.sent_at, when - k)
        np.testing.assert_array_equal(b.payload[:, 1], when - k)
    echoes = [when for when, b in probe.log if len(b.of_kind("echo"))]
    assert echoes == [1 + 2 * k, 2 + 2 * k, 3 + 2 * k]


def test_message_counts_are_recorded_per_kind():
    _, out = simulate(IdealLinks(), t_max=6, n=4, ping_until=3)
    m = out.metrics
    last = m[m.t == 6].set_index("metric")["value"]
    assert last["messages_ping"] == 12 and last["messages_echo"] == 12
    assert set(m.metric) == {"mse", "messages_ping", "messages_echo"}
    assert np.allclose(m[m.metric == "mse"].value, 0.0)  # constant data: exact means


def test_messages_sent_and_delivered_at_once_join_the_pending_batch():
    # a latency-1 ping from slot t and a zero-latency echo... share instant t+1 deliveries
    probe, _ = simulate(FixedLatency(slots=1), t_max=4, n=3, ping_until=3)
    for when, b in probe.log:
        assert np.all(b.sent_at <= when)


def test_batch_concat_pads_payloads_and_keeps_order():
    kinds = ("a", "b")
    one = Batch(
        np.array([0]), np.array([1]), np.array([0]), np.array([[1.0, 2.0]]), np.array([0.0]), kinds
    )
    two = Batch(
        np.array([2]), np.array([3]), np.array([1]), np.empty((1, 0)), np.array([0.0]), kinds
    )
    both = Batch.concat([one, two])
    np.testing.assert_array_equal(both.src, [0, 2])
    assert both.payload.shape == (2, 2) and np.isnan(both.payload[1]).all()
    assert len(both.of_kind("b")) == 1 and both.of_kind("b").src[0] == 2


def test_a_batch_held_as_rows_selects_and_joins_like_one_held_as_arrays():
    """Window batches are one float matrix (`Batch.from_rows`): selecting by mask, index or
    slice and joining give the arrays an array-held batch gives."""
    kinds = ("a", "b")
    rng = np.random.default_rng(3)
    n = 9
    rows = np.empty((n, PAYLOAD + 2))
    rows[:, DUE], rows[:, SENT] = np.sort(rng.random(n)) + 2, rng.random(n)
    rows[:, SRC], rows[:, DST] = rng.integers(0, 50, n), rng.integers(0, 50, n)
    rows[:, KIND], rows[:, PAYLOAD:] = rng.integers(0, 2, n), rng.random((n, 2))
    held = Batch.from_rows(rows, kinds)
    plain = Batch(
        rows[:, SRC].astype(np.int64),
        rows[:, DST].astype(np.int64),
        rows[:, KIND].astype(np.int64),
        rows[:, PAYLOAD:],
        rows[:, SENT],
        kinds,
        None,
        rows[:, DUE],
    )

    def same(x: Batch, y: Batch) -> None:
        for name in ("src", "dst", "kind", "payload", "sent_at", "delivered_at"):
            got, want = getattr(x, name), getattr(y, name)
            assert got.dtype == want.dtype and np.array_equal(got, want), name
        assert x.single_kind is None or (x.kind == x.single_kind).all()  # never wrong

    for index in (held.kind == 1, np.array([4, 0, 4]), slice(2, 6), held.kind == 7):
        same(held.select(index), plain.select(index))
    for name in kinds:
        same(held.of_kind(name), plain.of_kind(name))
    parts = [held.select(slice(0, 4)), held.select(slice(4, n))]
    same(Batch.concat(parts), plain)
    assert isinstance(Batch.concat(parts), RowBatch)
    assert Batch.from_rows(rows[rows[:, KIND] == 1], kinds).single_kind == 1


def test_log_checkpoints_are_sorted_unique_and_end_at_t_max():
    c = log_checkpoints(30000, 60)
    assert c[0] == 1 and c[-1] == 30000
    assert np.all(np.diff(c) > 0) and 40 <= len(c) <= 61
    assert list(log_checkpoints(1)) == [1]
    with pytest.raises(ValueError):
        log_checkpoints(0)


def test_named_streams_are_stable_and_separate():
    s1 = Streams(7, 3, shared_key=11, run_key=22)
    s2 = Streams(7, 3, shared_key=11, run_key=99)  # another protocol, same data set-up
    assert s1.get("data").random() == s2.get("data").random()
    assert s1.get("dp-noise").random() != s2.get("dp-noise").random()
    assert s1.get("data") is s1.get("data")
    other_rep = Streams(7, 4, shared_key=11, run_key=22)
    assert Streams(7, 3, 11, 22).get("data").random() != other_rep.get("data").random()
