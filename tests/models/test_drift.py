"""Data whose means move (`[data.drift]`): the samples follow the means at each slot, every score
is against the means at the checkpoint's slot, and the local and ideal baselines' errors match
their closed forms (tolerances: standard errors of the estimates, from the same maths).

Slots are t = 1, 2, …; at slot t every agent draws one sample around its mean μ_a(t), and a
measurement at t follows slot t's samples. Under linear drift μ_a(t) = μ_a + r(t − 1), so the
running mean X̄_a(t) = (1/t) Σ_{s≤t} X_a(s) has expectation μ_a + r(t − 1)/2: bias −r(t − 1)/2
and MSE r²(t − 1)²/4 + σ²/t. After a switch at τ (samples from slot τ drawn around the new
class's mean) a switched agent's running mean at t ≥ τ has expectation
((τ − 1)μ_old + (t − τ + 1)μ_new)/t.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.engine import Simulation
from desim.kernel.params import ConfigError, build
from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.kernel.registry import CURVES, DATA, METRICS
from desim.models.baselines import Ideal, Local, LocalCurve, NoParams, ideal_mse
from desim.study.cli import main
from desim.study.scenario import Scenario, check_setup, resolve, run
from desim.study.spec.hashing import canonical_hash, curve_hash

load_plugins()

SIGMA = 0.5


def _source(drift: dict | None, agents: int = 2000, seed: int = 0, **data):
    table = {"agents": agents, "sigma": SIGMA, "distribution": "gaussian", **data}
    if drift is not None:
        table["drift"] = drift
    return build(DATA.get("classes"), table, "data").make(np.random.default_rng(seed))


def _simulate(protocol, source, t_max: int, checkpoints, metrics=()):
    sim = Simulation(
        protocol,
        source,
        t_max,
        Streams(7, 0, 1, 2),
        checkpoints=np.asarray(checkpoints),
        metrics=[METRICS.get(m) for m in metrics],
    )
    out = sim.run()
    return out.metrics


def _mse(metrics, t: int) -> float:
    m = metrics[(metrics.metric == "mse") & (metrics.t == t)]
    return float(m.value.iloc[0])


def _se_of_mse(bias2: np.ndarray, var: np.ndarray, weights: np.ndarray) -> float:
    """SE of Σ_i w_i e_i² for independent e_i ~ N(b_i, v_i): Var(e²) = 2v² + 4b²v."""
    return float(np.sqrt(np.sum(weights**2 * (2 * var**2 + 4 * bias2 * var))))


# ---------------------------------------------------------------------------- linear drift


def test_local_mean_under_linear_drift_has_bias_minus_rate_t_minus_1_over_2():
    rate, t_max, agents = 0.01, 60, 2000
    source = _source({"model": "linear", "rate": rate}, agents)
    local = Local(NoParams())
    metrics = _simulate(local, source, t_max, [1, 10, t_max])
    t = t_max
    error = local.estimates() - source.at(t).means
    bias, var = -rate * (t - 1) / 2, SIGMA**2 / t
    assert abs(error.mean() - bias) < 4 * math.sqrt(var / agents)
    for t in (1, 10, t_max):  # MSE bias² + σ²/t, scored against μ_a(t)
        bias, var = -rate * (t - 1) / 2, SIGMA**2 / t
        w = np.full(agents, 1 / agents)
        se = _se_of_mse(np.full(agents, bias**2), np.full(agents, var), w)
        assert abs(_mse(metrics, t) - (bias**2 + var)) < 4 * se, t


def test_ideal_under_linear_drift_is_prop2_plus_the_squared_bias():
    rate, t, agents = -0.02, 40, 300
    source = _source({"model": "linear", "rate": rate}, agents, assignment="balanced")
    metrics = _simulate(Ideal(NoParams()), source, t, [t])
    sizes = np.bincount(source.classes)[source.classes]
    bias = -rate * (t - 1) / 2
    expected = bias**2 + float(ideal_mse(t, SIGMA**2, sizes))
    n_c = np.bincount(source.classes)  # one error per class: K independent terms
    se = _se_of_mse(np.full(len(n_c), bias**2), SIGMA**2 / (n_c * t), n_c / agents)
    assert abs(_mse(metrics, t) - expected) < 4 * se


def test_linear_drift_keeps_classes_and_the_noise_of_the_run_without_drift():
    fixed, moving = _source(None, 50), _source({"model": "linear", "rate": 0.5}, 50)
    np.testing.assert_array_equal(fixed.classes, moving.classes)
    a = fixed.sample(np.random.default_rng(3), 5)
    b = moving.sample(np.random.default_rng(3), 5)
    shift = np.broadcast_to(0.5 * np.arange(5)[:, None], a.shape)
    np.testing.assert_allclose(b - a, shift, atol=1e-12)
    np.testing.assert_array_equal(moving.at(9).classes, fixed.classes)
    np.testing.assert_allclose(moving.at(9).means, fixed.means + 4.0)


# ---------------------------------------------------------------------------- switch


def test_switch_moves_a_fraction_to_the_next_class_at_tau():
    means = [0.0, 1.0, 3.0]
    source = _source({"model": "switch", "fraction": 0.25, "at": 5}, 40, class_means=means)
    assert len(source.switched) == 10
    before, after = source.at(4), source.at(5)
    np.testing.assert_array_equal(before.classes, source.classes)
    moved = after.classes != source.classes
    assert set(np.flatnonzero(moved)) == set(source.switched)
    np.testing.assert_array_equal(after.classes[moved], (source.classes[moved] + 1) % 3)
    np.testing.assert_array_equal(after.means, np.asarray(means)[after.classes])
    x = (
        source.sample(np.random.default_rng(1), 8)
        - np.random.default_rng(1).standard_normal((8, 40)) * SIGMA
    )
    np.testing.assert_allclose(x[:4], np.broadcast_to(before.means, (4, 40)), atol=1e-12)
    np.testing.assert_allclose(x[4:], np.broadcast_to(after.means, (4, 40)), atol=1e-12)


def test_local_mean_after_a_switch_is_the_mixture_of_the_two_means():
    tau, t, agents, means = 11, 40, 2000, [0.0, 1.0]
    drift = {"model": "switch", "fraction": 0.5, "at": tau}
    source = _source(drift, agents, class_means=means)
    local = Local(NoParams())
    metrics = _simulate(local, source, t, [tau - 1, t])
    old, new = source.means, source.at(t).means
    mixture = ((tau - 1) * old + (t - tau + 1) * new) / t
    error = local.estimates() - mixture
    sw = source.switched
    assert abs(error[sw].mean()) < 4 * math.sqrt(SIGMA**2 / t / len(sw))
    # MSE against μ_a(t): bias (τ − 1)(μ_old − μ_new)/t for switched agents, 0 for the rest
    bias2 = (mixture - new) ** 2
    var, w = np.full(agents, SIGMA**2 / t), np.full(agents, 1 / agents)
    expected = float(np.mean(bias2)) + SIGMA**2 / t
    assert abs(_mse(metrics, t) - expected) < 4 * _se_of_mse(bias2, var, w)
    assert abs(_mse(metrics, tau - 1) - SIGMA**2 / (tau - 1)) < 4 * _se_of_mse(
        np.zeros(agents), np.full(agents, SIGMA**2 / (tau - 1)), w
    )


def test_accuracy_and_links_read_the_classes_and_means_at_t():
    source = _source({"model": "switch", "fraction": 0.5, "at": 3}, 12, class_means=[0.0, 1.0])

    class Truth(Local):
        """Estimates the mean of slot 1 for every agent; keeps the links of slot-1 classes."""

        def estimates(self):
            return source.means.copy()

        def neighbour_decisions(self):
            a, b = np.meshgrid(np.arange(12), np.arange(12))
            a, b = a.ravel(), b.ravel()
            return a, b, source.classes[a] == source.classes[b]

    metrics = _simulate(Truth(NoParams()), source, 4, [2, 4], ["accuracy", "links"])
    value = metrics.set_index(["t", "metric"]).value
    assert value[(2.0, "within_0.1")] == 1.0 and value[(4.0, "within_0.1")] == 0.5
    assert value[(2.0, "wrong_kept")] == value[(2.0, "wrong_dropped")] == 0.0
    # a pair with one end switched was one class and is now two, or the reverse
    now, then = source.at(4).classes, source.classes
    same_then, same_now = then[:, None] == then[None, :], now[:, None] == now[None, :]
    assert value[(4.0, "wrong_kept")] == np.sum(same_then & ~same_now) > 0
    assert value[(4.0, "wrong_dropped")] == np.sum(~same_then & same_now) > 0


@pytest.mark.parametrize(
    "drift",
    [
        {"model": "linear", "rate": 0.3},
        {"model": "switch", "fraction": 0.5, "at": 4},
        {"model": "random-walk", "step": 0.2},
    ],
)
def test_the_recorder_scores_against_the_means_at_each_checkpoint(drift):
    """A protocol that knows the means of its latest slot has MSE 0 at every checkpoint (the
    squared bias of a running mean is the same against μ(1) as against μ(t) under linear drift
    and in expectation under a walk, so this is the check that tells them apart)."""
    source = _source(drift, 20, class_means=[0.0, 1.0])

    class Now(Local):
        """Estimates every agent's mean at the last slot seen."""

        def on_samples(self, t, samples):
            self.t = t

        def estimates(self):
            return source.at(self.t).means

    metrics = _simulate(Now(NoParams()), source, 9, [1, 3, 4, 9], ["accuracy"])
    assert (metrics[metrics.metric == "mse"].value == 0).all()
    assert (metrics[metrics.metric == "within_0.1"].value == 1).all()


