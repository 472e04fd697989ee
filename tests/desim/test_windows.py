"""Window batching is exact: with exact delivery times, windows give bit for bit what
one-message-per-instant delivery gives, for every window-safe protocol, under random
latencies, losses, outages, churn and stragglers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import desim.kernel.engine as engine
from desim.kernel.engine import SLOT_BATCH, Simulation
from desim.kernel.links import IdealLinks
from desim.kernel.params import build
from desim.kernel.plugins import load_plugins
from desim.kernel.protocol import SlotBatched, WindowSafe
from desim.kernel.randomness import Streams
from desim.kernel.registry import DATA, PROTOCOLS
from desim.network_models.realistic import realistic_links
from desim.testing import WINDOW_NETWORKS, ScriptedLinks, Zeros, check_modes

load_plugins()

COLME = PROTOCOLS.get("private-colme")
#: Private-ColME's per-pair bookkeeping, compared between modes beside what is recorded.
COLME_STATE = ("included", "stale", "timed_out", "repeated")
NINE = ("classes", {"agents": 9, "class_means": [0.2, 0.8], "sigma": 0.5})


def scripted():
    """20 % losses, exponential delays (mean 2 slots): every message its own instant."""
    return ScriptedLinks(
        down=lambda rng, t, src, dst: rng.random(len(src)) < 0.2,
        delay=lambda rng, t, n: rng.exponential(2.0, n),
    )


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"mechanism": "pm2", "weights": "last", "timeout": 2.5},
        pytest.param(
            {
                "mechanism": "pm2",
                "weights": "wmom",
                "schedule": "rrr",
                "variance": "sch-var-2-bayes",
                "timeout": 4.25,
            },
            marks=pytest.mark.slow,
        ),
        pytest.param(
            {"mechanism": "pm2", "weights": "mom", "variance": "sch-var-1", "welch_df": "kappa"},
            marks=pytest.mark.slow,
        ),
        pytest.param(
            {"mechanism": "pm1", "weights": "mom", "variance": "sch-var-2", "timeout": 3.5},
            marks=pytest.mark.slow,
        ),
    ],
)
def test_windows_reproduce_one_message_per_instant_bit_for_bit(params):
    (runs,) = check_modes(COLME, params, networks=[scripted], t_max=150, state=COLME_STATE)
    assert list(runs) == ["instants", "windows"]  # scripted links are not counter-based


@pytest.mark.parametrize(
    "params",
    [
        {},
        # the slow set: RRR's exclusions and Sch-Var-2 on the same networks
        pytest.param(
            {"weights": "wmom", "schedule": "rrr", "variance": "sch-var-2", "timeout": 5.5},
            marks=pytest.mark.slow,
        ),
    ],
)
def test_windows_are_exact_on_realistic_networks(params):
    results = check_modes(COLME, params, t_max=150, state=COLME_STATE)
    for tables, runs in zip(WINDOW_NETWORKS, results, strict=True):
        links = runs["windows"].simulation.links
        assert links.per_slot == ("outages" in tables)
        assert links.per_message  # one question per window, whatever the times
        assert runs["windows"].simulation.network.dropped.sum() > 0  # the network lost some
        assert ("slot batches" in runs) == (params.get("schedule", "rr") == "rr")


class Batched(PROTOCOLS.get("private-colme")):
    """Private-ColME that records how many slots each `on_slots` call was handed, and keeps
    incremental combination sums at any size (to check them under batches too)."""

    incremental_above = 0

    def setup(self, ctx):
        super().setup(ctx)
        self.batch_sizes = []

    def on_slots(self, t, samples):
        self.batch_sizes.append(len(samples))
        super().on_slots(t, samples)


def run_batched(
    params: dict, links, windows: bool, checkpoints: np.ndarray, t_max: int = 300, seed: int = 5
):
    proto = Batched(build(Batched.Params, params, "test"))
    data = build(DATA.get(NINE[0]), NINE[1], "data").make(np.random.default_rng(seed))
    sim = Simulation(
        proto,
        data,
        t_max,
        Streams(seed, 0, 1, 2),
        links=links,
        checkpoints=checkpoints,
        per_agent=True,
        windows=windows,
    )
    return proto, sim, sim.run()


@pytest.mark.parametrize(
    "params",
    [
        {},
        # the slow set: batches under the other weights and variance schemes (the default set
        # checks each of them in windows, above)
        *(
            pytest.param(params, marks=pytest.mark.slow)
            for params in (
                {
                    "mechanism": "pm2",
                    "weights": "wmom",
                    "variance": "sch-var-2-bayes",
                    "timeout": 4.25,
                },
                {
                    "mechanism": "pm2",
                    "weights": "mom",
                    "variance": "sch-var-1",
                    "welch_df": "kappa",
                },
                {"mechanism": "pm1", "weights": "mom", "variance": "sch-var-2", "timeout": 3.5},
            )
        ),
    ],
)
def test_batches_of_slots_reproduce_one_message_per_instant_bit_for_bit(params):
    """Under RR the engine hands Private-ColME up to SLOT_BATCH slots at once, ending a batch at
    every measurement (here at uneven times, two of them adjacent): every measurement and the
    final state equal one message per instant, one slot at a time."""
    results = check_modes(
        Batched,
        params,
        data=NINE,
        t_max=150,
        seed=5,
        # 52 to 129: more slots than one batch holds, so batches of SLOT_BATCH are seen too
        checkpoints=np.array([1, 7, 50, 51, 52, 129, 150]),
        state=(*COLME_STATE, "sums", "sumsq", "counts"),
    )
    for runs in results:
        one, win = runs["instants"].protocol, runs["slot batches"].protocol
        assert not one.batch_sizes and not runs["windows"].protocol.batch_sizes
        assert max(win.batch_sizes) == SLOT_BATCH and sum(win.batch_sizes) == 150
        # the compensated combination sums (their terms may be added in another order)
        np.testing.assert_array_equal(
            one.sums_w.sums + one.sums_w.carry, win.sums_w.sums + win.sums_w.carry
        )
        assert runs["slot batches"].simulation.network.dropped.sum() > 0


@pytest.mark.parametrize(
    "params, links, batches",
    [
        ({"schedule": "rrr"}, lambda: realistic_links(IdealLinks(), WINDOW_NETWORKS[0]), False),
        ({}, scripted, False),  # its delays are the next draws of a stream, in the order asked
        ({}, lambda: realistic_links(IdealLinks(), WINDOW_NETWORKS[0]), True),
    ],
)
def test_slots_are_batched_only_under_rr_on_counter_based_links(params, links, batches):
    proto, sim, _ = run_batched(params, links(), True, np.array([300]), t_max=40)
    assert sim.slot_batches == batches
    assert bool(proto.batch_sizes) == batches


def batches_end_at_any_measurement_and_data_block_alike(seed, network, block, checkpoints):
    """Whatever the measurement times and data-block size (a batch also ends at a block's end),
    batched and one-slot-at-a-time runs measure the same bytes."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "DATA_BLOCK", block)
        (runs,) = check_modes(
            Batched,
            {"timeout": 6.5},
            networks=[WINDOW_NETWORKS[network]],
            data=NINE,
            t_max=130,
            seed=seed,
            checkpoints=np.unique(checkpoints),
        )
    assert sum(runs["slot batches"].protocol.batch_sizes) == 130


BATCH_CASES = given(
    seed=st.integers(0, 2**31),
    network=st.integers(0, len(WINDOW_NETWORKS) - 1),
    block=st.sampled_from([5, 37, 1024]),
    checkpoints=st.lists(st.integers(1, 130), min_size=1, max_size=6),
)
# A few cases in the default set, more in the slow set: each case is three full runs.
test_batches_end_at_any_measurement_and_data_block_alike = settings(max_examples=4, deadline=None)(
    BATCH_CASES(batches_end_at_any_measurement_and_data_block_alike)
)
test_batches_end_at_any_measurement_and_data_block_alike_more_cases = pytest.mark.slow(
    settings(max_examples=12, deadline=None)(
        BATCH_CASES(batches_end_at_any_measurement_and_data_block_alike)
    )
)


# ---- contracts the kernel enforces -----------------------------------------------------------


@dataclass(frozen=True)
class NoParams:
    """No parameters."""


class Pinger(SlotBatched):
    """Every agent pings the next one every slot, without naming its messages; with `late`,
    every delivery sets a deadline at its own instant (inside the window)."""

    Params = NoParams
    message_kinds = ("ping",)
    late = False

    def setup(self, ctx):
        super().setup(ctx)
        self.agents = np.arange(ctx.n_agents)

    def on_samples(self, t, samples):
        self.ctx.send("ping", self.agents, np.roll(self.agents, 1))

    def on_slots(self, t, samples):
        for k in range(len(samples)):
            at = np.full(len(self.agents), float(t + k))
            self.ctx.send("ping", self.agents, np.roll(self.agents, 1), at=at)

    def on_deliver(self, batch):
        if self.late:
            self.ctx.call_at(float(batch.delivered_at[0]), lambda: None)

    def on_window_end(self):
        pass

    def estimates(self):
        return np.zeros(len(self.agents))


def run_pinger(proto, windows=True):
    links = realistic_links(IdealLinks(), WINDOW_NETWORKS[0])
    return Simulation(proto, Zeros(4), 20, Streams(1, 0, 1, 2), links=links, windows=windows).run()


def test_an_unnamed_send_under_slot_batches_is_refused_naming_its_kind():
    with pytest.raises(ValueError, match=r"send\('ping'.*without ids.*SlotBatched"):
        run_pinger(Pinger(NoParams()))
    run_pinger(Pinger(NoParams()), windows=False)  # one slot at a time: names are optional


def test_a_deadline_set_inside_a_window_is_refused():
    class Late(Pinger):
        late = True

        def batches_slots(self):
            return False

    with pytest.raises(RuntimeError, match="inside a window"):
        run_pinger(Late(NoParams()))


def test_a_window_safe_protocol_must_say_how_a_window_ends():
    class NoEnd(WindowSafe):
        Params = NoParams

    with pytest.raises(TypeError, match="on_window_end"):
        NoEnd(NoParams())
