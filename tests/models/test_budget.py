"""Per-agent privacy budgets of Private-ColME (issue 30): k* found by the accountant, a `stop`
agent's ε never above its budget and no room left when it withheld a release (property test),
the `budget` metric, a budget that never binds changing nothing, and the study-file route."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from _runs import every_slot, run_study_text, summary_rows
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.links import IdealLinks
from desim.kernel.params import ConfigError, build
from desim.kernel.registry import METRICS, PROTOCOLS
from desim.models.privacy.accounting import epsilon_spent, psum_multiplier
from desim.models.privacy.budget import (
    Budget,
    StopGate,
    capacity,
    degraded_multiplier,
    first_sample_psums,
)
from desim.network_models.links import FixedLatency
from desim.testing import ScriptedLinks, check_modes

DELTA = 1e-6
L_FIG2 = math.sqrt(3) / 2  # σ = 1/2 uniform data: L = σ√3


def simulate(params: dict, m: int, t_max: int, links=None, seed: int = 0):
    metrics = [METRICS.get("privacy"), METRICS.get("budget")]
    return every_slot(params, m, t_max, links, seed, metrics=metrics)


def exposure(proto) -> np.ndarray:
    """The ledger's count of p-sums holding each agent's first sample, from the releases made
    (mech.count), against the budget's recipient set."""
    p = proto.params
    per = first_sample_psums(p.mechanism, proto.mech.count) * (
        2 if p.variance == "sch-var-1" else 1
    )
    return per.max(axis=1) if p.budget.against == "one" else per.sum(axis=1)


# -- k*, the budget as a count -------------------------------------------------------------------
@pytest.mark.parametrize("mult", [0.5, 2.0, 7.3])
@pytest.mark.parametrize("eps", [0.3, 1.0, 4.0])
def test_capacity_is_the_last_count_the_closed_form_allows(mult, eps):
    """Gaussian: k releases of multiplier m are one of m/√k (closed-form ε), counted one by one."""

    def gaussian(k):
        return dp_accounting.get_epsilon_gaussian(mult / math.sqrt(k), DELTA)

    k = 0
    while k < 5000 and gaussian(k + 1) <= eps:
        k += 1
    assert capacity("gaussian", mult, eps, DELTA, 5000) == k
    assert capacity("gaussian", mult, eps, DELTA, 3) == min(k, 3)


def test_capacity_of_laplace_uses_the_pld_accountant():
    # one Laplace release with b = Δ/ε₀ is ε₀-DP: a budget of 0.9·ε₀ allows none, 1.2·ε₀ one
    assert capacity("laplace", 2.0, 0.45, DELTA, 100) == 0
    k = capacity("laplace", 2.0, 1.5, DELTA, 100)
    assert (
        epsilon_spent("laplace", 2.0, k, DELTA) <= 1.5 < epsilon_spent("laplace", 2.0, k + 1, DELTA)
    )


# -- stop: never above, no room left when withholding ---------------------------------------------
@given(
    mechanism=st.sampled_from(["pm1", "pm2"]),
    against=st.sampled_from(["one", "colluding"]),
    variance=st.sampled_from(["known", "sch-var-1"]),
    m=st.integers(3, 7),
    t_max=st.integers(4, 48),
    budget=st.floats(0.05, 3.0),
    lossy=st.booleans(),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=20, deadline=None)
def test_a_stop_agent_never_exceeds_and_stops_only_when_full(
    mechanism, against, variance, m, t_max, budget, lossy, seed
):
    links = None
    if lossy:  # drops and latency: the general delivery path, repeats, gaps in j
        links = ScriptedLinks(
            down=lambda rng, t, src, dst: rng.random(len(src)) < 0.3,
            delay=lambda rng, t, n: rng.exponential(1.5, n),
        )
    params = {
        "mechanism": mechanism,
        "variance": variance,
        "budget": {"epsilon": budget, "against": against},
    }
    proto, out = simulate(params, m, t_max, links, seed)
    gate, mult = proto.gate, psum_multiplier("gaussian", proto.sigma2_dp, L_FIG2)
    c = 2 if variance == "sch-var-1" else 1
    k = exposure(proto)
    assert (k == gate.exposure).all() or not proto.release_budget.binds  # (gate skipped)
    spent = np.array([epsilon_spent("gaussian", mult, int(x), DELTA) for x in k])
    assert (spent <= budget).all()
    ledger = proto.privacy_spend().epsilons()["one" if against == "one" else "all"]
    np.testing.assert_array_equal(ledger, spent)
    for b in np.flatnonzero(gate.withheld):  # it stopped: one release more would not fit
        assert epsilon_spent("gaussian", mult, int(k[b]) + c, DELTA) > budget
        assert 1 <= gate.hit_at[b] <= t_max


