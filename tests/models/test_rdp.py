"""The RDP accountant beside PLD (issue 30): PLD is never looser than RDP on the bundled
mechanisms (Gaussian, Laplace, randomised response, over release counts and multipliers), RDP's
tight calibration is its own edge, and the `privacy-rdp` ledger is recorded beside `privacy`."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.engine import Simulation
from desim.kernel.params import build
from desim.kernel.randomness import Streams
from desim.kernel.registry import DATA, METRICS, PROTOCOLS
from desim.models.privacy.accounting import (
    PLD_INTERVAL,
    Spend,
    check_accountant,
    epsilon_spent,
    pld_epsilon,
    rdp_epsilon,
    tight_multiplier,
    tight_sigma,
)


def pld_slack(noise: str, count: int) -> float:
    """How far the ledger's PLD ε may lie above the true ε: nothing for the Gaussian (closed
    form); otherwise the pessimistic grid rounds each of the `count` composed privacy losses up
    by less than its width (Laplace: the ledger's 10⁻⁴·√count, at most 10⁻³; randomised
    response: dp-accounting's default 10⁻⁴)."""
    if noise == "gaussian":
        return 0.0
    if noise == "rr":
        return count * PLD_INTERVAL
    return count * min(1e-3, PLD_INTERVAL * max(1.0, math.sqrt(count)))


@settings(max_examples=20, deadline=None)
@given(
    noise=st.sampled_from(["gaussian", "laplace", "rr"]),
    count=st.integers(1, 32),
    scale=st.floats(1.0, 30.0),
    delta=st.sampled_from([1e-9, 1e-6, 1e-3]),
)
def test_pld_is_never_looser_than_rdp(noise, count, scale, delta):
    """Both are upper bounds on the true ε; PLD's is exact up to its grid, RDP's loses the
    conversion from Rényi divergences, so ε_PLD ≤ ε_RDP + the grid's slack. For randomised
    response `scale` is read as 1/ε₀."""
    m = 1.0 / scale if noise == "rr" else scale
    pld = epsilon_spent(noise, m, count, delta)
    rdp = epsilon_spent(noise, m, count, delta, "rdp")
    assert rdp == rdp_epsilon(noise, m, count, delta)
    assert pld <= rdp * (1 + 1e-12) + pld_slack(noise, count)


@pytest.mark.parametrize("noise", ["gaussian", "laplace"])
@pytest.mark.parametrize("count", [1, 8])
def test_rdp_tight_multiplier_is_its_own_edge_and_needs_more_noise(noise, count):
    eps, delta = 1.0, 1e-6
    m = tight_multiplier(noise, eps, delta, count, "rdp")
    assert rdp_epsilon(noise, m, count, delta) <= eps
    assert rdp_epsilon(noise, 0.99 * m, count, delta) > eps
    # noise enough for RDP is enough for PLD (which needs no more): (ε, δ) per PLD there too
    assert pld_epsilon(noise, m, count, delta) <= eps
    assert tight_sigma(noise, 2.0, eps, delta, count, accountant="rdp") == 2.0 * m


def test_accountant_is_checked_and_zero_noise_spends_everything():
    with pytest.raises(ValueError, match="accountant = 'moments': must be one of pld, rdp"):
        check_accountant("moments")
    with pytest.raises(ValueError, match="accountant"):
        tight_multiplier("gaussian", 1.0, 1e-6, 1, "moments")
    assert epsilon_spent("gaussian", 0.0, 3, 1e-6, "rdp") == math.inf
    assert epsilon_spent("laplace", 2.0, 0, 1e-6, "rdp") == 0.0
    spend = Spend("gaussian", 1e-6, {"one": (4.0, np.array([0, 1, 4]))}, accountant="rdp")
    eps = spend.epsilons()["one"]
    assert eps[0] == 0.0 and eps[1] < eps[2] == rdp_epsilon("gaussian", 4.0, 4, 1e-6)


def test_privacy_rdp_ledger_is_recorded_beside_pld_and_above_it():
    m, t_max = 6, 12
    data = build(
        DATA.get("classes"), {"agents": m, "class_means": [0.2, 0.8], "sigma": 0.5}, "data"
    ).make(np.random.default_rng(0))
    cls = PROTOCOLS.get("private-colme")
    proto = cls(build(cls.Params, {"mechanism": "pm2"}, "test"))
    out = Simulation(
        proto,
        data,
        t_max,
        Streams(0, 0, 1, 2),
        checkpoints=np.arange(1, t_max + 1),
        per_agent=True,
        metrics=[METRICS.get("privacy"), METRICS.get("privacy-rdp")],
    ).run()
    wide = out.metrics.pivot(index="t", columns="metric", values="value")
    for who in ("one", "all"):
        for stat in ("mean", "max"):
            pld, rdp = wide[f"eps_{who}_{stat}"], wide[f"eps_rdp_{who}_{stat}"]
            assert (rdp >= pld).all() and (rdp > pld).any()
    assert list(out.agents.columns) == [
        "t",
        "agent",
        "value",
        "eps_one",
        "eps_all",
        "eps_rdp_one",
        "eps_rdp_all",
    ]
    assert (out.agents["eps_rdp_all"] >= out.agents["eps_all"]).all()


def test_rdp_and_per_agent_ledger_names_are_labelled():
    from desim.study.plots import metric_label

    assert (
        metric_label("eps_rdp_all_max")
        == "ε spent against all queriers colluding (max over agents, RDP)"
    )
    assert metric_label("eps_server") == "ε spent against the server (per agent)"
    assert metric_label("eps_rdp_one") == "ε spent against one querier (per agent, RDP)"
    assert metric_label("eps_nobody_max") == "eps nobody max"