# ---------------------------------------------------------------------------- random walk


def test_random_walk_steps_are_gaussian_with_sd_step_and_shared_by_a_class():
    step, t_max, k = 0.3, 400, 5
    source = _source({"model": "random-walk", "step": step}, 30, class_means=list(range(k)))
    walk = np.stack([source.at(t).means for t in range(1, t_max + 1)])
    np.testing.assert_array_equal(walk[0], source.means)
    z = np.diff(walk, axis=0).ravel() / step  # (agents of a class share their walk)
    classes_walk = np.diff(walk, axis=0)[:, np.unique(source.classes, return_index=True)[1]]
    n = classes_walk.size
    assert abs(classes_walk.mean() / step) < 4 / math.sqrt(n)
    assert abs(classes_walk.var() / step**2 - 1) < 4 * math.sqrt(2 / n)
    assert z.size == (t_max - 1) * 30


def test_random_walk_does_not_depend_on_how_it_is_drawn():
    drift = {"model": "random-walk", "step": 0.1}
    a, b = _source(drift, 9, seed=4), _source(drift, 9, seed=4)
    whole = a.sample(np.random.default_rng(2), 30)
    rng = np.random.default_rng(2)
    b.at(17)  # the walk grown by a measurement first
    parts = np.concatenate([b.sample(rng, 7), b.sample(rng, 1), b.sample(rng, 22)])
    np.testing.assert_array_equal(whole, parts)
    np.testing.assert_array_equal(a.at(30).means, b.at(30).means)


