"""Private-ColME's forgetting with unknown variances and with the trimmed combination
(`desim.models.colme.forgetting`): Sch-Var-2 over the window's releases, the agent's own sample
variance over its window, the Welch test and eq. (5)'s weights over both; the trimmed
combination over the windowed statistics of the accepted peers.

With W ≥ t_max every base is the empty prefix and the windowed Sch-Var-2 is the one over every
release: V_{b→a} the same, the metrics to rounding (rtol 1e-9: (ΣP)²/n is formed as
t R · (t R / t), not t R · R). The ledger is the one without forgetting (no release is added).
"""

from __future__ import annotations

import types

import dp_accounting  # noqa: F401  (the privacy metric's; imported once here, not in a test)
import numpy as np
import pandas as pd
import pytest
from _forget import (
    LATENCY,
    assert_same_ledger,
    forget_run,
    mse_without_and_with_reset,
    windowed_releases,
)
from _runs import class_data, every_slot
from hypothesis import settings

from desim.kernel.engine import Simulation
from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.models.colme.combination import trimmed_sums
from desim.models.colme.forgetting import WindowedVariances
from desim.models.colme.model import combine
from desim.models.colme.protocol import PrivateColME
from desim.models.colme.variance import noise_counts, sample_variance, schvar2_raw_and_K
from desim.models.forgetting import Forget, ForgettingSums, PrefixWindow, difference_noise_count
from desim.study.scenario import Scenario, resolve

load_plugins()
UNKNOWN = ("sch-var-2", "sch-var-2-bayes")


_run = forget_run


# ------------------------------------------------------------------ the agent's own variance


@pytest.mark.parametrize("forget", [Forget(window=7), Forget(reset=12)])
def test_the_own_sample_variance_is_over_the_rules_samples(forget):
    """V_a over the window (the last 7 samples) or since the reset (slots 12 … t): numpy's
    unbiased variance of those samples, to rounding."""
    x = np.random.default_rng(4).normal(1.0, 2.0, size=(30, 3))
    own = ForgettingSums(forget, 3, squares=True)
    for t in range(1, 31):
        own.add(t, x[t - 1])
        kept = x[max(0, t - 7) : t] if forget.window else x[(t >= 12) * 11 : t]
        got = sample_variance(own.sums, own.sumsq, np.full(3, own.weight))
        want = kept.var(axis=0, ddof=1) if len(kept) > 1 else np.full(3, np.inf)
        np.testing.assert_allclose(got, want, rtol=1e-9)


# ------------------------------------------------------------------ Sch-Var-2 over the window


def _windowed(forget: Forget, mechanism: str, n_pairs: int, kept: int, gaps: bool = False):
    """A pair window and the windowed Sch-Var-2 over it (plain, Welch over samples)."""
    prefixes = PrefixWindow(forget, n_pairs, kept, gaps)
    params = types.SimpleNamespace(
        mechanism=mechanism, variance="sch-var-2", prior="paper", welch_df="printed", forget=forget
    )
    return prefixes, WindowedVariances(params, prefixes, n_pairs)


def _reference(ts, prefix, held, j, i, mechanism):
    """schvar2_raw_and_K (seed 002 §V-B, general form) over the held releases i … j: their
    differences, lengths and noise counts, and the noise of t_j R_j − t_i R_i."""
    chain = [k for k in held if i <= k <= j]
    psums = np.diff(prefix[chain])
    lengths = np.diff(ts[chain])
    c = difference_noise_count(mechanism, np.array(chain[1:]), np.array(chain[:-1]))
    c_tot = float(difference_noise_count(mechanism, np.array([j]), np.array([i]))[0])
    return schvar2_raw_and_K(psums, lengths, mechanism, counts=(c, c_tot))


