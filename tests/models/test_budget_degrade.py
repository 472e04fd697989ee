"""Private-ColME under ``budget = {…, action = "degrade"}`` (issue 30): an agent ends its horizon
at its budget and never above it; the querier's Var[T] is the noise its releases really carry
plus the data's (by hand); degrade lies between stop and no budget; every delivery mode and a
complete graph give the same bytes; what is refused; the ledger's δ is the budget's."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from _runs import class_data, every_slot
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.params import ConfigError, build
from desim.kernel.randomness import Streams
from desim.kernel.registry import METRICS, PROTOCOLS
from desim.models.colme.statistic import PairStatistic
from desim.models.privacy.accounting import epsilon_spent, psum_multiplier
from desim.study.scenario import Scenario, run
from desim.testing import ScriptedLinks, check_modes

DELTA = 1e-6
L_FIG2 = math.sqrt(3) / 2  # σ = 1/2 uniform data: L = σ√3


def simulate(params: dict, m: int, t_max: int, links=None, seed: int = 0, cls=None, ledger=True):
    """(protocol, every slot's metrics as columns); the ledger and budget too with `ledger`."""
    metrics = [METRICS.get("privacy"), METRICS.get("budget")] if ledger else []
    proto, out = every_slot(params, m, t_max, links, seed, cls=cls, metrics=metrics)
    return proto, out.metrics.pivot(index="t", columns="metric", values="value")


def degrade(mechanism: str, epsilon: float, against: str, **more) -> dict:
    return {
        "mechanism": mechanism,
        "budget": {"epsilon": epsilon, "against": against, "action": "degrade"},
        **more,
    }


def multiplier(params: dict, m: int, t_max: int) -> float:
    """m of a run's p-sums (PM-II's depends on t_max; the budget does not change it)."""
    free, _ = simulate({k: v for k, v in params.items() if k != "budget"}, m, t_max, ledger=False)
    return psum_multiplier("gaussian", free.sigma2_dp, L_FIG2)


# -- the budget, at every slot and at t_max -------------------------------------------------------
@pytest.mark.parametrize(
    ("mechanism", "against", "epsilon", "weights"),
    [
        ("pm1", "one", 0.3, "last"),  # k* = 0: every release at m'
        ("pm1", "colluding", 1.0, "mom"),  # k* = 1 querier of 5
        ("pm2", "one", 0.15, "wmom"),
        ("pm2", "colluding", 0.4, "last"),
    ],
)
def test_a_degrade_agent_ends_its_horizon_at_its_budget(mechanism, against, epsilon, weights):
    """Ideal RR, t_max a multiple of M − 1: every pair gets κ_max releases, so every agent's
    most exposed sample ends in `most` p-sums, k* at m and the rest at m' — ε exactly the budget
    (up to the bisection on m_B); never above it on the way; nothing withheld."""
    m, t_max = 6, 5 * 16
    proto, wide = simulate(degrade(mechanism, epsilon, against, weights=weights), m, t_max)
    who = "one" if against == "one" else "all"
    assert proto.release_budget.degraded_m > proto.multiplier and proto.gate.withheld.sum() == 0
    assert (wide[f"eps_{who}_max"] <= epsilon * (1 + 1e-9)).all()
    final = proto.privacy_spend().epsilons()[who]
    assert (final <= epsilon * (1 + 1e-9)).all() and (final >= 0.99 * epsilon).all()
    assert np.isfinite(proto.gate.hit_at).all() and wide["budget_exhausted"].iloc[-1] == 1
    assert np.isfinite(proto.estimates()).all()


@given(
    mechanism=st.sampled_from(["pm1", "pm2"]),
    against=st.sampled_from(["one", "colluding"]),
    m=st.integers(3, 7),
    t_max=st.integers(4, 48),
    budget=st.floats(0.05, 3.0),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=10, deadline=None)
@pytest.mark.slow  # ten runs on lossy links, the ledger at every slot: about 5 s
def test_a_degrade_agent_never_exceeds_its_budget_on_lossy_links(
    mechanism, against, m, t_max, budget, seed
):
    """Drops and latency (repeats, gaps in j, stale releases): the ledger's ε never passes the
    budget, equals the hand count split at each pair's j_d, and no release is withheld."""
    links = ScriptedLinks(
        down=lambda rng, t, src, dst: rng.random(len(src)) < 0.3,
        delay=lambda rng, t, n: rng.exponential(1.5, n),
    )
    proto, _ = simulate(degrade(mechanism, budget, against), m, t_max, links, seed)
    who = "one" if against == "one" else "all"
    eps = proto.privacy_spend().epsilons()[who]
    assert (eps <= budget * (1 + 1e-9)).all() and proto.gate.withheld.sum() == 0
    if proto.release_budget.degraded_from is None:  # k* covers the horizon: nothing to degrade
        return
    mult, m_prime = proto.multiplier, proto.release_budget.degraded_m
    first = proto.release_budget.degraded_from.reshape(m, m).T  # [b, a]
    for b in range(m):
        held = []  # per querier: p-sums holding b's first sample made at m, and at m'
        for a in range(m):
            k = int(proto.mech.count[b, a])
            # PM-I: p-sum 1, made by release 1; PM-II: the node of level s, made by release 2^s
            made = [1] if mechanism == "pm1" else [2**s for s in range(k.bit_length())]
            made = [j for j in made if j <= k]
            held.append((sum(j < first[b, a] for j in made), sum(j >= first[b, a] for j in made)))
        if not any(d for _, d in held):  # never degraded: (m, count), as under stop
            counts = [e for e, _ in held]
            count = max(counts) if who == "one" else sum(counts)
            want = epsilon_spent("gaussian", mult, count, DELTA)
        else:
            precision = [e / mult**2 + d / m_prime**2 for e, d in held]
            total = max(precision) if who == "one" else sum(precision)
            want = epsilon_spent("gaussian", 1 / math.sqrt(total), 1, DELTA)
        assert eps[b] == pytest.approx(want, rel=1e-12)


# -- Var[T]: the noise each release carries -------------------------------------------------------
class Recorded(PROTOCOLS.get("private-colme")):
    """Private-ColME that keeps every release its queriers take: (a, b, t_b, j)."""

    def take(self, got, last=None, taken=None):
        self.log = getattr(self, "log", [])
        self.log += zip(got.a, got.b, got.payload[:, 1], got.payload[:, 2], strict=True)
        super().take(got, last, taken)


def releases(proto, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """t_j and j of the releases a took from b, in order."""
    rows = np.array([(t, j) for x, y, t, j in proto.log if (x, y) == (a, b)])
    return rows[:, 0], rows[:, 1].astype(np.int64)


def test_var_t_of_degraded_pm2_tree_nodes_by_hand():
    """PM-II, ``last``, against one, k* = 2 nodes: every pair degrades from j_d = 4, so release
    j's noise is Σ over its set bits ℓ of σ_DP² (node made by ⌊j/2^ℓ⌋·2^ℓ < 4) or ρσ_DP² (made
    later), and Var[T] = σ_b²/t_j + that/t_j²."""
    m, t_max = 3, 22
    params = {"mechanism": "pm2"}
    eps2 = epsilon_spent("gaussian", multiplier(params, m, t_max), 2, DELTA)
    params = degrade("pm2", eps2 * 1.0001, "one")
    proto, _ = simulate(params, m, t_max, cls=Recorded, ledger=False)
    off_diagonal = ~np.eye(m, dtype=bool)
    assert (
        proto.gate.capacity == 2
        and (proto.release_budget.degraded_from.reshape(m, m)[off_diagonal] == 4).all()
    )
    s2, rho = proto.sigma2_dp, (proto.release_budget.degraded_m / proto.multiplier) ** 2
    var = proto.stat.variance(proto.sigma2[None, :])
    for a in range(m):
        for b in range(m):
            if a == b:
                continue
            t, j = releases(proto, a, b)
            t, j = t[-1], int(j[-1])
            nodes = [(j >> lv) << lv for lv in range(5) if j >> lv & 1]
            noise = sum(s2 * (rho if made >= 4 else 1.0) for made in nodes)
            want = proto.sigma2[b] / t + noise / t**2
            assert j >= 4 and var[a, b] == pytest.approx(want, rel=1e-12)


@given(
    levels=st.integers(1, 20),
    rho=st.floats(1.0, 100.0),
    rows=st.lists(st.tuples(st.integers(1, 2**20), st.integers(1, 2**20 + 2)), max_size=30),
    never=st.lists(st.booleans(), max_size=30),
)
def test_node_noise_is_rho_exactly_where_the_node_was_made_from_j_d_on(levels, rho, rows, never):
    """PM-II's node variances in release j (`PairStatistic.node_noise`, one look-up per row)
    equal the definition level by level: ρ where ⌊j/2^ℓ⌋·2^ℓ ≥ j_d, else 1 (j_d = 2³¹ − 1 for a
    pair never degraded), for every j < 2^levels."""
    stat = PairStatistic(2, "pm2", "last", 1.0, levels, degraded_ratio=rho)
    j = np.array([x % 2**levels or 1 for x, _ in rows], dtype=np.int64)
    j_d = np.array([d for _, d in rows], dtype=np.int32)
    j_d[np.array(never[: len(rows)] + [False] * (len(rows) - len(never)), dtype=bool)] = 2**31 - 1
    level = np.arange(levels)
    made_by = (j[:, None] >> level) << level
    want = np.where(made_by >= j_d[:, None], rho, 1.0)
    assert np.array_equal(stat.node_noise(j, j_d), want)


def test_var_t_of_degraded_pm1_psums_under_mean_of_means_by_hand():
    """PM-I, ``mom``, against colluding: ideal RR gives b's first release to a new querier in
    each of slots 1 … M − 1; the gate admits k* of them, and a pair whose first release it
    refused (made at t_1 ≥ hit_at[b]) degrades from j_d = 1: its p-sums all carry ρσ_DP², the
    others' σ_DP². With the block of all κ releases,
    Var[T] = (σ_b² Σ_{j,j'} 1/max(t_j, t_j') + Σ_i v_i (Σ_{j ≥ i} 1/t_j)²)/κ²."""
    m, t_max = 5, 30
    params = degrade("pm1", 1.5, "colluding", weights="mom")
    proto, _ = simulate(params, m, t_max, cls=Recorded, ledger=False)
    assert 0 < proto.gate.capacity < m - 1
    s2, rho = proto.sigma2_dp, (proto.release_budget.degraded_m / proto.multiplier) ** 2
    var = proto.stat.variance(proto.sigma2[None, :])
    seen = set()
    for a in range(m):
        for b in range(m):
            if a == b:
                continue
            t, j = releases(proto, a, b)
            np.testing.assert_array_equal(j, np.arange(1, len(j) + 1))
            degraded = t[0] >= proto.gate.hit_at[b]
            seen.add(bool(degraded))
            v = np.full(len(t), rho * s2 if degraded else s2)
            data = (1.0 / np.maximum.outer(t, t)).sum()
            tail = np.cumsum((1.0 / t)[::-1])[::-1]  # Σ_{j ≥ i} 1/t_j
            want = (proto.sigma2[b] * data + (v * tail**2).sum()) / len(t) ** 2
            assert var[a, b] == pytest.approx(want, rel=1e-12)
    assert seen == {False, True}


# -- what degrade buys ---------------------------------------------------------------------------
@pytest.mark.slow  # 36 runs: about 10 s
def test_degrade_lies_between_stop_and_no_budget():
    """PM-I against one querier with a budget below one release (k* = 0): ``stop`` releases
    nothing (every agent keeps its local mean), ``degrade`` every release with m' > m, no budget
    every release at m. The oracle's combination is the inverse-variance one of the same
    statistics, noisier under degrade, so its MSE must lie between: over 12 seeds (data and noise
    shared by the three runs of a seed) each paired difference is ≥ 0 within 4 standard errors,
    and degrade is neither of the others."""
    m, t_max, seeds = 12, 120, range(12)
    base = {"mechanism": "pm1"}
    eps = 0.8 * epsilon_spent("gaussian", multiplier(base, m, t_max), 1, DELTA)
    oracle = PROTOCOLS.get("private-colme-oracle")
    mse = {}
    for name in ("none", "degrade", "stop"):
        params = base if name == "none" else {**base, "budget": {"epsilon": eps, "action": name}}
        mse[name] = []
        for seed in seeds:
            proto, _ = simulate(params, m, t_max, seed=seed, cls=oracle, ledger=False)
            mse[name].append(np.mean((proto.estimates() - class_data(m, seed).means) ** 2))
    mse = {k: np.array(v) for k, v in mse.items()}
    for low, high in (("none", "degrade"), ("degrade", "stop")):
        d = mse[high] - mse[low]
        se = d.std(ddof=1) / math.sqrt(len(d))
        assert d.mean() > -4 * se, (low, high, d.mean(), se)
    assert (mse["degrade"] != mse["none"]).all() and (mse["degrade"] != mse["stop"]).all()


# -- delivery modes, graphs ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mechanism", "against", "epsilon"),
    [
        pytest.param("pm2", "colluding", 0.4, marks=pytest.mark.slow),  # about 10 s each
        pytest.param("pm1", "colluding", 2.0, marks=pytest.mark.slow),
        pytest.param("pm2", "one", 0.15, marks=pytest.mark.slow),
    ],
)
def test_degrade_gives_the_same_bytes_in_every_delivery_mode(mechanism, against, epsilon):
    """Windows and slot batches degrade exactly the releases one message per instant does."""
    for runs in check_modes(
        PROTOCOLS.get("private-colme"),
        {**degrade(mechanism, epsilon, against), "weights": "wmom"},
        t_max=80,
        metrics=("budget", "privacy"),
        state=("gate.hit_at", "gate.exposure", "mech.count", "release_budget.degraded_from"),
    ):
        proto = runs["instants"].protocol
        assert proto.release_budget.any_degraded and proto.gate.withheld.sum() == 0


def test_degrade_on_a_complete_graph_gives_the_bytes_of_all_peers():
    """peers = "topology" on a complete graph is the all-peers run bit for bit, degraded
    releases, Var[T] and ledger included."""
    out = []
    for peers in ("all", "topology"):
        s = Scenario(
            protocol="private-colme",
            params={**degrade("pm2", 0.4, "colluding"), "peers": peers},
            data={"model": "classes", "agents": 8, "class_means": [0.2, 0.8], "sigma": 0.5},
            network={"links": "ideal"},
            t_max=60,
            checkpoints=10,
            topology={"model": "complete"},
            per_agent=True,
            metrics=("privacy", "budget"),
        )
        out.append(run(s, streams=Streams(1, 0, 5, 7)))
    pd.testing.assert_frame_equal(out[0].metrics, out[1].metrics, check_exact=True)
    pd.testing.assert_frame_equal(out[0].agents, out[1].agents, check_exact=True)
    assert (out[0].metrics.metric == "budget_exhausted").any()


def test_a_degrade_budget_that_never_binds_changes_nothing():
    _, free = simulate({"mechanism": "pm2"}, 6, 60, seed=3)
    proto, budgeted = simulate(degrade("pm2", 1e6, "colluding"), 6, 60, seed=3)
    assert proto.release_budget.degraded_from is None and not np.isfinite(proto.gate.hit_at).any()
    keep = [c for c in budgeted.columns if not c.startswith("budget")]
    assert free.to_csv().encode() == budgeted[keep].to_csv().encode()


# -- refusals and the ledger's δ -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"noise": "laplace"}, "budget.action = 'degrade': needs noise = 'gaussian'"),
        ({"variance": "sch-var-1"}, "budget.action = 'degrade': needs variance = 'known'"),
        ({"variance": "sch-var-2"}, "budget.action = 'degrade': needs variance = 'known'"),
    ],
)
def test_degrade_is_refused_where_it_is_not_exact(params, message):
    cls = PROTOCOLS.get("private-colme")
    with pytest.raises(ConfigError, match=message):
        build(cls.Params, {**degrade("pm1", 1.0, "one"), **params}, "scenario 'x'")