def test_withheld_releases_are_never_sent():
    """Ideal links: every query is answered by a release unless the gate withheld it."""
    proto, out = simulate(
        {"mechanism": "pm2", "budget": {"epsilon": 0.3, "against": "colluding"}}, 5, 40
    )
    wide = out.metrics.pivot(index="t", columns="metric", values="value")
    assert proto.gate.withheld.sum() > 0
    assert wide["messages_release"].iloc[-1] == proto.mech.count.sum()
    assert wide["messages_query"].iloc[-1] == proto.mech.count.sum() + proto.gate.withheld.sum()
    assert np.isfinite(proto.estimates()).all()


def test_exhausted_fraction_by_hand():
    """M = 5, PM-II, RR: each pair's release 8 is its first sample's 4th node. With room for 3
    nodes every agent withholds its release 8 to the querier at RR offset 1, in slot 1 + 7·4 =
    29 (every agent is queried by one querier per slot): nobody is out before, everybody then."""
    base = {"mechanism": "pm2"}
    free, _ = simulate(base, 5, 40)
    eps3 = epsilon_spent("gaussian", psum_multiplier("gaussian", free.sigma2_dp, L_FIG2), 3, DELTA)
    proto, out = simulate({**base, "budget": {"epsilon": eps3}}, 5, 40)
    assert proto.gate.capacity == 3
    wide = out.metrics.pivot(index="t", columns="metric", values="value")
    assert (wide.loc[:28, "budget_exhausted"] == 0).all()
    assert (wide.loc[29:, "budget_exhausted"] == 1).all()
    assert (proto.gate.hit_at == 29).all()
    assert (proto.mech.count <= 7).all() and wide["eps_one_max"].max() <= eps3


@pytest.mark.parametrize("links", [None, "zero-latency"])
@pytest.mark.parametrize(
    "params", [{"mechanism": "pm2"}, {"mechanism": "pm1", "variance": "sch-var-1"}]
)
def test_a_budget_that_never_binds_changes_nothing(params, links):
    link = None if links is None else FixedLatency(slots=0.0)
    _, free = simulate(params, 6, 60, link, seed=3)
    proto, budgeted = simulate({**params, "budget": {"epsilon": 1e6}}, 6, 60, link, seed=3)
    assert proto.gate.withheld.sum() == 0
    keep = ~budgeted.metrics.metric.str.startswith("budget")
    assert (
        free.metrics.to_csv().encode()
        == budgeted.metrics[keep].reset_index(drop=True).to_csv().encode()
    )


def test_zero_latency_with_a_binding_budget_reproduces_ideal_links():
    params = {"mechanism": "pm2", "budget": {"epsilon": 0.4, "against": "colluding"}}
    ideal, out_ideal = simulate(params, 7, 60, IdealLinks(), seed=2)
    general, out_general = simulate(params, 7, 60, FixedLatency(slots=0.0), seed=2)
    assert ideal.gate.withheld.sum() > 0
    np.testing.assert_array_equal(ideal.mech.count, general.mech.count)
    np.testing.assert_array_equal(ideal.gate.hit_at, general.gate.hit_at)
    np.testing.assert_array_equal(ideal.estimates(), general.estimates())


@pytest.mark.parametrize(
    ("schedule", "mechanism", "against", "epsilon"),
    [
        ("rr", "pm2", "colluding", 0.4),  # k* = 15 tree nodes over all queriers
        pytest.param("rr", "pm1", "colluding", 2.0, marks=pytest.mark.slow),  # k* = 5 queriers
        pytest.param("rrr", "pm2", "colluding", 0.4, marks=pytest.mark.slow),
        pytest.param("rrr", "pm2", "one", 0.15, marks=pytest.mark.slow),
    ],
)
def test_a_binding_budget_gives_the_same_bytes_in_every_delivery_mode(
    schedule, mechanism, against, epsilon
):
    """Windows and slot batches on outages, churn and stragglers withhold exactly the releases
    one message per instant does (`desim.testing.check_modes`)."""
    params = {
        "schedule": schedule,
        "mechanism": mechanism,
        "budget": {"epsilon": epsilon, "against": against},
    }
    for runs in check_modes(
        PROTOCOLS.get("private-colme"),
        params,
        t_max=80,
        metrics=("budget",),
        state=("gate.withheld", "gate.hit_at", "gate.exposure", "mech.count"),
    ):
        gate = runs["instants"].protocol.gate
        assert 0 < gate.capacity and gate.withheld.sum() > 0