def test_local_mse_under_a_random_walk_adds_the_walks_variance():
    """μ(t) − (1/t) Σ_s μ(s) = (1/t) Σ_{j=2..t} (j − 1) z_j: variance step²(t − 1)(2t − 1)/(6t)."""
    step, t, k, agents = 0.05, 30, 400, 2000
    drift = {"model": "random-walk", "step": step}
    source = _source(drift, agents, class_means=[0.0] * k, assignment="balanced")
    metrics = _simulate(Local(NoParams()), source, t, [t])
    walk = step**2 * (t - 1) * (2 * t - 1) / (6 * t)
    expected = walk + SIGMA**2 / t
    # SE: k independent walk terms (each χ²₁·walk, shared by agents/k agents) and the noise
    se = math.sqrt(2 * walk**2 / k + (2 * (SIGMA**2 / t) ** 2 + 4 * walk * SIGMA**2 / t) / agents)
    assert abs(_mse(metrics, t) - expected) < 4 * se


# ---------------------------------------------------------------------------- curves


def _curve(kind, drift, t, **data):
    spec = build(DATA.get("classes"), {"sigma": SIGMA, "drift": drift, **data}, "data")
    return CURVES.get(kind)().curve(np.asarray(t, dtype=float), spec)[0]


def test_local_and_ideal_curves_add_the_squared_bias_of_linear_drift_and_a_walk():
    t = np.array([1.0, 5.0, 50.0])
    fixed = build(DATA.get("classes"), {"sigma": SIGMA}, "data")
    for kind in ("local", "ideal"):
        base = CURVES.get(kind)().curve(t, fixed)[0]
        linear = _curve(kind, {"model": "linear", "rate": 0.1}, t)
        np.testing.assert_allclose(linear - base, (0.1 * (t - 1) / 2) ** 2, rtol=1e-12)
        walk = _curve(kind, {"model": "random-walk", "step": 0.1}, t)
        np.testing.assert_allclose(walk - base, 0.01 * (t - 1) * (2 * t - 1) / (6 * t))


