"""Latency models and stragglers: exact delivery times, batching and order on the network."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from desim.kernel.engine import Simulation
from desim.kernel.links import IdealLinks, counter_uniform
from desim.kernel.messages import Batch
from desim.kernel.params import ConfigError, param
from desim.kernel.protocol import Context, Protocol
from desim.kernel.randomness import Streams
from desim.network_models.distributions import (
    Constant,
    Exponential,
    Geometric,
    Lognormal,
    Pareto,
    Uniform,
    Weibull,
)
from desim.network_models.latency import IidLatency, SizeProportional, latency_model
from desim.network_models.realistic import RealisticLinks
from desim.network_models.stragglers import Stragglers
from desim.testing import Zeros

N = 5
STREAMS = (3, 0, 11, 22)


@dataclass(frozen=True)
class SenderParams:
    until: int = param(4, "send in slots 1..until", ge=0)


class Sender(Protocol):
    """Each slot every agent sends a 'narrow' message (1 value) to the next agent and a 'wide'
    one (3 values) to the one after; payload = (slot, sender, kind code…). Logs deliveries."""

    Params = SenderParams
    message_kinds = ("narrow", "wide")

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self.log: list[tuple[float, Batch]] = []

    def on_samples(self, t: int, samples: np.ndarray) -> None:
        if t > self.params.until:
            return
        n = self.ctx.n_agents
        src = np.arange(n)
        self.ctx.send("narrow", src, (src + 1) % n, np.full(n, float(t)))
        wide = np.column_stack([np.full(n, float(t)), src, np.zeros(n)])
        self.ctx.send("wide", src, (src + 2) % n, wide)

    def on_deliver(self, batch: Batch) -> None:
        self.log.append((self.ctx.now(), batch))

    def estimates(self) -> np.ndarray:
        return np.zeros(self.ctx.n_agents)

    def deliveries(self) -> list[tuple[float, int, int, float, int]]:
        """(time, src, dst, sent_at, kind) of every message delivered, in delivery order."""
        return [
            (t, int(s), int(d), float(a), int(k))
            for t, b in self.log
            for s, d, a, k in zip(b.src, b.dst, b.sent_at, b.kind, strict=True)
        ]


def run(links, until=4, t_max=12):
    proto = Sender(SenderParams(until))
    sim = Simulation(
        proto, Zeros(N), t_max, Streams(*STREAMS), links=links, checkpoints=np.array([t_max])
    )
    sim.run()
    return proto, sim


DISTRIBUTIONS = [
    Constant(0.0),
    Constant(2.5),
    Uniform(0.5, 3.0),
    Exponential(2.0),
    Lognormal(2.0, 1.5),
    Pareto(0.5, 1.0, 2.5),
    Weibull(0.7, 2.0),
    Geometric(2.0),
]


def replayed(dist, due=lambda when: when, until=4, t_max=12):
    """The (time, src, dst, sent_at, kind) deliveries `run` should make: the latency draws
    replayed from the same stream, one per message in send order, due at due(t + delay)."""
    rng = Streams(*STREAMS).get("latency")
    expected = []
    for t in range(1, until + 1):
        for kind in (0, 1):
            delay = dist.sample(rng, N)
            for i in range(N):
                expected.append((due(t + delay[i]), i, (i + 1 + kind) % N, float(t), kind))
    return [e for e in expected if e[0] < t_max + 1]  # the run ends before T + 1


@pytest.mark.parametrize("dist", DISTRIBUTIONS, ids=lambda d: type(d).__name__)
def test_every_message_arrives_at_its_send_time_plus_its_own_draw(dist):
    proto, sim = run(RealisticLinks(IdealLinks(), latency=IidLatency(dist)))
    expected = replayed(dist)
    got = proto.deliveries()
    assert sorted(got) == sorted(expected)  # exact times, nothing lost
    times = [t for t, _ in proto.log]
    assert times == sorted(set(times))  # one batch per distinct time, in time order
    for t, batch in proto.log:  # a batch holds every message due then, in send order
        due = [e for e in expected if e[0] == t]
        assert [
            (int(s), float(a), int(k))
            for s, a, k in zip(batch.src, batch.sent_at, batch.kind, strict=True)
        ] == [(e[1], e[3], e[4]) for e in due]
    assert sim.network.dropped.sum() == 0 and sim.network.sent.sum() == 2 * 4 * N


def test_iid_delays_let_later_messages_overtake_earlier_ones_on_a_link():
    proto, _ = run(RealisticLinks(IdealLinks(), latency=IidLatency(Exponential(3.0))), until=8)
    narrow = [(t, s, a) for t, s, _, a, k in proto.deliveries() if k == 0]
    overtaken = 0
    for src in range(N):
        sent = [a for _, s, a in narrow if s == src]  # in delivery order
        overtaken += sum(x > y for x, y in zip(sent, sent[1:], strict=False))
    assert overtaken > 0  # not FIFO: documented in desim.kernel.network


def test_equal_times_from_different_sends_are_one_batch_in_send_order():
    # constant latency 1: slot t's messages arrive with slot t + 1's tick sends still pending
    proto, _ = run(RealisticLinks(IdealLinks(), latency=IidLatency(Constant(1.0))))
    assert [t for t, _ in proto.log] == [2.0, 3.0, 4.0, 5.0]
    for t, batch in proto.log:
        assert batch.kind.tolist() == [0] * N + [1] * N
        assert np.all(batch.sent_at == t - 1)


def test_size_proportional_delay_is_base_plus_per_value_times_width():
    links = RealisticLinks(IdealLinks(), latency=SizeProportional(base=0.5, per_value=0.25))
    proto, _ = run(links)
    for t, _, _, a, k in proto.deliveries():
        width = 1 if k == 0 else 3
        assert t == a + 0.5 + 0.25 * width
    assert latency_model({"model": "size-proportional", "base": 1.0}, "x") == SizeProportional(
        1.0, 0.0
    )
    assert SizeProportional(1.0, 0.5).cdf(np.array([1.9, 2.0]), 2).tolist() == [0.0, 1.0]


def test_latency_tables_are_validated_in_one_line():
    assert latency_model({"model": "exponential", "mean": 5.0}, "x") == IidLatency(Exponential(5.0))
    with pytest.raises(
        ConfigError,
        match=r"\[network.latency\]: model: unknown latency model "
        r"'exponental' \(did you mean 'exponential'\?\)",
    ):
        latency_model({"model": "exponental"}, "[network.latency]")
    with pytest.raises(ConfigError, match="size-proportional"):  # listed among the models
        latency_model({}, "[network.latency]")
    with pytest.raises(ConfigError, match="per_value = -1"):
        latency_model({"model": "size-proportional", "per_value": -1}, "[network.latency]")


# ---- stragglers ------------------------------------------------------------------------------


def test_stragglers_leave_late_by_their_excess_speed_factor_times_one_draw_per_slot():
    factors = [1.0, 3.0, 1.0, 2.0, 1.0]
    nominal = Uniform(0.5, 1.5)
    strag = Stragglers(factors=factors, delay={"model": "uniform", "low": 0.5, "high": 1.5})
    proto, sim = run(RealisticLinks(IdealLinks(), stragglers=strag))
    key = np.uint64(Streams(*STREAMS).get("stragglers").integers(0, 2**63))
    for t, s, _, a, _ in proto.deliveries():
        d = nominal.ppf(counter_uniform(key, np.array([int(a) * (N + 1) + s])))[0]
        assert t == a + (factors[s] - 1) * d
        if factors[s] == 1:
            assert t == a  # nominal agents are on time
    # both kinds an agent sends in a slot leave together (one processing time per slot)
    by_sender = {}
    for t, s, _, a, _ in proto.deliveries():
        by_sender.setdefault((s, a), set()).add(t)
    assert all(len(v) == 1 for v in by_sender.values())
    assert len({t for (s, _), v in by_sender.items() if factors[s] > 1 for t in v}) == 8


def test_a_fraction_of_the_agents_straggle_chosen_at_random():
    for n, fraction, k in ((10, 0.25, 3), (10, 0.35, 4), (7, 0.0, 0), (7, 1.0, 7)):
        bound = Stragglers(fraction=fraction, slowdown=4.0).bind(n, np.random.default_rng(n))
        assert np.sum(bound.factors == 4.0) == k == math.floor(fraction * n + 0.5)
        assert np.all((bound.factors == 1) | (bound.factors == 4))
    chosen = [
        np.flatnonzero(
            Stragglers(fraction=0.3).bind(10, np.random.default_rng(s)).factors > 1
        ).tolist()
        for s in range(5)
    ]
    assert len({tuple(c) for c in chosen}) > 1  # a random subset, not the first agents
    with pytest.raises(ValueError, match="factors has 2 values; the data have 3"):
        Stragglers(factors=[1.0, 2.0]).bind(3, np.random.default_rng(0))


def test_straggler_tables_report_bad_input():
    from desim.kernel.params import build

    with pytest.raises(ConfigError, match="slowdown = 0.5: must be ≥ 1"):
        build(Stragglers, {"slowdown": 0.5}, "[network.stragglers]")
    with pytest.raises(ConfigError, match=r"\[network.stragglers\]: delay: value = -1"):
        build(Stragglers, {"delay": {"model": "constant", "value": -1}}, "[network.stragglers]")


def test_deadline_probability_integrates_the_straggler_delay():
    # D ~ U(0, 2), f = 3: P(2D + L ≤ s) with L = 1: P(D ≤ (s − 1)/2) = (s − 1)/4
    bound = Stragglers(factors=[1.0, 3.0], delay={"model": "uniform", "low": 0, "high": 2}).bind(
        2, np.random.default_rng(0)
    )
    step = Constant(1.0).cdf
    for slack in (1.0, 2.5, 4.0, 6.0):
        p = bound.on_time(slack, step)
        assert p[0] == 1.0  # a nominal agent: only L
        assert p[1] == pytest.approx(min(max((slack - 1) / 4, 0), 1), abs=1 / 4096)


def test_a_resolution_rounds_delivery_times_up_onto_its_grid_and_batches_them():
    dist = Exponential(2.0)
    proto, sim = run(RealisticLinks(IdealLinks(), latency=IidLatency(dist, resolution=0.25)))
    # due times on the next quarter slot, or on it
    expected = replayed(dist, due=lambda when: math.ceil(when * 4) / 4)
    assert sorted(proto.deliveries()) == sorted(expected)
    times = [t for t, _ in proto.log]
    assert times == sorted(set(times)) and all(t * 4 == int(t * 4) for t in times)
    assert len(times) < len(expected)  # several messages share a tick


def test_resolution_must_be_a_whole_number_of_ticks_per_slot():
    model = latency_model({"model": "exponential", "mean": 1.0, "resolution": 0.1}, "[l]")
    assert model.resolution == 0.1
    for bad in (0.3, 1.0, -0.1, "fast"):
        with pytest.raises(ConfigError, match=r"\[l\]: resolution = .*1/k slot"):
            latency_model({"model": "exponential", "mean": 1.0, "resolution": bad}, "[l]")