@pytest.mark.parametrize("action", ["stop", "degrade"])
def test_the_ledger_reports_at_the_budget_s_delta(action):
    """A budget with its own δ (10⁻³, the protocol's 10⁻⁶): the `privacy` ledger reports ε at
    the δ the budget is checked at, so its ε never passes the budget."""
    budget = {"epsilon": 0.25, "delta": 1e-3, "against": "colluding", "action": action}
    proto, wide = simulate({"mechanism": "pm2", "budget": budget}, 6, 60)
    assert proto.params.delta == DELTA and np.isfinite(proto.gate.hit_at).any()
    assert (wide["eps_all_max"] <= 0.25 * (1 + 1e-9)).all()
    at_protocol = proto.privacy_spend().epsilons()["all"].max()
    assert at_protocol > wide["eps_all_max"].iloc[-1]  # the same releases at δ = 10⁻⁶


@pytest.mark.parametrize(("mechanism", "against"), [("pm1", "colluding"), ("pm2", "one")])
def test_degrade_with_no_room_for_any_m_prime_is_stop(mechanism, against):
    """ε_B = ε(m, 2) exactly: k* = 2 releases at m use the whole budget, so no m' fits and the
    first refusal turns ``degrade`` into ``stop`` — the same bytes and withheld releases."""
    m, t_max = 5, 24
    eps = epsilon_spent("gaussian", multiplier({"mechanism": mechanism}, m, t_max), 2, DELTA)
    stop = {"epsilon": eps, "against": against, "action": "stop"}
    proto_s, out_s = simulate({"mechanism": mechanism, "budget": stop}, m, t_max, seed=2)
    proto_d, out_d = simulate(degrade(mechanism, eps, against), m, t_max, seed=2)
    assert proto_d.gate.capacity == 2 and proto_d.release_budget.degraded_from is None
    assert proto_d.gate.withheld.sum() > 0 and proto_d.gate.budget.action == "stop"
    assert np.array_equal(proto_d.gate.withheld, proto_s.gate.withheld)
    assert out_d.to_csv().encode() == out_s.to_csv().encode()


