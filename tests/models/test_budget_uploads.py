"""Per-agent budgets of the empirical-Bayes uploads and of Private-C-ColME (issue 30): a `stop`
agent's ε never passes its budget and it stops only when full, a `degrade` agent ends its
horizon at the budget (within the accountant's rounding) with an MSE between `stop`'s and no
budget's where Theorem 2 says so, Private-C-ColME's k* ∈ {0, 1}, and the study-file route."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _runs import run_study_text, summary_rows
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.engine import Simulation
from desim.kernel.params import ConfigError, build
from desim.kernel.randomness import Streams
from desim.kernel.registry import METRICS, PROTOCOLS
from desim.models.eb import analytic
from desim.models.eb.data import HierarchicalGaussian
from desim.models.privacy.accounting import epsilon_spent
from desim.models.privacy.budget import first_sample_psums
from desim.testing import ScriptedLinks, check_modes

DELTA = 1e-6
METRIC_NAMES = ("privacy", "budget")


def simulate(params, m=40, t_max=30, links=None, seed=0, sigma_theta=0.1):
    """One eb-gaussian run (eb-bernoulli for ``rr`` uploads, of the running means clipped to
    [0, 1]) with the ledger and the budget at every slot: (protocol, data, wide metrics)."""
    if params.get("mechanism") == "rr":
        cls = PROTOCOLS.get("eb-bernoulli")
        params = {k: v for k, v in params.items() if k != "noise"}
    else:
        cls = PROTOCOLS.get("eb-gaussian")
        params = {"clip": 2.0, **params}
    proto = cls(build(cls.Params, {"delta": DELTA, **params}, "test"))
    streams = Streams(seed, 0, 1, 2)
    data = HierarchicalGaussian(agents=m, mean=0.5, sigma_theta=sigma_theta, sigma_x=0.5).make(
        streams.get("population")
    )
    sim = Simulation(
        proto,
        data,
        t_max,
        streams,
        links=links,
        checkpoints=np.arange(1, t_max + 1),
        metrics=[METRICS.get(name) for name in METRIC_NAMES],
    )
    out = sim.run()
    return proto, data, out.metrics.pivot(index="t", columns="metric", values="value")


def ledger_noise(proto) -> tuple[str, float]:
    p = proto.params
    if p.mechanism == "rr":
        return "rr", p.epsilon
    return ("gaussian" if p.mechanism == "gaussian" else p.noise), proto.multiplier


# -- stop -----------------------------------------------------------------------------------------
@given(
    mechanism=st.sampled_from(["gaussian", "pm1", "pm2", "rr"]),
    noise=st.sampled_from(["gaussian", "laplace"]),
    every=st.integers(1, 4),
    budget=st.floats(0.2, 4.0),
    lossy=st.booleans(),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=10, deadline=None)
@pytest.mark.slow  # Laplace compositions on the PLD accountant: about 5 s
def test_a_stop_agent_never_exceeds_and_stops_only_when_full(
    mechanism, noise, every, budget, lossy, seed
):
    links = None
    if lossy:  # uploads lost on the way still count (the ledger counts what is sent)
        links = ScriptedLinks(down=lambda rng, t, src, dst: rng.random(len(src)) < 0.3)
    params = {"mechanism": mechanism, "noise": noise, "round": every, "epsilon": 1.0}
    params["budget"] = {"epsilon": budget, "action": "stop"}
    proto, _, wide = simulate(params, m=8, t_max=24, links=links, seed=seed)
    gate, (law, mult) = proto.gate, ledger_noise(proto)
    count = first_sample_psums(mechanism, proto.uploads_sent)
    spent = np.array([epsilon_spent(law, mult, int(k), DELTA) for k in count])
    assert (spent <= budget).all()
    np.testing.assert_array_equal(proto.privacy_spend().epsilons()["server"], spent)
    assert (wide["eps_server_max"] <= budget).all()
    more = first_sample_psums(mechanism, proto.uploads_sent + 1)
    for b in np.flatnonzero(gate.withheld):  # it stopped: one upload more would not fit
        assert epsilon_spent(law, mult, int(more[b]), DELTA) > budget
        assert gate.hit_at[b] <= 24 and gate.hit_at[b] % every == 0
    assert wide["budget_exhausted"].iloc[-1] == np.mean(gate.withheld > 0)


def test_withheld_uploads_leave_the_server_short_by_hand():
    """Gaussian uploads of ε ≈ 0.77 each (ε₀ = 1, the paper's calibration), one per 2 slots:
    a budget of 1.2 holds two (ε ≈ 1.14), so every agent uploads at slots 2 and 4 and withholds
    from slot 6 on: 13 withheld each by t = 30."""
    proto, _, wide = simulate(
        {"mechanism": "gaussian", "round": 2, "budget": {"epsilon": 1.2, "action": "stop"}}
    )
    mult = proto.multiplier
    assert (
        epsilon_spent("gaussian", mult, 2, DELTA) <= 1.2 < epsilon_spent("gaussian", mult, 3, 1e-6)
    )
    assert proto.gate.capacity == 2 and (proto.uploads_sent == 2).all()
    assert (proto.gate.hit_at == 6).all() and (proto.gate.withheld == 13).all()
    assert (wide.loc[:5, "budget_exhausted"] == 0).all() and (
        wide.loc[6:, "budget_exhausted"] == 1
    ).all()
    assert wide.loc[30, "budget_withheld"] == 13 * 40


def test_a_budget_that_never_binds_changes_nothing():
    for mechanism in ("gaussian", "pm2"):
        base = {"mechanism": mechanism, "round": 3}
        _, _, free = simulate(base, seed=4)
        proto, _, budgeted = simulate({**base, "budget": {"epsilon": 1e6}}, seed=4)
        assert proto.gate.withheld.sum() == 0 and not np.isfinite(proto.gate.hit_at).any()
        keep = [c for c in budgeted.columns if not c.startswith("budget")]
        assert free.to_csv().encode() == budgeted[keep].to_csv().encode()


# -- degrade --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mechanism", "every", "budget"),
    [("gaussian", 2, 1.2), ("gaussian", 1, 0.5), ("pm2", 1, 0.6), ("pm1", 2, 0.3)],
)
def test_a_degrade_agent_ends_its_horizon_at_its_budget(mechanism, every, budget):
    """Never above the budget at any slot; at t_max at least 99 % of it (exactly it, up to the
    bisection on m_B), with every agent degraded and no upload withheld."""
    params = {"mechanism": mechanism, "round": every, "epsilon": 2.0}
    params["budget"] = {"epsilon": budget, "action": "degrade"}
    proto, _, wide = simulate(params)
    assert proto.gate.capacity < first_sample_psums(mechanism, np.array([proto.rounds]))[0]
    assert (wide["eps_server_max"] <= budget * (1 + 1e-9)).all()
    final = proto.privacy_spend().epsilons()["server"]
    assert (final <= budget * (1 + 1e-9)).all() and (final >= 0.99 * budget).all()
    assert proto.gate.withheld.sum() == 0 and (proto.uploads_sent == proto.rounds).all()
    assert wide["budget_exhausted"].iloc[-1] == 1


def test_degraded_pm2_uploads_carry_their_noise_variance():
    """PM-II with k* = 2 tree nodes: releases 1…3 use nodes at σ², every node made by release
    4 or later σ'² = σ²(m'/m)²; the variance column is their sum over the set bits of j."""
    params = {"mechanism": "pm2", "round": 1, "epsilon": 2.0}
    eps2 = epsilon_spent("gaussian", simulate(params, t_max=13)[0].multiplier, 2, DELTA)
    params["budget"] = {"epsilon": eps2 * 1.0001, "action": "degrade"}
    proto, _, _ = simulate(params, t_max=13)
    assert proto.gate.capacity == 2 and proto.degraded_after == 3
    s2, s2d = proto.sigma2_dp, proto.sigma2_dp * (proto.degraded_m / proto.multiplier) ** 2
    # j = 5: nodes (4, 5] made by 5 and (0, 4] made by 4; j = 3: (2, 3] and (0, 2], both early
    want = {1: s2, 2: s2, 3: 2 * s2, 4: s2d, 5: 2 * s2d, 6: 2 * s2d, 7: 3 * s2d, 12: 2 * s2d}
    got = proto._degraded_psum_variance(np.array(list(want)))
    np.testing.assert_allclose(got, list(want.values()), rtol=1e-12)


def test_degrade_lies_between_stop_and_no_budget_as_theorem_2_says():
    """One upload at t_max (n = 15), σ_θ known. Theorem 2's MSE grows with σ_q² up to the
    local mean's σ_x²/n, so with no budget (nominal σ_q²), degraded (σ'_q² = (2b m')²) and
    stopped (no upload fits: the local mean) the MSEs must come in that order. Each run matches
    its closed form given the μ̂ it drew (every agent shares that one draw):
    a² σ_x²/n + (1 − a)² (σ_θ² + (μ̂ − μ)²), within 4 standard errors over agents."""
    m, n, st2, sx2, b = 5000, 15, 0.05**2, 0.25, 2.0
    base = {"mechanism": "gaussian", "sigma_theta": 0.05, "epsilon": 4.0}
    runs = {
        name: simulate(
            {**base, "budget": {"epsilon": 1.0, "action": name}} if name != "none" else base,
            m,
            n,
            sigma_theta=0.05,
        )
        for name in ("none", "degrade", "stop")
    }
    sq2 = {
        "none": (2 * b * runs["none"][0].multiplier) ** 2,
        "degrade": (2 * b * runs["degrade"][0].degraded_m) ** 2,
    }
    theorem = {k: float(analytic.theorem_mse(m, n, st2, sx2, v)) for k, v in sq2.items()}
    assert theorem["none"] < theorem["degrade"] < sx2 / n
    assert runs["stop"][0].gate.withheld.sum() == m and runs["degrade"][0].gate.capacity == 0
    for name, (proto, data, _) in runs.items():
        err2 = (proto.estimates() - data.means) ** 2
        se = err2.std(ddof=1) / math.sqrt(m)
        if name == "stop":
            want = sx2 / n
        else:
            a = float(analytic.theorem_weight(m, n, st2, sx2, sq2[name]))
            mu_hat = proto.received[0, 0]
            want = a * a * sx2 / n + (1 - a) ** 2 * (st2 + (mu_hat - 0.5) ** 2)
        assert abs(err2.mean() - want) <= 4 * se, name


# -- Private-C-ColME ------------------------------------------------------------------------------
def c_colme(params, seed=1, t_max=30):
    cls = PROTOCOLS.get("private-c-colme")
    runs = check_modes(
        cls,
        params,
        networks=[{}],
        topology=("regular", {"degree": 3}),
        t_max=t_max,
        seed=seed,
        metrics=METRIC_NAMES,
    )
    return runs[0]["instants"]


def test_c_colme_budget_is_slack_or_binds_from_the_first_sample():
    """Every sample is one Laplace release of ε: a budget ≥ ε never binds (the same bytes as
    none), one below it binds at slot 1 for every agent."""
    free = c_colme({"epsilon": 1.0})
    slack = c_colme({"epsilon": 1.0, "budget": {"epsilon": 1.0}})
    assert slack.protocol.gate.capacity == 1 and slack.protocol.laplace_b == free.protocol.laplace_b
    np.testing.assert_array_equal(slack.protocol.estimates(), free.protocol.estimates())
    stop = c_colme({"epsilon": 1.0, "budget": {"epsilon": 0.5, "action": "stop"}})
    gate = stop.protocol.gate
    assert gate.capacity == 0 and gate.silent and (gate.hit_at == 1).all()
    assert (gate.withheld == 30).all()
    wide = stop.output.metrics.pivot(index="t", columns="metric", values="value")
    assert wide["messages_state"].iloc[-1] == 0 and (wide["eps_one_max"] == 0).all()
    # nobody heard from: every agent falls back to its own raw running mean
    proto = stop.protocol
    np.testing.assert_allclose(proto.estimates(), proto.raw_sum / proto.t, rtol=0, atol=0)


def test_c_colme_degrade_noises_every_sample_for_the_budget():
    run = c_colme({"epsilon": 1.0, "budget": {"epsilon": 0.5, "action": "degrade"}})
    proto = run.protocol
    spent = proto.privacy_spend().epsilons()["one"]
    assert (spent <= 0.5).all() and (spent >= 0.99 * 0.5).all()
    assert proto.laplace_b == pytest.approx(2 * proto._L / 0.5, rel=1e-3)
    assert (proto.gate.hit_at == 1).all() and proto.gate.withheld.sum() == 0


# -- messages and the study-file route ------------------------------------------------------------
@pytest.mark.parametrize(
    ("protocol", "params", "message"),
    [
        ("eb-gaussian", {"budget": {"epsilon": 1}}, "budget: needs an upload mechanism"),
        (
            "eb-bernoulli",
            {"mechanism": "rr", "budget": {"epsilon": 1, "action": "degrade"}},
            "budget.action = 'degrade': must be one of stop",
        ),
        (
            "eb-mixture",
            {"mechanism": "pm2", "noise": "laplace", "budget": {"epsilon": 1, "action": "degrade"}},
            "budget.action = 'degrade': must be one of stop",
        ),
        ("eb-gaussian", {"mechanism": "pm1", "budget": {"epsilon": -1}}, "budget.epsilon = -1"),
        ("private-c-colme", {"noise": "none", "budget": {"epsilon": 1}}, "needs noise = 'laplace'"),
        ("private-c-colme", {"budget": {"epsilon": 1, "action": "x"}}, "budget.action = 'x'"),
    ],
)
def test_bad_budgets_are_one_line_config_errors(protocol, params, message):
    cls = PROTOCOLS.get(protocol)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        build(cls.Params, params, "scenario 'x'")


STUDY = """
[study]
title = "budgets"
seed = 1
replicates = 1
t_max = 20
checkpoints = 4
metrics = ["privacy", "budget"]

[data]
model = "hierarchical-gaussian"
agents = 30
mean = 0.5
sigma_theta = 0.1
sigma_x = 0.5

[defaults]
mechanism = "gaussian"
clip = 2.0
round = 2

[[scenario]]
name = "unlimited"
protocol = "eb-gaussian"

[[scenario]]
name = "stop"
protocol = "eb-gaussian"
budget = {epsilon = 1.5, action = "stop"}

[[scenario]]
name = "degrade"
protocol = "eb-gaussian"
budget = {epsilon = 1.5, action = "degrade"}

[[scenario]]
name = "local"  # no budget hooks at all: the metric records nothing
protocol = "local"
"""


def test_an_upload_study_with_budgets_runs_and_summarises(tmp_path, capsys, no_figures):
    folder = run_study_text(tmp_path / "budgets", STUDY)
    rows = summary_rows(folder, "budget_exhausted", capsys)
    assert float(rows["stop"][1]) == 1 and float(rows["degrade"][1]) == 1
    assert "unlimited" not in rows and "local" not in rows
    rows = summary_rows(folder, "eps_server_max", capsys)
    assert float(rows["stop"][1]) <= 1.5 and float(rows["degrade"][1]) <= 1.5
    assert float(rows["unlimited"][1]) > 1.5


@pytest.mark.parametrize(
    ("protocol", "params", "data", "topology"),
    [
        (
            "eb-gaussian",
            {"mechanism": "pm2", "round": 3, "clip": 2.0, "budget": {"epsilon": 0.1}},
            ("hierarchical-gaussian", {"agents": 12, "mean": 0.5, "sigma_theta": 0.1}),
            None,
        ),
        (
            "eb-gaussian",
            {"mechanism": "gaussian", "round": 2, "clip": 2.0, "budget": {"epsilon": 2.0}},
            ("hierarchical-gaussian", {"agents": 12, "mean": 0.5, "sigma_theta": 0.1}),
            None,
        ),
        (
            "private-c-colme",
            {"budget": {"epsilon": 0.5, "action": "stop"}},
            ("classes", {"agents": 8, "class_means": [0.2, 0.8], "sigma": 0.5}),
            ("regular", {"degree": 3}),
        ),
    ],
)
@pytest.mark.parametrize("action", ["stop", "degrade"])
@pytest.mark.slow  # every delivery mode on four networks: about 20 s each
def test_a_binding_budget_gives_the_same_bytes_in_every_delivery_mode(
    protocol, params, data, topology, action
):
    """Windows on outages, churn and stragglers withhold or degrade exactly the releases one
    message per instant does (`desim.testing.check_modes`)."""
    params = {**params, "budget": {**params["budget"], "action": action}}
    for runs in check_modes(
        PROTOCOLS.get(protocol),
        params,
        data=data,
        topology=topology,
        t_max=40,
        metrics=METRIC_NAMES,
        state=("gate.withheld", "gate.hit_at"),
    ):
        assert np.isfinite(runs["instants"].protocol.gate.hit_at).all()