def test_local_curve_after_a_switch_matches_the_simulated_mse():
    tau, t, agents, means = 11, 40, 2000, [0.0, 1.0, 3.0]
    drift = {"model": "switch", "fraction": 0.5, "at": tau}
    curve = _curve("local", drift, [tau - 1, t], agents=agents, class_means=means)
    assert curve[0] == pytest.approx(SIGMA**2 / (tau - 1), rel=1e-12)  # nothing moved yet
    source = _source(drift, agents, class_means=means)
    metrics = _simulate(Local(NoParams()), source, t, [t])
    # SE: the noise, and which classes the switched agents come from (uniform over 3)
    jump2 = (np.roll(means, -1) - np.asarray(means)) ** 2 * ((tau - 1) / t) ** 2
    n_sw = len(source.switched)
    se_classes = math.sqrt(n_sw * jump2.var()) / agents
    v = SIGMA**2 / t
    se_noise = math.sqrt((2 * v**2 + 4 * jump2.mean() * v * n_sw / agents) / agents)
    assert abs(_mse(metrics, t) - curve[1]) < 4 * math.hypot(se_classes, se_noise)


CURVE_STUDY = """
[study]
title = "drift"
replicates = 1
t_max = 20
checkpoints = 4

[data]
model = "classes"
agents = 12

[data.drift]
model = "{model}"
{extra}

[[scenario]]
name = "local"
protocol = "local"

[[curve]]
name = "c"
kind = "{kind}"
"""


@pytest.mark.parametrize(
    ("model", "extra", "kind", "fragment"),
    [
        ("linear", "rate = 0.1", "oracle", "kind 'oracle' assumes means that never move"),
        ("switch", "fraction = 0.5\nat = 3", "ideal", "no closed form under drift"),
        ("linear", "rate = 0.1", "local", None),
    ],
)
def test_curves_without_a_closed_form_under_drift_are_refused(
    tmp_path: Path, capsys, model, extra, kind, fragment
):
    folder = tmp_path / "s"
    folder.mkdir()
    text = CURVE_STUDY.format(model=model, extra=extra, kind=kind)
    (folder / "study.toml").write_text(text)
    code = main(["validate", str(folder)])
    err = capsys.readouterr().err
    if fragment is None:
        assert code == 0, err
    else:
        assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------------------- no drift