# -- k* = 0: every release at m' (the scalar j_d = 1) ---------------------------------------------
@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
@pytest.mark.parametrize("weights", ["last", "mom"])
def test_the_scalar_j_d_1_gives_the_bits_of_j_d_1_for_every_pair(mechanism, weights):
    """k* = 0 passes j_d as the scalar 1 (no per-pair look-up, no c kept per pair): the
    statistic's returns and Var[T] are those of j_d = 1 given pair by pair, bit for bit, with
    gaps in j too."""
    rng = np.random.default_rng(4)
    stats = [PairStatistic(4, mechanism, weights, 0.7, 6, degraded_ratio=2.3) for _ in range(2)]
    kappa = np.zeros(16, dtype=np.int64)
    for _ in range(12):
        pair = rng.choice(16, size=5, replace=False)
        j = kappa[pair] + rng.integers(1, 3, size=5)
        kappa[pair] = j
        values, t = rng.normal(size=5), rng.integers(1, 50, size=5).astype(float)
        scalar = stats[0].update(pair // 4, pair % 4, values, t, j, pair=pair, degraded_from=1)
        ones = np.ones(5, dtype=np.int32)
        arrays = stats[1].update(pair // 4, pair % 4, values, t, j, pair=pair, degraded_from=ones)
        for x, y in zip(scalar, arrays, strict=True):
            assert np.array_equal(x, y)
        sigma2 = rng.uniform(0.1, 1.0, size=4)
        assert np.array_equal(stats[0].variance(sigma2), stats[1].variance(sigma2))
        assert np.array_equal(stats[0].terms(pair)[2], stats[1].terms(pair)[2])


@pytest.mark.parametrize(("mechanism", "against"), [("pm1", "one"), ("pm2", "colluding")])
def test_the_ledger_of_k_star_0_is_the_general_split_bit_for_bit(mechanism, against, monkeypatch):
    """With k* = 0 the ledger skips the split at j_d (every p-sum is at m'): its multipliers and
    counts are the bits the general split gives (asked for by a gate whose capacity reads as
    unknown) for both recipient sets, at the end of a run on lossy links."""
    links = ScriptedLinks(down=lambda rng, t, src, dst: rng.random(len(src)) < 0.3)
    proto, _ = simulate(degrade(mechanism, 0.05, against), 5, 40, links, seed=3, ledger=False)
    assert proto.gate.capacity == 0 and proto.release_budget.any_degraded
    short = proto.privacy_spend().against
    monkeypatch.setattr(proto.gate, "capacity", -1)  # the general split
    general = proto.privacy_spend().against
    for who in ("one", "all"):
        for x, y in zip(short[who], general[who], strict=True):
            assert np.array_equal(np.broadcast_to(x, y.shape), y)
