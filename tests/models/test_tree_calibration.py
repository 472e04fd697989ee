"""PM-II's tight calibration for the tree nodes one querier really gets (issue 30): the count by
brute-force enumeration of the paper's tree, the release count of round robin, the accountant's
verdict on the calibrated multiplier, and the ledger of a run that spends exactly its budget."""

from __future__ import annotations

import math

import numpy as np
import pytest

from desim.kernel.engine import Simulation
from desim.kernel.params import ConfigError, build
from desim.kernel.randomness import Streams
from desim.kernel.registry import DATA, METRICS, PROTOCOLS
from desim.models.colme.schedule import RoundRobin, max_pair_releases
from desim.models.privacy.accounting import (
    pld_epsilon,
    psum_multiplier,
    psum_noise,
)
from desim.models.privacy.release import PSumRelease
from desim.models.privacy.tree import calibrated_psum_noise, nodes_per_sample

L_FIG2 = math.sqrt(3) / 2


def paper_nodes(j: int) -> list[tuple[int, int]]:
    """The dyadic nodes (first leaf, last leaf) of release j, as §IV-B defines them: the first
    2^{s_1} leaves, the next 2^{s_2}, … for j = 2^{s_1} + 2^{s_2} + … (s_1 > s_2 > …)."""
    nodes, start = [], 0
    for s in reversed(range(j.bit_length())):
        if j >> s & 1:
            nodes.append((start + 1, start + 2**s))
            start += 2**s
    return nodes


def most_nodes_by_enumeration(kappa: int) -> int:
    """Released nodes holding the most exposed leaf after κ releases, counted one by one."""
    released = {node for j in range(1, kappa + 1) for node in paper_nodes(j)}
    counts = [sum(lo <= i <= hi for lo, hi in released) for i in range(1, kappa + 1)]
    return max(counts, default=0)


def test_nodes_per_sample_by_hand():
    # κ = 1: [1]; 2: [1], [1:2]; 3: + [3]; 4: + [1:4]; 7: leaf 1 in [1], [1:2], [1:4]
    assert [nodes_per_sample(k) for k in (0, 1, 2, 3, 4, 7, 8, 150, 151)] == [
        0, 1, 2, 2, 3, 3, 4, 8, 8,
    ]  # fmt: skip


@pytest.mark.parametrize("kappa", range(0, 70))
def test_nodes_per_sample_equals_enumerating_the_tree(kappa):
    assert nodes_per_sample(kappa) == most_nodes_by_enumeration(kappa)


def test_the_implementation_releases_the_papers_nodes():
    """PSumRelease's noise of release j is the sum of the fresh noises of the releases that
    completed the paper's nodes of j (node [lo:hi] is completed by release hi)."""
    mech = PSumRelease(1, "pm2", "gaussian", 1.0, np.random.default_rng(3), 64)
    fresh = {}
    one = np.zeros(1, dtype=np.int64)
    for j in range(1, 65):
        z, idx, new = mech.release(one, one, np.zeros(1), np.ones(1))
        assert idx[0] == j
        fresh[j] = new[0]
        assert z[0] == pytest.approx(sum(fresh[hi] for _, hi in paper_nodes(j)), abs=1e-12)


@pytest.mark.parametrize("m", [2, 3, 5, 8])
def test_round_robin_worst_sample_by_enumeration(m):
    """Every slot's RR queries, every responder's releases to every querier, and every sample's
    released nodes: the most exposed sample lies in ⌊log₂ ⌈t/(M−1)⌉⌋+1 of them at every t."""
    rr = RoundRobin(m)
    t_max = 37
    kappa = np.zeros((m, m), dtype=np.int64)  # [b, a]
    for t in range(1, t_max + 1):
        a, b = rr.targets(t)
        kappa[b, a] += 1
        assert kappa.max() == max_pair_releases("rr", m, t)
        # the release of slot t covers samples up to t: a sample lies in some leaf ≤ κ
        assert max(most_nodes_by_enumeration(int(k)) for k in kappa.ravel()) == nodes_per_sample(
            max_pair_releases("rr", m, t)
        )
    assert max_pair_releases("rrr", m, t_max) == t_max


def tree_multiplier(noise: str, t_max: int, m: int, var: bool = False) -> tuple[float, int]:
    """The tight-tree noise multiplier of Private-ColME's PM-II under RR, and its count."""
    kappa = max_pair_releases("rr", m, t_max)
    s2 = calibrated_psum_noise(noise, L_FIG2, "pm2", 1.0, 1e-6, t_max, "tight-tree", kappa, var)
    return psum_multiplier(noise, s2[0], L_FIG2), nodes_per_sample(kappa) * (2 if var else 1)