def test_without_drift_the_recorder_reads_the_fixed_means_and_curve_hashes_keep():
    source = _source(None, 10)
    assert not source.drifts and source.at(5) is source
    spec = build(DATA.get("classes"), {}, "data")
    before = dataclasses.asdict(spec)
    del before["drift"]  # the data's fields before drift existed
    old = {"kind": "local", "params": {}, "data": before, "t_max": 10, "checkpoints": 5}
    assert curve_hash("local", LocalCurve(), spec, 10, 5) == canonical_hash(old)
    moving = build(DATA.get("classes"), {"drift": {"model": "linear", "rate": 1}}, "data")
    assert curve_hash("local", LocalCurve(), moving, 10, 5) != canonical_hash(old)


# ---------------------------------------------------------------------------- refused

#: What a study file may hold ([data] numbers of magnitude ≤ 1e50: `validate` refuses the
#: rest, see test_validate_refuses_hostile_drift_in_one_line), and NaN and ±inf.
NUMBERS = (
    st.floats(min_value=-1e50, max_value=1e50)
    | st.sampled_from([math.nan, math.inf, -math.inf])
    | st.integers(-5, 50)
)


@settings(max_examples=40, deadline=None)
@given(
    model=st.sampled_from(["switch", "linear", "random-walk", "other"]),
    values=st.fixed_dictionaries(
        {}, optional={k: NUMBERS for k in ("fraction", "at", "rate", "step")}
    ),
)
def test_any_drift_table_is_refused_in_one_line_or_draws_finite_samples(model, values):
    table = {"agents": 6, "class_means": [0.0, 1.0], "drift": {"model": model, **values}}
    try:
        spec = build(DATA.get("classes"), table, "data")
        resolve(Scenario(protocol="local", data={"model": "classes", **table}, t_max=40))
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(("data: drift:", "scenario: data:"))
        return
    source = spec.make(np.random.default_rng(0))
    x = source.sample(np.random.default_rng(1), 40)
    assert x.shape == (40, 6) and np.isfinite(x).all()
    assert np.isfinite(source.at(40).means).all()


@pytest.mark.parametrize(
    ("drift", "fragment"),
    [
        ({"model": "switch", "fraction": 0.0, "at": 3}, "fraction = 0.0: must be > 0 and ≤ 1"),
        ({"model": "switch", "fraction": 1.5, "at": 3}, "fraction = 1.5: must be > 0 and ≤ 1"),
        ({"model": "switch", "fraction": 0.5, "at": 0}, "at = 0: must be ≥ 1"),
        ({"model": "switch", "fraction": 0.5}, "model = 'switch' needs at"),
        ({"model": "random-walk", "step": -0.1}, "step = -0.1: must be ≥ 0"),
        ({"model": "linear", "rate": float("nan")}, "rate = nan: must be a finite number"),
        ({"model": "linear", "rate": float("inf")}, "rate = inf: must be a finite number"),
        ({"model": "linear", "rate": 1.0, "step": 2.0}, "step = 2.0: model = 'linear' reads"),
        ({"model": "sideways"}, "model = 'sideways': must be one of"),
        ({"rate": 1.0}, "model is required"),
    ],
)
def test_hostile_drift_tables_are_refused_in_one_line(drift, fragment):
    with pytest.raises(ConfigError) as info:
        build(DATA.get("classes"), {"drift": drift}, "data")
    message = str(info.value)
    assert fragment in message and "\n" not in message and message.startswith("data: drift:")


def test_drift_with_bernoulli_data_or_a_switch_of_one_class_is_refused():
    with pytest.raises(ConfigError, match="drift is allowed with distribution"):
        build(
            DATA.get("classes"),
            {"distribution": "bernoulli", "drift": {"model": "linear", "rate": 0.1}},
            "data",
        )
    with pytest.raises(ConfigError, match="has one class"):
        build(
            DATA.get("classes"),
            {"class_means": [0.5], "drift": {"model": "switch", "fraction": 1, "at": 2}},
            "data",
        )