@settings(max_examples=40, deadline=None)
@windowed_releases
def test_the_windowed_sch_var_2_is_the_general_form_over_the_window(
    received, steps, rule, size, mechanism
):
    """Releases 1 … J at increasing t, a subset received in order: at each, (V', K) of the
    windowed Sch-Var-2 are `schvar2_raw_and_K` over the received releases from its base to j
    with each difference's noise count (PM-II: the unshared nodes), and k its differences."""
    ts = np.concatenate(([0], np.cumsum(steps)[: len(received)])).astype(float)
    prefix = np.random.default_rng(len(received)).normal(size=len(ts)) * 10
    prefix[0] = 0.0
    forget = Forget(window=size) if rule == "window" else Forget(reset=size)
    prefixes, variances = _windowed(forget, mechanism, 1, kept=len(ts), gaps=True)
    held = [0]
    one = np.array([0])
    for j in (j for j, got in enumerate(received, start=1) if got):
        jj = np.array([j])
        value = np.array([prefix[j] / ts[j]])
        n, total, i = prefixes.take(one, value, ts[[j]], jj)
        sums, _ = variances.take(one, value, ts[[j]], jj, n, total, i)
        held.append(j)
        if n[0] == 0:
            continue
        v_raw, k_noise = variances.unbiased(sums, 1.0, n, total, jj, i)
        assert sums[2][0] == len([k for k in held if i[0] < k <= j])
        if sums[2][0] < 2:
            continue
        want_v, want_k = _reference(ts, prefix, held, j, int(i[0]), mechanism)
        assert v_raw[0] == pytest.approx(want_v, rel=1e-9, abs=1e-9)
        assert k_noise[0] == pytest.approx(want_k, rel=1e-9, abs=1e-12)


def test_from_the_empty_prefix_the_noise_counts_are_the_papers():
    """Base 0, consecutive releases: c_k and c_tot are `noise_counts` (1 and j under PM-I; 1 +
    lsb(k) and w_H(j) under PM-II), the Sch-Var-2 of every release."""
    for mechanism in ("pm1", "pm2"):
        ts = np.arange(0, 33, 3.0)
        prefix = np.random.default_rng(1).normal(size=len(ts))
        prefix[0] = 0.0
        want = schvar2_raw_and_K(np.diff(prefix), np.diff(ts), mechanism)
        c, c_tot = noise_counts(10, mechanism)
        again = schvar2_raw_and_K(np.diff(prefix), np.diff(ts), mechanism, counts=(c, c_tot))
        got = _reference(ts, prefix, list(range(11)), 10, 0, mechanism)
        np.testing.assert_allclose(got, want, rtol=1e-12)
        np.testing.assert_allclose(again, want, rtol=1e-12)


