"""Window batching is exact: with exact delivery times, windows give bit for bit what
one-message-per-instant delivery gives, for every window-safe protocol, under random
latencies, losses, outages, churn and stragglers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import desim.kernel.engine as engine
from desim.kernel.engine import SLOT_BATCH, Simulation
from desim.kernel.links import IdealLinks
from desim.kernel.params import build
from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.kernel.registry import DATA, PROTOCOLS
from desim.network_models.realistic import realistic_links
from desim.testing import WINDOW_NETWORKS, ScriptedLinks

load_plugins()

CLASSES = {"agents": 8, "class_means": [0.2, 0.8], "sigma": 0.5}


def run(protocol: str, params: dict, links, windows: bool, t_max: int = 150, seed: int = 3):
    cls = PROTOCOLS.get(protocol)
    proto = cls(build(cls.Params, params, "test"))
    data = build(DATA.get("classes"), CLASSES, "data").make(np.random.default_rng(seed))
    sim = Simulation(
        proto,
        data,
        t_max,
        Streams(seed, 0, 1, 2),
        links=links,
        checkpoints=np.arange(1, t_max + 1),
        per_agent=True,
        windows=windows,
    )
    out = sim.run()
    return proto, sim, out


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
        {
            "mechanism": "pm2",
            "weights": "wmom",
            "schedule": "rrr",
            "variance": "sch-var-2-bayes",
            "timeout": 4.25,
        },
        {"mechanism": "pm2", "weights": "mom", "variance": "sch-var-1", "welch_df": "kappa"},
        {"mechanism": "pm1", "weights": "mom", "variance": "sch-var-2", "timeout": 3.5},
    ],
)
def test_windows_reproduce_one_message_per_instant_bit_for_bit(params):
    one, sim_one, out_one = run("private-colme", params, scripted(), windows=False)
    win, sim_win, out_win = run("private-colme", params, scripted(), windows=True)
    assert sim_win.network.windows and not sim_one.network.windows
    assert out_one.metrics.to_csv().encode() == out_win.metrics.to_csv().encode()
    assert out_one.agents.to_csv().encode() == out_win.agents.to_csv().encode()
    np.testing.assert_array_equal(one.stat._state, win.stat._state)
    np.testing.assert_array_equal(one.stat.kappa, win.stat.kappa)
    np.testing.assert_array_equal(one.included, win.included)
    for name in ("stale", "timed_out", "repeated"):
        np.testing.assert_array_equal(getattr(one, name), getattr(win, name))
    np.testing.assert_array_equal(sim_one.network.sent, sim_win.network.sent)
    np.testing.assert_array_equal(sim_one.network.dropped, sim_win.network.dropped)


@pytest.mark.parametrize("tables", WINDOW_NETWORKS)
@pytest.mark.parametrize(
    "params", [{}, {"weights": "wmom", "schedule": "rrr", "variance": "sch-var-2", "timeout": 5.5}]
)
def test_windows_are_exact_on_realistic_networks(tables, params):
    def links():
        return realistic_links(IdealLinks(), tables)

    one, sim_one, out_one = run("private-colme", params, links(), windows=False)
    win, sim_win, out_win = run("private-colme", params, links(), windows=True)
    assert sim_win.network.windows
    assert sim_win.links.per_slot == ("outages" in tables)
    assert sim_win.links.per_message  # one question per window, whatever the times
    assert out_one.metrics.to_csv().encode() == out_win.metrics.to_csv().encode()
    assert out_one.agents.to_csv().encode() == out_win.agents.to_csv().encode()
    np.testing.assert_array_equal(sim_one.network.dropped, sim_win.network.dropped)
    assert sim_win.network.dropped.sum() > 0  # the network did lose messages


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
    data = build(DATA.get("classes"), {**CLASSES, "agents": 9}, "data").make(
        np.random.default_rng(seed)
    )
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


@pytest.mark.parametrize("tables", WINDOW_NETWORKS)
@pytest.mark.parametrize(
    "params",
    [
        {},
        {"mechanism": "pm2", "weights": "wmom", "variance": "sch-var-2-bayes", "timeout": 4.25},
        {"mechanism": "pm2", "weights": "mom", "variance": "sch-var-1", "welch_df": "kappa"},
        {"mechanism": "pm1", "weights": "mom", "variance": "sch-var-2", "timeout": 3.5},
    ],
)
def test_batches_of_slots_reproduce_one_message_per_instant_bit_for_bit(tables, params):
    """Under RR the engine hands Private-ColME up to SLOT_BATCH slots at once, ending a batch at
    every measurement (here at uneven times, two of them adjacent): every measurement and the
    final state equal one message per instant, one slot at a time."""
    checkpoints = np.array([1, 7, 50, 51, 52, 129, 200, 300])

    def links():
        return realistic_links(IdealLinks(), tables)

    one, sim_one, out_one = run_batched(params, links(), False, checkpoints)
    win, sim_win, out_win = run_batched(params, links(), True, checkpoints)
    assert not one.batch_sizes and sim_win.slot_batches
    assert max(win.batch_sizes) == SLOT_BATCH and sum(win.batch_sizes) == 300
    assert out_one.metrics.to_csv().encode() == out_win.metrics.to_csv().encode()
    assert out_one.agents.to_csv().encode() == out_win.agents.to_csv().encode()
    for name in ("_state", "kappa"):
        np.testing.assert_array_equal(getattr(one.stat, name), getattr(win.stat, name))
    for name in ("included", "stale", "timed_out", "repeated", "sums", "sumsq", "counts"):
        np.testing.assert_array_equal(getattr(one, name), getattr(win, name))
    # the compensated combination sums (their terms may be added in another order)
    np.testing.assert_array_equal(
        one.sums_w.sums + one.sums_w.carry, win.sums_w.sums + win.sums_w.carry
    )
    np.testing.assert_array_equal(sim_one.network.sent, sim_win.network.sent)
    np.testing.assert_array_equal(sim_one.network.dropped, sim_win.network.dropped)
    assert sim_win.network.dropped.sum() > 0


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


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    network=st.integers(0, len(WINDOW_NETWORKS) - 1),
    block=st.sampled_from([5, 37, 1024]),
    checkpoints=st.lists(st.integers(1, 130), min_size=1, max_size=6),
)
def test_batches_end_at_any_measurement_and_data_block_alike(seed, network, block, checkpoints):
    """Whatever the measurement times and data-block size (a batch also ends at a block's end),
    batched and one-slot-at-a-time runs measure the same bytes."""

    def links():
        return realistic_links(IdealLinks(), WINDOW_NETWORKS[network])

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "DATA_BLOCK", block)
        cp = np.unique(checkpoints)
        _, _, one = run_batched({"timeout": 6.5}, links(), False, cp, t_max=130, seed=seed)
        win, sim, batched = run_batched({"timeout": 6.5}, links(), True, cp, t_max=130, seed=seed)
    assert sim.slot_batches and sum(win.batch_sizes) == 130
    assert one.metrics.to_csv().encode() == batched.metrics.to_csv().encode()
    assert one.agents.to_csv().encode() == batched.agents.to_csv().encode()