SWITCH = {"model": "classes", "drift": {"model": "switch", "fraction": 0.1, "at": 50}}


def test_a_switch_beyond_t_max_or_with_an_oracle_is_refused_before_a_run():
    with pytest.raises(ConfigError, match=r"at = 50: beyond t_max = 49 \(allowed: 1 … t_max\)"):
        resolve(Scenario(protocol="local", data=SWITCH, t_max=49))
    with pytest.raises(ConfigError, match="told the true classes at set-up only"):
        resolve(Scenario(protocol="ideal", data=SWITCH, t_max=60))
    with pytest.raises(ConfigError, match="told the true classes at set-up only"):
        resolve(Scenario(protocol="private-colme-oracle", data=SWITCH, t_max=60))
    linear = {"model": "classes", "drift": {"model": "linear", "rate": 0.01}}
    check_setup(Scenario(protocol="ideal", data=linear, t_max=60))  # classes stay classes
    assert len(run(Scenario(protocol="local", data=SWITCH, t_max=50)).metrics)


STUDY = """
[study]
title = "drift"
replicates = 1
t_max = 20
checkpoints = 4

[data]
model = "classes"
agents = 12

[data.drift]
{drift}

[[scenario]]
name = "local"
protocol = "local"
"""


@pytest.mark.parametrize(
    ("drift", "fragment"),
    [
        ('model = "switch"\nfraction = 0.5\nat = 21', "at = 21: beyond t_max = 20"),
        ('model = "switch"\nfraction = 2\nat = 3', "fraction = 2: must be > 0 and ≤ 1"),
        ('model = "random-walk"\nstep = nan', "drift holds nan"),
        ('model = "linear"\nrate = 1e300', "drift holds 1e+300"),
    ],
)
def test_validate_refuses_hostile_drift_in_one_line(tmp_path: Path, capsys, drift, fragment):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "study.toml").write_text(STUDY.format(drift=drift))
    assert main(["validate", str(folder)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_a_grid_sweeps_whole_drift_tables_and_names_the_point_it_refuses(tmp_path: Path, capsys):
    folder = tmp_path / "s"
    folder.mkdir()
    grid = (
        '\n[grid]\n"data.drift" = [{model = "linear", rate = 0.01}, '
        '{model = "switch", fraction = 0.5, at = 30}]\n'
    )
    (folder / "study.toml").write_text(STUDY.format(drift='model = "linear"\nrate = 0.01') + grid)
    assert main(["validate", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\"at\": 30}: scenario 'local': data: drift: at = 30: beyond t_max = 20" in err
    assert len(err.splitlines()) == 1


def test_validate_accepts_a_drifting_study(tmp_path: Path):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "study.toml").write_text(STUDY.format(drift='model = "linear"\nrate = 0.01'))
    assert main(["validate", str(folder)]) == 0


def test_a_switch_beyond_the_quick_horizon_says_where_to_change_it(tmp_path, capsys):
    from desim.study.cli import main

    text = """
[study]
title = "switch late"
seed = 1
replicates = 1
t_max = 5000
[data]
model = "classes"
agents = 6
class_means = [0.0, 1.0]
[data.drift]
model = "switch"
fraction = 0.5
at = 2000
[[scenario]]
name = "local"
protocol = "local"
"""
    (tmp_path / "study.toml").write_text(text)
    assert main(["validate", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["validate", str(tmp_path), "--quick"]) == 2  # the fallback horizon is 1000
    err = capsys.readouterr().err
    assert "at = 2000: beyond t_max = 1000" in err
    assert "--quick runs t_max = 1000: set a larger t_max in [quick]" in err
    (tmp_path / "study.toml").write_text(text + "[quick]\nt_max = 2500\n")
    assert main(["validate", str(tmp_path), "--quick"]) == 0