def _simulate_pairs(forget: Forget, mechanism: str, shift: float, seed: int = 5):
    """1000 pairs, releases every 8 slots up to t = 400 with PM-I or PM-II Gaussian noise
    (σ_DP = 3), samples N(μ, 1) whose μ moves by `shift` at slot 201: each pair's V' − Kσ_DP²
    at its last release."""
    rng = np.random.default_rng(seed)
    pairs, every, t_max, sigma_dp = 1000, 8, 400, 3.0
    x = rng.normal(size=(pairs, t_max)) + shift * (np.arange(1, t_max + 1) > 200)
    cum = np.cumsum(x, axis=1)
    levels = 6
    nodes = rng.normal(0.0, sigma_dp, size=(pairs, levels, t_max // every + 1))
    prefixes, variances = _windowed(forget, mechanism, pairs, kept=t_max // every + 1)
    every_pair = np.arange(pairs)
    for j in range(1, t_max // every + 1):
        t = j * every
        if mechanism == "pm1":  # Z_j: the p-sums 1 … j
            z = nodes[:, 0, 1 : j + 1].sum(axis=1)
        else:  # the node (ℓ, j >> ℓ) of each set bit ℓ of j
            z = sum(nodes[:, lv, j >> lv] for lv in range(levels) if j >> lv & 1)
        value = (cum[:, t - 1] + z) / t
        tt, jj = np.full(pairs, float(t)), np.full(pairs, j)
        n, total, i = prefixes.take(every_pair, value, tt, jj)
        sums, _ = variances.take(every_pair, value, tt, jj, n, total, i)
    v_raw, k_noise = variances.unbiased(sums, sigma_dp**2, n, total, jj, i)
    return v_raw - k_noise


@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
@pytest.mark.parametrize("forget", [Forget(window=150), Forget(reset=201)])
def test_after_a_switch_the_windowed_sch_var_2_is_unbiased(mechanism, forget):
    """After a mean shift of 2 at slot 201, V' − Kσ_DP² over a window inside the new samples
    (the last 150 slots at t = 400) or since a reset at 201 is unbiased for σ² = 1 (Lemma 7 over
    those samples): the mean over 1000 independent pairs within 4 standard errors. Over every
    sample (W ≥ t_max) it carries the shift's variance, ≈ Δ²/4 = 1 more."""
    v = _simulate_pairs(forget, mechanism, shift=2.0)
    se = v.std() / np.sqrt(len(v))
    assert abs(v.mean() - 1.0) < 4 * se
    every = _simulate_pairs(Forget(window=1000), mechanism, shift=2.0)
    assert every.mean() - 1.0 > 0.8


# ------------------------------------------------------------------ the protocol


@pytest.mark.parametrize("variance", UNKNOWN)
@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
@pytest.mark.parametrize("welch_df", ["printed", "kappa"])
def test_a_window_longer_than_the_run_is_sch_var_2_over_every_release(
    variance, mechanism, welch_df
):
    """W ≥ t_max: the same V_{b→a} for every pair, the same decisions, the metrics to rounding."""
    params = {"variance": variance, "mechanism": mechanism, "welch_df": welch_df}
    plain, out = every_slot(params, 10, 80)
    window, out_w = every_slot({**params, "forget": {"window": 80}}, 10, 80)
    np.testing.assert_allclose(window.v_hat, plain.v_hat, rtol=1e-12)
    np.testing.assert_array_equal(window.included, plain.included)
    np.testing.assert_allclose(out_w.metrics.value, out.metrics.value, rtol=1e-9)


@pytest.mark.parametrize("network", [{"links": "ideal"}, LATENCY])
def test_over_late_links_a_long_window_is_sch_var_2_over_every_release(network):
    """Through the general path (releases late, some stale): the window is over the releases
    received, and with W ≥ t_max its Sch-Var-2 differences the ones the plain estimator does."""
    params = {"variance": "sch-var-2"}
    plain = _run(params, network)
    window = _run({**params, "forget": {"window": 120}}, network)
    np.testing.assert_allclose(window.metrics.value, plain.metrics.value, rtol=1e-9)


@pytest.mark.parametrize("forget", [{"window": 30}, {"reset": 40}])
@pytest.mark.parametrize("variance", UNKNOWN)
def test_the_ledger_with_forget_is_the_ledger_without_for_unknown_variances(forget, variance):
    """Sch-Var-2 is post-processing of the releases: every ε of the ledger is the same."""
    params = {"variance": variance, "mechanism": "pm2"}
    plain = _run(params)
    forgets = _run({**params, "forget": forget})
    assert_same_ledger(plain, forgets)


@pytest.mark.parametrize("forget", [{"window": 30}, {"reset": 40}])
def test_a_complete_graph_with_unknown_variances_gives_the_bytes_of_all_peers(forget):
    params = {"forget": forget, "variance": "sch-var-2-bayes"}
    every = _run({**params, "peers": "all"}, topology={"model": "complete"})
    graph = _run({**params, "peers": "topology"}, topology={"model": "complete"})
    pd.testing.assert_frame_equal(every.metrics, graph.metrics, check_exact=True)
    pd.testing.assert_frame_equal(every.agents, graph.agents, check_exact=True)


def test_on_a_changing_graph_a_long_window_is_sch_var_2_over_every_release():
    """Rewired every 15 slots: a kept link keeps its sums, a new one starts empty (as the
    plain estimator's pair state does), so W ≥ t_max agrees to rounding."""
    topology = {"model": "regular", "degree": 4, "rewire": {"every": 15, "fraction": 0.3}}
    params = {"variance": "sch-var-2", "peers": "topology"}
    plain = _run(params, topology=topology)
    window = _run({**params, "forget": {"window": 120}}, topology=topology)
    np.testing.assert_allclose(window.metrics.value, plain.metrics.value, rtol=1e-9)
    reset = _run({**params, "forget": {"reset": 60}}, topology=topology)
    assert np.isfinite(reset.metrics.value).all()


@pytest.mark.parametrize("forget", [{"window": 30}, {"reset": 40}])
def test_a_change_that_moves_no_link_keeps_the_windowed_variances(forget):
    """Rewiring that moves nothing (round(q·|E|) = 0): every pair's windowed Sch-Var-2 state
    carried to itself, the static graph's bytes."""
    ring = {"model": "regular", "degree": 4}
    params = {"variance": "sch-var-2", "peers": "topology", "forget": forget}
    static = _run(params, topology=ring)
    tiny = _run(params, topology={**ring, "rewire": {"every": 10, "fraction": 1e-9}})
    pd.testing.assert_frame_equal(static.metrics, tiny.metrics, check_exact=True)
    pd.testing.assert_frame_equal(static.agents, tiny.agents, check_exact=True)


def test_a_reset_forgets_the_old_class_with_unknown_variances():
    """Every agent switches class at τ = 40 (jump 0.6): without forgetting the squared bias
    (0.6 · 39/400)² ≈ 3.4e-3 stays at t = 400 and V_a carries the jump's variance; with a reset
    at τ the means and variances are over the new class's samples."""
    plain, reset = mse_without_and_with_reset({"epsilon": 5.0, "variance": "sch-var-2-bayes"})
    assert plain > 2e-3 and reset < plain / 3


# ------------------------------------------------------------------ the trimmed combination


def test_a_trim_of_zero_with_forget_is_the_weighted_combination_bit_for_bit():
    """β = 0 drops no one: Σ w T over the accepted peers, the same floats."""
    weighted = _run({"forget": {"window": 30}})
    trimmed = _run({"forget": {"window": 30}, "combination": "trimmed", "trim": 0.0})
    pd.testing.assert_frame_equal(weighted.metrics, trimmed.metrics, check_exact=True)


def test_a_trimmed_window_longer_than_the_run_is_the_trimmed_combination():
    params = {"combination": "trimmed", "trim": 0.2}
    plain = _run(params)
    window = _run({**params, "forget": {"window": 120}})
    np.testing.assert_allclose(window.metrics.value, plain.metrics.value, rtol=1e-9)


@pytest.mark.parametrize("forget", [{"window": 30}, {"reset": 40}])
def test_the_trimmed_estimate_trims_the_windowed_statistics(forget):
    """At t_max each estimate is Lemma 4 over the accepted peers left after dropping the
    ⌊β n⌋ lowest and highest T^W (hand-built from the windows), with a's own window."""
    params = {"combination": "trimmed", "trim": 0.25, "forget": forget, "epsilon": 4.0}
    proto, out = every_slot(params, 12, 90)
    w = proto.forget
    weight = np.where(proto.included, 1.0 / w.var, 0.0)
    np.fill_diagonal(weight, 0.0)
    n = (weight > 0).sum(axis=1)
    num, den = np.zeros(12), np.zeros(12)
    for a in range(12):  # by hand: sort the accepted peers' T^W, keep the middle
        peers = np.flatnonzero(weight[a] > 0)
        order = peers[np.argsort(w.value[a, peers], kind="stable")]
        cut = int(np.floor(0.25 * n[a]))
        keep = order[cut : len(order) - cut]
        num[a], den[a] = (weight[a, keep] * w.value[a, keep]).sum(), weight[a, keep].sum()
    assert (n >= 4).any()
    want = combine(w.own.mean(), w.own.effective() / proto.sigma2, num, den)
    np.testing.assert_allclose(proto.estimates(), want, rtol=1e-12)
    np.testing.assert_allclose(trimmed_sums(weight, w.value, 0.25), (num, den), rtol=1e-12)


# ------------------------------------------------------------------ accepted now


@pytest.mark.parametrize(
    "params",
    [
        {"variance": "sch-var-2"},
        {"variance": "sch-var-2-bayes", "welch_df": "kappa"},
        {"combination": "trimmed", "trim": 0.1},
    ],
)
def test_forget_now_accepts_unknown_variances_and_the_trim(params):
    scenario = Scenario(
        protocol="private-colme",
        params={**params, "forget": {"reset": 9}},
        data={"model": "classes"},
        t_max=50,
    )
    assert resolve(scenario).protocol_params.forget == Forget(reset=9)


def test_the_windows_run_through_a_simulation_with_unknown_variances():
    """A plain Simulation (no study layer) with PM-II and Sch-Var-2 under a window runs and
    its estimates are finite."""
    cls = PrivateColME
    from desim.kernel.params import build

    proto = cls(build(cls.Params, {"variance": "sch-var-2", "forget": {"window": 20}}, "t"))
    Simulation(proto, class_data(8), 60, Streams(0, 0, 1, 2)).run()
    assert np.isfinite(proto.estimates()).all()