@pytest.mark.parametrize(
    ("noise", "t_max", "m", "nodes"),
    [
        ("gaussian", 80, 3, 6),  # κ_max = 40
        ("laplace", 40, 5, 4),  # κ_max = 10
        pytest.param("gaussian", 30000, 200, 8, marks=pytest.mark.slow),  # κ_max = 151
        pytest.param("laplace", 30000, 200, 8, marks=pytest.mark.slow),
    ],
)
def test_tree_multiplier_is_accepted_and_one_percent_less_is_not(noise, t_max, m, nodes):
    mult, count = tree_multiplier(noise, t_max, m)
    assert count == nodes
    assert pld_epsilon(noise, mult, count, 1e-6) <= 1.0
    assert pld_epsilon(noise, 0.99 * mult, count, 1e-6) > 1.0


@pytest.mark.slow
def test_tree_calibration_gains_the_level_ratio_for_gaussian_noise():
    """Gaussian: k releases of multiplier m are one of m/√k, so the variance scales as the
    count, 15 levels vs 8 nodes; each tight multiplier lies in [exact, 1.01·exact] (the search's
    bracket), so the ratio is 15/8 within a factor 1.01²."""
    levels = psum_noise("gaussian", L_FIG2, "pm2", 1.0, 1e-6, 30000, "tight")[0]
    tree = calibrated_psum_noise("gaussian", L_FIG2, "pm2", 1.0, 1e-6, 30000, "tight-tree", 151)[0]
    assert levels / tree == pytest.approx(15 / 8, rel=1.01**2 - 1)


def test_other_calibrations_are_psum_noise_unchanged():
    for mech in ("pm1", "pm2"):
        got = calibrated_psum_noise("gaussian", L_FIG2, mech, 1.0, 1e-6, 40, "paper", 10, True)
        assert got == psum_noise("gaussian", L_FIG2, mech, 1.0, 1e-6, 40, "paper", True)
    # PM-I holds a sample in one p-sum whatever κ_max: tight-tree is tight
    assert calibrated_psum_noise(
        "gaussian", L_FIG2, "pm1", 1.0, 1e-6, 40, "tight-tree", 10
    ) == psum_noise("gaussian", L_FIG2, "pm1", 1.0, 1e-6, 40, "tight")
    with pytest.raises(ValueError, match="calibration = 'loose': must be one of"):
        calibrated_psum_noise("gaussian", L_FIG2, "pm2", 1.0, 1e-6, 30000, "loose", 151)
    with pytest.raises(ValueError, match="releases = -1"):
        nodes_per_sample(-1)


def run(params: dict, m: int, t_max: int):
    data = build(
        DATA.get("classes"), {"agents": m, "class_means": [0.2, 0.8], "sigma": 0.5}, "data"
    ).make(np.random.default_rng(0))
    cls = PROTOCOLS.get("private-colme")
    proto = cls(build(cls.Params, params, "test"))
    sim = Simulation(
        proto,
        data,
        t_max,
        Streams(0, 0, 11, 22),
        checkpoints=np.array([t_max]),
        metrics=[METRICS.get("privacy")],
    )
    wide = sim.run().metrics.pivot(index="t", columns="metric", values="value")
    return proto, wide


@pytest.mark.parametrize(
    ("variance", "nodes"), [("known", 6), pytest.param("sch-var-1", 12, marks=pytest.mark.slow)]
)
def test_a_tight_tree_run_spends_its_budget_against_one_querier(variance, nodes):
    """M = 3, t_max = 80 under RR: κ = 40 releases per pair, 6 nodes hold the first sample (12
    p-sums with Sch-Var-1's variance releases); the ledger's ε against one querier at t_max is
    the calibrated ε = 1 (the accountant's grid keeps it within 2·10⁻³ below), where "tight"
    calibrates for the 7 levels of t_max = 80."""
    proto, wide = run(
        {"mechanism": "pm2", "variance": variance, "calibration": "tight-tree"}, 3, 80
    )
    assert int(proto.mech.count.max()) == 40
    assert int(proto.privacy_spend().against["one"][1].max()) == nodes
    assert 1.0 - 2e-3 <= wide["eps_one_max"].iloc[-1] <= 1.0


def test_calibration_names_are_checked():
    cls = PROTOCOLS.get("private-colme")
    with pytest.raises(ConfigError, match="tight-tree"):
        build(cls.Params, {"calibration": "tree"}, "scenario 'x'")
