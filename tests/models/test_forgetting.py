"""Forgetting (``forget = {window | rate | reset}``, desim's extension): closed forms of the local
baseline, windows over released prefixes (Private-ColME, p-sum uploads) and their ledgers.

Slots are t = 1, 2, …; at slot t every agent draws one sample around its mean at t. A weighted
mean Σ_k w_k x_{t−k}/Σ_k w_k (k the sample's age) of i.i.d. samples of variance σ² has variance
σ² Σ w_k²/(Σ w_k)²; under linear drift μ(t) = μ + r(t − 1) its bias is −r Σ_k w_k k/Σ_k w_k:
r(W − 1)/2 for a window of W, rλ/(1 − λ) in the exponential steady state. Statistical checks
use 2000 agents (independent replicates of one agent) and 4 standard errors of the mean of
squared errors: for e ~ N(b, v), Var(e²) = 2v² + 4b²v.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.engine import Simulation
from desim.kernel.params import ConfigError, build
from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.kernel.registry import CURVES, DATA, METRICS, PROTOCOLS
from desim.models.baselines import BaselineParams, Ideal, Local
from desim.models.eb.forgetting import RoundPrefixes
from desim.models.forgetting import (
    Forget,
    PrefixWindow,
    difference_noise_count,
    forgetting_weights,
    weighted_mean_mse,
)
from desim.study.scenario import Scenario, resolve

load_plugins()

SIGMA, AGENTS = 0.5, 2000


def _source(drift: dict | None, agents: int = AGENTS, **data):
    table = {"agents": agents, "sigma": SIGMA, "distribution": "gaussian", **data}
    if drift is not None:
        table["drift"] = drift
    return build(DATA.get("classes"), table, "data").make(np.random.default_rng(0))


def _mse(protocol, source, t: int, metrics=()) -> tuple[float, object]:
    sim = Simulation(
        protocol,
        source,
        t,
        Streams(7, 0, 1, 2),
        checkpoints=np.asarray([t]),
        metrics=[METRICS.get(m) for m in metrics],
    )
    out = sim.run().metrics
    return float(out[(out.metric == "mse") & (out.t == t)].value.iloc[0]), out


def _within(measured: float, bias2: float, var: float, agents: int = AGENTS) -> None:
    se = math.sqrt((2 * var * var + 4 * bias2 * var) / agents)
    assert abs(measured - (bias2 + var)) < 4 * se


def _local(**forget) -> Local:
    return Local(build(BaselineParams, {"forget": forget}, "test"))


# ---------------------------------------------------------------------------- the local baseline


def test_a_reset_at_the_switch_gives_the_fresh_start_closed_form():
    """After a switch at τ with a reset at τ, a switched agent's samples are all around its new
    mean: MSE σ²/(t − τ + 1) (Prop. 1 restarted), whatever class it came from."""
    tau, t = 21, 30
    source = _source({"model": "switch", "fraction": 0.5, "at": tau}, class_means=[0.0, 1.0])
    measured, _ = _mse(_local(reset=tau), source, t)
    _within(measured, 0.0, SIGMA**2 / (t - tau + 1))


def test_a_window_under_linear_drift_costs_sigma2_over_w_plus_its_bias():
    rate, w, t = 0.02, 8, 40
    source = _source({"model": "linear", "rate": rate})
    measured, _ = _mse(_local(window=w), source, t)
    _within(measured, (rate * (w - 1) / 2) ** 2, SIGMA**2 / w)


def test_exponential_forgetting_matches_its_closed_form_and_steady_state():
    rate, lam, t = 0.01, 0.8, 60
    forget = Forget(rate=lam)
    source = _source({"model": "linear", "rate": rate})
    measured, _ = _mse(_local(rate=lam), source, t)
    bias2 = (rate * lam / (1 - lam)) ** 2  # steady state: λ^60 is negligible
    _within(measured, bias2, SIGMA**2 * (1 - lam) / (1 + lam))
    closed = weighted_mean_mse(np.array([t]), SIGMA**2, forget, rate)[0]
    assert closed == pytest.approx(bias2 + SIGMA**2 * (1 - lam) / (1 + lam), rel=1e-6)


def test_the_closed_form_of_a_window_and_a_reset():
    t = np.array([3, 10, 25])
    np.testing.assert_allclose(
        weighted_mean_mse(t, 2.0, Forget(window=10), 0.1),
        2.0 / np.minimum(t, 10) + (0.1 * (np.minimum(t, 10) - 1) / 2) ** 2,
    )
    np.testing.assert_allclose(
        weighted_mean_mse(t, 2.0, Forget(reset=10)), [2.0 / 3, 2.0, 2.0 / 16]
    )


def test_the_ideal_window_is_the_class_mean_of_the_last_w_samples():
    source = _source(None, agents=12, class_means=[0.0, 1.0, 3.0])
    ideal = Ideal(build(BaselineParams, {"forget": {"window": 3}}, "test"))
    sim = Simulation(ideal, source, 7, Streams(7, 0, 1, 2), checkpoints=np.asarray([7]))
    sim.run()
    x = source.sample(Streams(7, 0, 1, 2).get("data"), 7)[-3:]  # the same draws: slots 5–7
    classes = source.classes
    want = np.array([x[:, classes == c].mean() for c in classes])
    np.testing.assert_allclose(ideal.estimates(), want, rtol=1e-12)


# ---------------------------------------------------------------------------- released prefixes


def test_a_difference_of_releases_keeps_the_p_sums_or_nodes_between_them():
    # PM-I: p-sums i + 1 … j. PM-II: 6 = {(1, 3), (2, 1)} and 4 = {(2, 1)} share one node;
    # 5 = {(0, 5), (2, 1)} and 2 = {(1, 1)} share none; the empty prefix 0 has none.
    np.testing.assert_array_equal(difference_noise_count("pm1", [6, 5, 3], [4, 2, 0]), [2, 3, 3])
    np.testing.assert_array_equal(difference_noise_count("pm2", [6, 5, 3], [4, 2, 0]), [1, 3, 2])


def test_a_window_differences_the_oldest_release_inside_it():
    """Releases of one pair every 3 slots with prefix sums equal to t (R = 1): with W = 7 the
    base at t = 12 is t_i = 6 (12 − 6 ≤ 7 < 12 − 3), at t = 6 the empty prefix."""
    window = PrefixWindow(Forget(window=7), n_pairs=1, kept=4)
    got = []
    for j, t in enumerate((3, 6, 9, 12), start=1):
        n, s, i = window.take(np.array([0]), np.array([1.0]), np.array([float(t)]), np.array([j]))
        got.append((n[0], s[0], i[0]))
    assert got == [(3, 3, 0), (6, 6, 0), (6, 6, 1), (6, 6, 2)]


@settings(max_examples=60, deadline=None)
@given(
    window=st.integers(1, 12),
    seed=st.integers(0, 2**32 - 1),
    rate=st.floats(0.1, 1.0),
)
def test_a_window_s_base_is_the_oldest_release_within_w_for_any_release_times(
    window: int, seed: int, rate: float
) -> None:
    """Five pairs releasing in random slots (each at most once a slot): every take gives the
    base a brute-force search over all the pair's releases finds, the oldest i with
    t_j − t_i ≤ W, and n and the noisy sum from it (the same floats)."""
    rng = np.random.default_rng(seed)
    pairs = 5
    prefixes = PrefixWindow(Forget(window=window), n_pairs=pairs, kept=window + 2)
    held = [[(0.0, 0.0)] for _ in range(pairs)]  # (t_k, t_k R_k) of releases k = 0, 1, …
    for t in range(1, 4 * window + 8):
        pair = np.flatnonzero(rng.random(pairs) < rate)
        if len(pair) == 0:
            continue
        value = rng.standard_normal(len(pair))
        t_b = np.full(len(pair), float(t))
        j = np.array([len(held[p]) for p in pair])
        n, noisy, i = prefixes.take(pair, value, t_b, j)
        for k, p in enumerate(pair):
            held[p].append((float(t), float(value[k] * t_b[k])))
            base = next(x for x, (t_x, _) in enumerate(held[p]) if t - t_x <= window)
            assert (i[k], n[k]) == (base, t - held[p][base][0])
            assert noisy[k] == held[p][-1][1] - held[p][base][1]


@settings(max_examples=60, deadline=None)
@given(
    every=st.integers(1, 5),
    span=st.integers(0, 12),
    reset=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_round_prefixes_give_the_pair_window_s_base_n_and_sums(
    every: int, span: int, reset: bool, seed: int
) -> None:
    """Agents that all release every `every` slots (server uploads): `RoundPrefixes`' one
    search a round gives what `PrefixWindow` gives each agent as a pair of its own, bit for bit
    (a window W ≥ round, or a reset whose τ − 1 falls on a round)."""
    forget = Forget(reset=every * span + 1) if reset else Forget(window=every + span)
    rng = np.random.default_rng(seed)
    agents = np.arange(4)
    rows = RoundPrefixes(forget, len(agents), every)
    pairs = PrefixWindow(forget, len(agents), kept=(forget.window or 0) // every + 2)
    for j in range(1, 40 // every + 2):
        t, value = float(j * every), rng.standard_normal(len(agents))
        n, noisy, i = rows.take(value, t, j)
        n_p, noisy_p, i_p = pairs.take(agents, value, np.full(4, t), np.full(4, j))
        np.testing.assert_array_equal(np.full(4, n), n_p)
        np.testing.assert_array_equal(noisy, noisy_p)
        np.testing.assert_array_equal(np.full(4, i), i_p)


def test_a_reset_differences_the_first_release_from_tau_minus_1():
    window = PrefixWindow(Forget(reset=7), n_pairs=1, kept=1)
    got = []
    for j, t in enumerate((3, 6, 9, 12), start=1):
        n, _, i = window.take(np.array([0]), np.array([1.0]), np.array([float(t)]), np.array([j]))
        got.append((n[0], i[0]))
    assert got == [(3, 0), (6, 0), (3, 2), (6, 2)]


# ---------------------------------------------------------------------------- Private-ColME


def _colme(params: dict, m: int, t_max: int, data: dict | None = None):
    cls = PROTOCOLS.get("private-colme")
    proto = cls(build(cls.Params, params, "test"))
    table = {"agents": m, "class_means": [0.2, 0.8], "sigma": 0.5, **(data or {})}
    source = build(DATA.get("classes"), table, "data").make(np.random.default_rng(3))
    sim = Simulation(
        proto,
        source,
        t_max,
        Streams(3, 0, 11, 22),
        checkpoints=np.asarray([t_max]),
        metrics=[METRICS.get("privacy")],
    )
    out = sim.run().metrics
    return proto, out.set_index("metric").value


@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
def test_the_ledger_with_a_window_is_the_hand_count_of_releases(mechanism):
    """M = 3 under RR for 10 slots: each agent releases to each of its 2 queriers every other
    slot, 5 releases each. Its first sample is in 1 p-sum per querier under PM-I, in
    ⌊log₂ 5⌋ + 1 = 3 tree nodes under PM-II; a window differences releases already made, so
    the ledger counts exactly these, as without forgetting."""
    params = {"mechanism": mechanism, "epsilon": 1.0}
    proto, with_window = _colme({**params, "forget": {"window": 4}}, 3, 10)
    _, without = _colme(params, 3, 10)
    np.testing.assert_array_equal(proto.mech.count + np.eye(3, dtype=int) * 5, 5)
    per_querier = 1 if mechanism == "pm1" else 3
    mult = proto.multiplier
    one = dp_accounting.get_epsilon_gaussian(mult / math.sqrt(per_querier), 1e-6)
    every = dp_accounting.get_epsilon_gaussian(mult / math.sqrt(2 * per_querier), 1e-6)
    assert with_window["eps_one_max"] == pytest.approx(one, rel=1e-9)
    assert with_window["eps_all_max"] == pytest.approx(every, rel=1e-9)
    for key in ("eps_one_max", "eps_all_max", "eps_all_mean"):
        assert with_window[key] >= without[key] - 1e-12
        assert with_window[key] == pytest.approx(without[key], rel=1e-12)


def test_private_colme_with_a_reset_forgets_the_old_class():
    """Every agent switches class at τ = 40: with a reset at τ the estimates at t = 400 are
    within a few standard errors of the new means; without, a tenth of the old mean remains."""
    drift = {"drift": {"model": "switch", "fraction": 1.0, "at": 40}}
    params = {"mechanism": "pm1", "epsilon": 5.0}
    _, reset = _colme({**params, "forget": {"reset": 40}}, 20, 400, drift)
    _, plain = _colme(params, 20, 400, drift)
    # the old means' share: (τ − 1)/t ≈ 0.1 of a jump of 0.6: squared bias ≈ 3.4e-3
    assert plain["mse"] > 2e-3
    assert reset["mse"] < plain["mse"] / 3


# ---------------------------------------------------------------------------- refused settings


@pytest.mark.parametrize(
    ("protocol", "params", "fragment"),
    [
        ("private-colme", {"forget": {"rate": 0.9}}, "forget: rate = 0.9: private-colme allows"),
        ("private-colme", {"forget": {"window": 9, "reset": 3}}, "give exactly one of"),
        (
            "private-colme",
            {"forget": {"window": 9}, "variance": "sch-var-1"},
            "forget: with variance = 'sch-var-1' not yet",
        ),
        (
            "eb-gaussian",
            {"mechanism": "pm1", "round": 1, "forget": {"rate": 0.9}},
            "forget: rate = 0.9: mechanism = 'pm1' allows window, reset",
        ),
        (
            "eb-gaussian",
            {"mechanism": "pm2", "round": 5, "forget": {"window": 3}},
            "forget: window = 3: p-sum uploads every round = 5 slots need window ≥ round",
        ),
        ("local", {"forget": {"window": 0}}, "window = 0"),
        ("local", {"forget": {"reset": 51}}, "reset = 51: after t_max = 50, so it never happens"),
        ("eb-gaussian", {"forget": {"reset": 80}}, "reset = 80: after t_max = 50"),
        ("ideal", {"forget": {"rate": 1.0}}, "rate = 1.0"),
    ],
)
def test_refused_forget_tables_name_the_field_in_one_line(protocol, params, fragment):
    with pytest.raises(ConfigError) as info:
        resolve(Scenario(protocol=protocol, params=params, data={"model": "classes"}, t_max=50))
    assert fragment in str(info.value) and "\n" not in str(info.value)


# ---------------------------------------------------------------------------- p-sum uploads


class _Recording(PROTOCOLS.get("eb-gaussian")):
    """EB-Gaussian that keeps its last upload rows (what the server receives)."""

    def upload(self, agents: np.ndarray) -> np.ndarray:
        self.last = super().upload(agents)
        return self.last


def _eb(params: dict, t_max: int, drift: dict | None = None):
    cls = PROTOCOLS.get("eb-gaussian")
    proto = _Recording(build(cls.Params, params, "test"))
    source = _source(drift, agents=400, class_means=[0.2, 0.4, 0.8])
    sim = Simulation(
        proto,
        source,
        t_max,
        Streams(5, 0, 1, 2),
        checkpoints=np.asarray([t_max]),
        metrics=[METRICS.get("privacy")],
    )
    out = sim.run().metrics
    return proto, out.set_index("metric").value


def test_windowed_p_sum_uploads_carry_the_window_and_its_noise():
    """round = 1, W = 6: at t = 20 each upload differences releases 20 and 14: its count is 6,
    its noise variance σ_DP² · 6/6² under PM-I, and the ledger is the one without forgetting."""
    params = {"mechanism": "pm1", "round": 1, "epsilon": 1.0, "sigma_theta": 0.3}
    proto, windowed = _eb({**params, "forget": {"window": 6}}, 20)
    _, plain = _eb(params, 20)
    rows = proto.last  # the uploads of slot 20
    np.testing.assert_allclose(rows[:, 1], 6.0)
    np.testing.assert_allclose(rows[:, 2], proto.sigma2_dp * 6 / 36, rtol=1e-12)
    assert windowed["eps_server_max"] == pytest.approx(plain["eps_server_max"], rel=1e-12)


def test_eb_with_a_reset_after_a_switch_beats_the_running_mean():
    params = {"mechanism": "none", "round": 1, "sigma_theta": 0.3}
    drift = {"model": "switch", "fraction": 1.0, "at": 30}
    _, reset = _eb({**params, "forget": {"reset": 30}}, 300, drift)
    _, plain = _eb(params, 300, drift)
    assert reset["mse"] < plain["mse"] / 3


# ---------------------------------------------------------------------------- the local curve


@pytest.mark.parametrize("forget", [{"window": 6}, {"rate": 0.8}, {"reset": 11}])
def test_the_local_curve_with_forgetting_matches_a_switch_simulated(forget):
    """Half the agents switch at τ = 11 between classes 0 and 1 (E[Δ²] = 1): the weight left on
    pre-switch samples, squared, times the switched share, plus σ²/n_eff."""
    tau, t = 11, 14
    drift = {"model": "switch", "fraction": 0.5, "at": tau}
    data = {"agents": AGENTS, "sigma": SIGMA, "class_means": [0.0, 1.0], "drift": drift}
    spec = build(DATA.get("classes"), data, "data")
    curve = CURVES.get("local")(forget=forget).curve(np.array([float(t)]), spec)[0][0]
    measured, _ = _mse(_local(**forget), _source(drift, class_means=[0.0, 1.0]), t)
    w = forgetting_weights(t, build(Forget, forget, "forget"))
    old = w[t - tau + 1 :].sum() / w.sum()  # the weight on samples before τ
    var = SIGMA**2 * (w * w).sum() / w.sum() ** 2
    assert curve == pytest.approx(0.5 * old**2 + var, rel=1e-12)
    # SE: exactly half the agents carry bias² old² (Var e² = 2v² + 4 old² v), the rest none
    se = math.sqrt((2 * var**2 + 2 * old**2 * var) / AGENTS)
    assert abs(measured - curve) < 4 * se


def test_the_local_curve_refuses_forget_under_a_random_walk():
    spec = build(DATA.get("classes"), {"drift": {"model": "random-walk", "step": 0.1}}, "data")
    with pytest.raises(ValueError, match="no closed form under drift model = 'random-walk'"):
        CURVES.get("local")(forget={"window": 3}).check(spec)


def test_private_colme_forgets_every_peer_statistic_at_a_reset():
    """Just after a reset at τ = 200 (M = 8: a pair's releases every 7 slots), no peer has a
    whole p-sum after τ − 1 yet: every T^W is undefined and each estimate is the agent's own
    mean of the samples from τ on."""
    proto, _ = _colme({"mechanism": "pm1", "forget": {"reset": 200}}, 8, 202)
    assert np.isinf(proto.forget.var).all()
    np.testing.assert_allclose(proto.estimates(), proto.forget.own.sums / 3, rtol=1e-12)


# ---------------------------------------------------------------------------- through the CLI

FORGET_STUDY = """
[study]
title = "forgetting"
replicates = 1
t_max = 30
checkpoints = 3

[data]
model = "classes"
agents = 8

[data.drift]
model = "switch"
fraction = 0.5
at = 10

[[scenario]]
name = "p"
protocol = "private-colme"
forget = {forget}

[[scenario]]
name = "local"
protocol = "local"
forget = {{reset = 10}}

[[curve]]
name = "local, reset"
kind = "local"
forget = {{reset = 10}}
"""


@pytest.mark.parametrize(
    ("forget", "fragment"),
    [
        ("{window = 14}", None),
        ("{reset = 10}", None),
        ("{rate = 0.9}", "scenario 'p': forget: rate = 0.9: private-colme allows window, reset"),
        ("{window = 3, rate = 0.9}", "forget = {window, rate}: give exactly one of"),
        ("{size = 3}", "size"),
    ],
)
def test_a_study_with_forget_tables_validates_or_is_refused_in_one_line(
    forget, fragment, tmp_path, capsys
):
    from desim.study.cli import main

    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "study.toml").write_text(FORGET_STUDY.format(forget=forget))
    if fragment is not None:
        assert main(["validate", str(folder)]) == 2
        err = capsys.readouterr().err.strip()
        assert fragment in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
        return
    assert main(["validate", str(folder)]) == 0, capsys.readouterr().err


@pytest.mark.slow
def test_a_study_with_forget_tables_runs(tmp_path, capsys):
    from desim.study.cli import main

    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "study.toml").write_text(FORGET_STUDY.format(forget="{window = 14}"))
    assert main(["run", str(folder), "--workers", "1"]) == 0, capsys.readouterr().err
    assert (folder / "results" / "metrics.parquet").exists()