# -- the study-file route and its messages --------------------------------------------------------
@pytest.mark.parametrize(
    ("budget", "message"),
    [
        ({"epsilon": -1}, "budget.epsilon = -1: must be a finite number > 0"),
        ({"epsilon": 1, "against": "all"}, "budget.against = 'all': must be one of one"),
        ({"epsilon": 1, "action": "pause"}, "budget.action = 'pause': must be one of stop"),
        ({"epsilon": 1, "delta": 2}, "budget.delta = 2: must lie in"),
        ({"epsilon": 1, "eps": 1}, "budget.eps: unknown key"),
        ("lots", "budget = 'lots': must be a table"),
    ],
)
def test_bad_budgets_are_one_line_config_errors(budget, message):
    cls = PROTOCOLS.get("private-colme")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        build(cls.Params, {"budget": budget}, "scenario 'x'")
    with pytest.raises(ConfigError, match="noise = 'none'"):
        build(cls.Params, {"budget": {"epsilon": 1}, "noise": "none"}, "scenario 'x'")


STUDY = """
[study]
title = "budgets"
seed = 1
replicates = 1
t_max = 40
checkpoints = 8
metrics = ["privacy", "budget"]

[data]
model = "classes"
agents = 6
class_means = [0.2, 0.8]
sigma = 0.5

[[scenario]]
name = "unlimited"
protocol = "private-colme"
mechanism = "pm2"

[[scenario]]
name = "stop"
protocol = "private-colme"
mechanism = "pm2"
budget = {epsilon = 0.5, against = "colluding", action = "stop"}
"""


def test_a_study_with_a_budget_runs_and_summarises(tmp_path, capsys, no_figures):
    folder = run_study_text(tmp_path / "budgets", STUDY)
    rows = summary_rows(folder, "budget_exhausted", capsys)
    assert float(rows["stop"][1]) > 0  # at t_max some agents have withheld a release
    assert "unlimited" not in rows  # no budget, nothing recorded


@pytest.mark.parametrize("multiplier", [0.4, 2.0, 14.6])
@pytest.mark.parametrize(("epsilon", "cap"), [(0.5, 1), (1.0, 7), (4.0, 1000), (40.0, 50)])
def test_gaussian_capacity_from_the_closed_form_is_the_ledger_s_own_boundary(
    multiplier, epsilon, cap
):
    """k* for Gaussian noise starts from ⌊(m/σ*)²⌋ (k releases are one of multiplier m/√k):
    it must be exactly the largest k ≤ cap whose ledger ε fits, as the ledger counts it."""
    delta = 1e-6

    def fits(k: int) -> bool:
        return epsilon_spent("gaussian", multiplier, k, delta) <= epsilon

    lo, hi = 0, cap + 1  # fits(lo) (0 releases spend nothing), not fits(hi) or beyond cap
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    expected = lo
    assert capacity("gaussian", multiplier, epsilon, delta, cap) == expected


@given(
    mechanism=st.sampled_from(["pm1", "pm2"]),
    against=st.sampled_from(["one", "colluding"]),
    k_star=st.integers(0, 12),
    calls=st.lists(
        st.lists(st.tuples(st.integers(0, 4), st.integers(0, 20)), min_size=1, max_size=6),
        min_size=1,
        max_size=8,
    ),
)
@settings(max_examples=60, deadline=None)
def test_a_quiet_gate_would_admit_everything_and_change_nothing(mechanism, against, k_star, calls):
    """`StopGate.quiet` is a shortcut of `admit`: whenever it says so, `admit` admits every
    release and leaves the counts, withheld releases and hit times as they were."""
    gate = StopGate(Budget(1.0, DELTA, against, "stop"), mechanism, 1, 5, k_star, kappa_max=20)
    for t, call in enumerate(calls):
        b = np.array([x for x, _ in call])
        kappa = np.array([k for _, k in call])
        before = (gate.exposure.copy(), gate.withheld.copy(), gate.hit_at.copy())
        quiet = gate.quiet(b, kappa)
        ok = gate.admit(b, kappa, float(t))
        if quiet:
            assert ok.all()
            for was, now in zip(before, (gate.exposure, gate.withheld, gate.hit_at), strict=True):
                assert np.array_equal(was, now)


@pytest.mark.parametrize("epsilon", [0.05, 0.5, 1.0, 4.0, 13.2, 30.0])
@pytest.mark.parametrize(("delta", "k_star"), [(1e-5, 0), (1e-6, 3), (1e-8, 1)])
def test_degraded_multiplier_is_the_plain_bisection_on_the_ledger(epsilon, delta, k_star):
    """m' asks the ledger only near σ*: the same floats as a bisection asking it every time."""

    def fits(x: float) -> bool:
        return epsilon_spent("gaussian", x, 1, delta) <= epsilon

    hi = 1.0
    while not fits(hi):
        hi *= 2.0
    lo = hi / 2.0
    while fits(lo):
        hi, lo = lo, lo / 2.0
    while hi - lo > 1e-12 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    room = 1.0 / hi**2 - k_star / 7.3**2
    expected = math.sqrt(100 / room) if room > 0 else math.inf
    assert degraded_multiplier(7.3, k_star, 100, epsilon, delta) == expected
