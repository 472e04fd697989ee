"""Private-ColME's forgetting beyond every peer over ideal links: on a graph, over links that are
not ideal, under a per-agent budget; and the settings it still refuses, each in one line.

A window or a reset differences two releases the querier holds (`desim.models.colme.forgetting`),
so on a complete graph it is the all-peers run bit for bit, through the general (asynchronous)
path with zero latency it is the ideal run bit for bit, with W ≥ t_max it is T over every
release (up to the rounding of t_j R_j / t_j), and the ledger is the one without forgetting.
"""

from __future__ import annotations

import dp_accounting  # noqa: F401  (the privacy metric's; imported once here, not in a test)
import numpy as np
import pandas as pd
import pytest
from _forget import (
    DRIFT,
    LATENCY,
    SMALL,
    assert_refused_in_one_line,
    forget_run,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.engine import Simulation
from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.models.colme.protocol import PrivateColME
from desim.models.forgetting import Forget, PrefixWindow, difference_noise_count
from desim.study.scenario import Scenario, resolve, run
from desim.testing import WINDOW_NETWORKS, check_modes
from desim.topologies.files import build_graph

load_plugins()
RING = {"model": "regular", "degree": 4}


_run = forget_run


def _same(one, other) -> None:
    pd.testing.assert_frame_equal(one.metrics, other.metrics, check_exact=True)
    pd.testing.assert_frame_equal(one.agents, other.agents, check_exact=True)


# ---------------------------------------------------------------------------- on a graph


@pytest.mark.parametrize("forget", [{"window": 30}, {"reset": 40}])
@pytest.mark.parametrize("network", [{"links": "ideal"}, LATENCY])
def test_a_complete_graph_with_forget_gives_the_bytes_of_all_peers(forget, network):
    """The same releases, per-pair arithmetic and dense row sums over the pairs that exist."""
    params = {"forget": forget}
    every = _run({**params, "peers": "all"}, network, {"model": "complete"})
    graph = _run({**params, "peers": "topology"}, network, {"model": "complete"})
    _same(every, graph)


@pytest.mark.parametrize("network", [{"links": "ideal"}, LATENCY])
def test_a_window_longer_than_the_run_is_t_over_every_release_on_a_graph(network):
    """W ≥ t_max: every base is the empty prefix, T^W = t_j R_j / t_j = R_j and Var[T^W] =
    (σ²t_j + σ_DP² j)/t_j², T and Var[T] of ``last`` weights: the MSE agrees to rounding."""
    plain = _run({"peers": "topology"}, network, RING)
    window = _run({"peers": "topology", "forget": {"window": 120}}, network, RING)
    a, b = plain.metrics, window.metrics
    np.testing.assert_allclose(b.value.to_numpy(), a.value.to_numpy(), rtol=1e-9)


def test_above_incremental_above_a_graph_sums_its_windows_edge_by_edge():
    """Above `incremental_above` agents the rows are summed by edge in CSR order (O(M·r)):
    the same terms as the dense rows, added in another order."""
    s = Scenario(
        protocol="private-colme",
        params={"peers": "topology", "forget": {"window": 30}},
        data=DRIFT,
        topology=RING,
        t_max=60,
    )
    r, streams = resolve(s), Streams(1, 0, 5, 7)
    data = r.data_params.make(streams.get("population"))
    data.public["graph"] = build_graph(r.topology, data, streams.get("topology"))
    proto = r.protocol_cls(r.protocol_params)
    Simulation(proto, data, 60, streams).run()
    dense = proto.estimates()
    assert np.isfinite(proto.forget.var).any()
    proto.incremental_above = 0
    np.testing.assert_allclose(proto.estimates(), dense, rtol=1e-13)


# ---------------------------------------------------------------------------- non-ideal links


def test_zero_latency_through_the_general_path_is_ideal_links_bit_for_bit():
    params = {"forget": {"window": 30}, "mechanism": "pm2"}
    ideal = _run(params)
    general = _run(params, {"links": "fixed-latency", "slots": 0.0})
    keep = ~general.metrics.metric.str.startswith("dropped")
    pd.testing.assert_frame_equal(
        ideal.metrics, general.metrics[keep].reset_index(drop=True), check_exact=True
    )
    pd.testing.assert_frame_equal(ideal.agents, general.agents, check_exact=True)


@pytest.mark.parametrize("forget", [{"window": 25}, {"reset": 60}])
def test_every_delivery_mode_gives_the_same_windows(forget):
    """One message per instant and windows take a pair's releases in the same order."""
    check_modes(PrivateColME, {"forget": forget}, WINDOW_NETWORKS[:1], state=["forget.var"])


def test_a_release_made_before_a_reset_and_taken_after_it_has_no_weight():
    """reset = 30, latency: at t_max = 34 a pair whose last release taken was made before
    slot 30 (t_b = 1/D of the statistic's last release) holds no sample from τ on: weight 0,
    whether it arrived before τ (every T^W forgotten at τ) or late, after it."""
    tau = 30
    s = Scenario(
        protocol="private-colme",
        params={"forget": {"reset": tau}},
        data=SMALL,
        network={"links": "ideal", "latency": {"model": "exponential", "mean": 4.0}},
        t_max=tau + 4,
    )
    r, streams = resolve(s), Streams(1, 0, 5, 7)
    proto = r.protocol_cls(r.protocol_params)
    Simulation(
        proto, r.data_params.make(streams.get("population")), s.t_max, streams, links=r.links
    ).run()
    m = SMALL["agents"]
    pairs = np.flatnonzero(~np.eye(m, dtype=bool))
    _, data, _, n = proto.stat.terms(pairs)
    made = np.round(1.0 / np.where(n > 0, data, np.inf))  # t_b of each pair's last release
    before = (n > 0) & (made < tau)
    assert before.any()
    assert np.isinf(proto.forget.var.ravel()[pairs[before]]).all()


def test_with_gaps_the_base_is_the_oldest_release_received_in_the_window():
    """Releases j = 1 … 6 every 3 slots (t = 3j, prefix sums t: R = 1), 3 and 5 lost, W = 8:
    at j = 4 (t = 12) the base is j = 2 (t = 6, 12 − 6 ≤ 8; 3 lost), at j = 6 (t = 18) it is
    j = 4 (t = 12; 5 lost); the p-sums between carry j − i noises under PM-I."""
    window = PrefixWindow(Forget(window=8), n_pairs=1, kept=3, gaps=True)
    got = []
    for j in (1, 2, 4, 6):
        t = np.array([3.0 * j])
        n, s, i = window.take(np.array([0]), np.array([1.0]), t, np.array([j]))
        got.append((n[0], s[0], i[0]))
    assert got == [(3, 3, 0), (6, 6, 0), (6, 6, 2), (6, 6, 4)]


def test_with_gaps_a_cell_holding_an_older_release_is_not_a_base():
    """kept = 1 (a ring of 2 cells, the last two indices): j = 3 lands on the cell of 1 and 2
    was lost, so release 3's window (W = 100) has no other release held (n = 0: T undefined);
    release 4's starts at 3, even though releases 0 and 1 were within W."""
    window = PrefixWindow(Forget(window=100), n_pairs=1, kept=1, gaps=True)
    out = []
    for j, t in ((1, 2), (3, 6), (4, 8)):
        n, _, i = window.take(np.array([0]), np.array([1.0]), np.array([float(t)]), np.array([j]))
        out.append((n[0], i[0]))
    assert out == [(2, 0), (0, 3), (2, 3)]


@pytest.mark.parametrize(
    ("network", "topology"), [({"links": "ideal"}, RING), (LATENCY, None), (LATENCY, RING)]
)
def test_a_reset_forgets_the_old_class_on_a_graph_and_over_late_links(network, topology):
    """Every agent switches class at τ = 40 (jump 0.6): without forgetting (τ − 1)/t of the
    old mean stays (squared bias ≈ (0.6 · 39/400)² ≈ 3.4e-3 at t = 400); with a reset at τ
    the estimates are over samples of the new means only."""
    data = {**SMALL, "agents": 20, "drift": {"model": "switch", "fraction": 1.0, "at": 40}}
    out = []
    for forget in (None, {"reset": 40}):
        params = {"epsilon": 5.0, "peers": "topology" if topology else "all"}
        if forget:
            params["forget"] = forget
        s = Scenario(
            protocol="private-colme",
            params=params,
            data=data,
            network=network,
            topology=topology,
            t_max=400,
            checkpoints=2,
        )
        m = run(s, streams=Streams(3, 0, 11, 22)).metrics
        out.append(float(m[(m.metric == "mse") & (m.t == 400)].value.iloc[0]))
    plain, reset = out
    assert plain > 2e-3 and reset < plain / 3


@settings(max_examples=40, deadline=None)
@given(
    received=st.lists(st.booleans(), min_size=1, max_size=40).filter(any),
    steps=st.lists(st.integers(1, 6), min_size=40, max_size=40),
    window=st.integers(1, 30),
    kept=st.integers(1, 9),
)
def test_with_gaps_the_base_is_the_reference_from_scratch(received, steps, window, kept):
    """Releases 1 … J made at increasing t, a subset received in order: each one's base is the
    oldest received release i (the empty prefix 0 counts as received) with j − kept ≤ i < j and
    t_j − t_i ≤ W, or j itself (n = 0) when there is none."""
    ts = np.concatenate(([0], np.cumsum(steps)[: len(received)])).astype(float)
    prefix = np.random.default_rng(len(received)).normal(size=len(ts)) * 10
    prefix[0] = 0.0
    pw = PrefixWindow(Forget(window=window), n_pairs=1, kept=kept, gaps=True)
    held = [0]
    for j in (j for j, got in enumerate(received, start=1) if got):
        candidates = [i for i in held if j - kept <= i and ts[j] - ts[i] <= window]
        i = min(candidates, default=j)
        value = np.array([prefix[j] / ts[j]])
        n, total, base = pw.take(np.array([0]), value, ts[[j]], np.array([j]))
        assert (base[0], n[0]) == (i, ts[j] - ts[i])
        assert total[0] == pytest.approx(prefix[j] - prefix[i], abs=1e-9)
        held.append(j)


# ---------------------------------------------------------------------------- budgets


def test_a_degraded_difference_counts_each_node_with_its_variance():
    """PM-II, ρ = 4 from release j_d = 5: j = 6 = {(1, 3), (2, 1)}, i = 4 = {(2, 1)} share
    (2, 1); (1, 3) was made at release 6 ≥ 5: weight ρ. j = 5 = {(0, 5), (2, 1)} against
    i = 2 = {(1, 1)}: (0, 5) at 5 (ρ), (2, 1) made at 4 (1), (1, 1) made at 2 (1)."""
    rho = 4.0
    levels = 4

    def weights(j, jd):  # ρ at the levels whose node ⌊j/2^ℓ⌋·2^ℓ is ≥ j_d
        made = (np.asarray(j)[:, None] >> np.arange(levels)) << np.arange(levels)
        return np.where(made >= jd, rho, 1.0)

    j, i = np.array([6, 5]), np.array([4, 2])
    got = difference_noise_count("pm2", j, i, (weights(j, 5), weights(i, 5)))
    np.testing.assert_array_equal(got, [rho, rho + 2.0])
    ones = np.ones((2, levels))
    np.testing.assert_array_equal(
        difference_noise_count("pm2", j, i, (ones, ones)), difference_noise_count("pm2", j, i)
    )


@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
@pytest.mark.parametrize("action", ["stop", "degrade"])
def test_under_a_budget_the_ledger_with_forget_is_the_ledger_without(mechanism, action):
    """A withheld release is never received and a degraded one is made all the same: the
    releases made, and so every ε of the ledger and the budget's counts, are those without."""
    budget = {"epsilon": 2.0, "against": "colluding", "action": action}
    params = {"mechanism": mechanism, "budget": budget}
    plain = _run(params)
    window = _run({**params, "forget": {"window": 30}})
    ledger = ~plain.metrics.metric.isin(["mse", "accuracy"])
    a, b = plain.metrics[ledger], window.metrics[ledger.to_numpy()]
    assert a.metric.str.startswith("eps").any()
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))


@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
def test_a_degraded_window_longer_than_the_run_is_t_over_every_release(mechanism):
    """W ≥ t_max under ``degrade``: Var[T^W] = (σ²t_j + σ_DP² c_j)/t_j², the statistic's own
    Var[T] with the degraded p-sums (c_j, or each node's ρ), to rounding."""
    budget = {"epsilon": 1.0, "against": "colluding", "action": "degrade"}
    params = {"mechanism": mechanism, "budget": budget}
    plain = _run(params)
    window = _run({**params, "forget": {"window": 120}})
    a, b = plain.metrics, window.metrics
    np.testing.assert_allclose(b.value.to_numpy(), a.value.to_numpy(), rtol=1e-9)
    assert (a.metric == "mse").any()


# ---------------------------------------------------------------------------- still refused


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"variance": "sch-var-1"}, "variance = 'sch-var-1' not yet (Sch-Var-1's release is"),
        ({"weights": "wmom"}, "weights = 'wmom' not yet"),
    ],
)
def test_what_forget_still_refuses_is_said_in_one_line(params, fragment):
    assert_refused_in_one_line(params, fragment)
