"""Closed forms of seed 002 App. A and §VI: hand values, identities, Monte Carlo, quoted tables."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from desim.models.baselines import expected_inverse_class_size, ideal_mse, local_mse
from desim.models.colme.analytic import (
    data_term,
    oracle_mse,
    oracle_mse_rrr,
    pm1_noise_term,
    pm2_noise_term,
    prefix_terms,
    rr_counts,
    rr_inverse_variances,
    rr_query_times,
    var_T,
    weights,
)
from desim.models.privacy.calibration import mechanism_budget, noise_sigma2

# ------------------------------------------------------------------------ weights


def test_weights_by_hand():
    assert weights("last", 5).tolist() == [0, 0, 0, 0, 1]
    assert weights("mom", 4).tolist() == [0.25] * 4
    assert weights("wmom", 1).tolist() == [1.0]
    assert weights("wmom", 5).tolist() == [0, 0, 0, 0.5, 0.5]
    assert weights("wmom", 7).tolist() == [0, 0, 0, 0.25, 0.25, 0.25, 0.25]
    assert weights("wmom", 8).tolist() == [0] * 7 + [1.0]


@pytest.mark.parametrize("kind", ["last", "mom", "wmom"])
def test_weights_sum_to_one(kind):
    for kappa in range(1, 130):
        w = weights(kind, kappa)
        assert len(w) == kappa and w.min() >= 0 and w.sum() == pytest.approx(1.0, rel=1e-12)


def test_weights_reject_bad_arguments():
    with pytest.raises(ValueError, match="^weights = "):
        weights("median", 3)
    with pytest.raises(ValueError, match="^kappa = "):
        weights("mom", 0)


# ----------------------------------------------------------- Var[T] by hand, small κ


def test_kappa_1():
    assert data_term([5.0], [1.0]) == pytest.approx(1 / 5)
    assert pm1_noise_term([5.0], [1.0]) == pytest.approx(1 / 25)
    assert pm2_noise_term([5.0], [1.0]) == pytest.approx(1 / 25)


def test_kappa_2_mom():
    # t = (2, 6), w = (1/2, 1/2): S₁ = 1/4 + 1/12 = 1/3, S₂ = 1/12.
    t, w = [2.0, 6.0], [0.5, 0.5]
    assert data_term(t, w) == pytest.approx(2 * (1 / 3) ** 2 + 4 * (1 / 12) ** 2)  # = 1/4
    assert data_term(t, w) == pytest.approx(0.25)
    assert pm1_noise_term(t, w) == pytest.approx(17 / 144)
    # Nodes: (0,1) = {release 1}: u₁ = 1/4; (1,1) = releases {2,3} ∩ [1,2]: u₂ = 1/12.
    assert pm2_noise_term(t, w) == pytest.approx(10 / 144)
    assert pm2_noise_term(t, w, "eq21") == pytest.approx(10 / 144)


def test_kappa_3_general_weights():
    # t = (1, 3, 4), w = (.2, .3, .5): u = (.2, .1, .125), S = (.425, .225, .125), Δt = (1, 2, 1).
    t, w = [1.0, 3.0, 4.0], [0.2, 0.3, 0.5]
    assert data_term(t, w) == pytest.approx(0.425**2 + 2 * 0.225**2 + 0.125**2)
    assert pm1_noise_term(t, w) == pytest.approx(0.425**2 + 0.225**2 + 0.125**2)
    # PM-II: Σ w_j Z_j = .2 N₀₁ + (.1 + .125) N₁₁ + .125 N₀₃ (node (1,1) reused by release 3).
    assert pm2_noise_term(t, w) == pytest.approx(0.2**2 + 0.225**2 + 0.125**2)
    assert pm2_noise_term(t, w, "eq21") == pytest.approx(0.2**2 + 0.225**2 + 0.125**2)


def test_kappa_7_eq21_adds_the_spurious_cross_term():
    # Releases 5 and 7 use different level-0 nodes, but (21) squares u₅ + u₇ together.
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.integers(1, 9, size=7)).astype(float)
    w = rng.random(7)
    w /= w.sum()
    u = w / t
    diff = pm2_noise_term(t, w, "eq21") - pm2_noise_term(t, w, "exact")
    assert diff == pytest.approx(2 * u[4] * u[6], rel=1e-9)


@pytest.mark.parametrize(
    ("kappa", "mom", "wmom"),
    [(7, 0.978, 0.928), (15, 0.942, 0.833), (31, 0.900, 0.741), (100, 0.841, 0.666)],
)
def test_pm2_exact_over_eq21_ratio_reference_table(kappa, mom, wmom):
    t = np.arange(1, kappa + 1) * 199.0
    for kind, ratio in (("mom", mom), ("wmom", wmom)):
        w = weights(kind, kappa)
        got = pm2_noise_term(t, w, "exact") / pm2_noise_term(t, w, "eq21")
        assert got == pytest.approx(ratio, abs=1e-3)  # docs/papers.md §1.4 quotes 3 decimals


# -------------------------------------------------------------------- identities


def _random_times(rng, kappa):
    return np.cumsum(rng.integers(1, 300, size=kappa)).astype(float)


def test_non_mom_closed_forms():
    rng = np.random.default_rng(4)
    for kappa in range(1, 41):
        t = _random_times(rng, kappa)
        w = weights("last", kappa)
        wh = bin(kappa).count("1")
        tk = t[-1]
        assert pm2_noise_term(t, w, "exact") == pytest.approx(wh / tk**2, rel=1e-12)
        assert pm2_noise_term(t, w, "eq21") == pytest.approx(wh / tk**2, rel=1e-12)
        # PM-I non-MoM: σ_b²/t_κ + κ σ_DP²/t_κ² (App. A).
        got = var_T(t, w, 0.25, 84.23, "pm1")
        assert got == pytest.approx(0.25 / tk + kappa * 84.23 / tk**2, rel=1e-12)


def test_mom_data_identity():
    rng = np.random.default_rng(5)
    for kappa in (1, 2, 3, 10, 57):
        t = _random_times(rng, kappa)
        i = np.arange(1, kappa + 1)
        expected = np.sum((2 * i - 1) / t) / kappa**2
        assert data_term(t, weights("mom", kappa)) == pytest.approx(expected, rel=1e-12)


def test_wmom_data_identity():
    # Uniform weights on the block [J₀, κ]: (1/n²) Σ_r (2r − 1)/t_{J₀+r−1}.
    rng = np.random.default_rng(6)
    for kappa in (5, 12, 40):
        t = _random_times(rng, kappa)
        j0 = 1 << (kappa.bit_length() - 1)
        n = kappa - j0 + 1
        r = np.arange(1, n + 1)
        expected = np.sum((2 * r - 1) / t[j0 - 1 :]) / n**2
        assert data_term(t, weights("wmom", kappa)) == pytest.approx(expected, rel=1e-12)


def test_functions_broadcast_over_leading_axes():
    rng = np.random.default_rng(7)
    t = np.stack([_random_times(rng, 9) for _ in range(4)])
    w = weights("mom", 9)
    for f in (data_term, pm1_noise_term, pm2_noise_term):
        batch = f(t, w)
        assert batch.shape == (4,)
        assert batch == pytest.approx([f(row, w) for row in t], rel=1e-12)


@pytest.mark.parametrize("kind", ["last", "mom", "wmom"])
@pytest.mark.parametrize(
    ("mechanism", "formula"), [("pm1", "exact"), ("pm2", "exact"), ("pm2", "eq21")]
)
def test_prefix_terms_match_per_kappa_formulas(kind, mechanism, formula):
    rng = np.random.default_rng(8)
    K = 70
    t = np.cumsum(rng.integers(1, 50, size=(3, K)), axis=1).astype(float)
    data, noise = prefix_terms(t, kind, mechanism, formula)
    for kappa in range(1, K + 1):
        w = weights(kind, kappa)
        ref_noise = (
            pm1_noise_term(t[:, :kappa], w)
            if mechanism == "pm1"
            else pm2_noise_term(t[:, :kappa], w, formula)
        )
        np.testing.assert_allclose(data[:, kappa - 1], data_term(t[:, :kappa], w), rtol=1e-10)
        np.testing.assert_allclose(noise[:, kappa - 1], ref_noise, rtol=1e-10)


def test_bad_times_are_rejected():
    with pytest.raises(ValueError, match="^times"):
        data_term([3.0, 2.0], [0.5, 0.5])
    with pytest.raises(ValueError, match="^formula = "):
        pm2_noise_term([1.0], [1.0], "eq22")
    with pytest.raises(ValueError, match="^mechanism = "):
        var_T([1.0], [1.0], 1.0, 1.0, "pm3")


# --------------------------------------------- Monte Carlo of the literal mechanisms

R = 200_000


def _four_se(var: float) -> float:
    return 4 * var * math.sqrt(2 / (R - 1))  # SE of a Gaussian sample variance


def _pm2_literal(rng, t, w):
    """Σ_j w_j Z^{(t_j)} with the binary counting mechanism built literally (R replicates)."""
    kappa = len(t)
    nodes: dict[tuple[int, int], np.ndarray] = {}  # (level, start) → noise, drawn once, reused
    total = np.zeros(R)
    for j in range(1, kappa + 1):
        z = np.zeros(R)
        for b in range(j.bit_length()):
            if (j >> b) & 1:
                key = (b, (j >> b) << b)
                if key not in nodes:
                    nodes[key] = rng.standard_normal(R)
                z += nodes[key]
        total += w[j - 1] * z / t[j - 1]
    return total


@pytest.mark.parametrize("kappa", [7, 12])
@pytest.mark.parametrize("kind", ["mom", "wmom"])
def test_pm2_exact_formula_matches_literal_tree(kappa, kind):
    rng = np.random.default_rng(100 + kappa)
    t = np.cumsum(rng.integers(1, 20, size=kappa)).astype(float)  # uneven gaps
    w = weights(kind, kappa)
    emp = _pm2_literal(rng, t, w).var(ddof=1)
    exact = pm2_noise_term(t, w, "exact")
    assert abs(emp - exact) < _four_se(exact)


def test_literal_tree_rejects_eq21_for_mom():
    # The test above can fail: (21) is ≈ 2% high for MoM at κ = 7, ≈ 9 SE at this R.
    rng = np.random.default_rng(200)
    t = np.arange(1, 8) * 199.0
    w = weights("mom", 7)
    emp = _pm2_literal(rng, t, w).var(ddof=1)
    eq21 = pm2_noise_term(t, w, "eq21")
    assert abs(emp - eq21) > _four_se(eq21)


def test_pm1_and_data_terms_match_literal_simulation():
    rng = np.random.default_rng(300)
    kappa = 9
    t = np.cumsum(rng.integers(1, 30, size=kappa)).astype(float)
    w = rng.random(kappa)
    w /= w.sum()
    gaps = np.diff(t, prepend=0.0)
    # PM-I: one fresh p-sum noise per release, Z^{(t_j)} = (N₁ + … + N_j)/t_j.
    noise_sums = np.cumsum(rng.standard_normal((R, kappa)), axis=1)
    emp = (noise_sums / t @ w).var(ddof=1)
    assert abs(emp - pm1_noise_term(t, w)) < _four_se(pm1_noise_term(t, w))
    # Data: running sums of unit-variance samples, seen through their Gaussian increments.
    sums = np.cumsum(rng.standard_normal((R, kappa)) * np.sqrt(gaps), axis=1)
    emp = (sums / t @ w).var(ddof=1)
    assert abs(emp - data_term(t, w)) < _four_se(data_term(t, w))


# -------------------------------------------------------------- round robin


def test_rr_query_times_and_counts():
    assert rr_query_times(5, 3, 3).tolist() == [3, 7, 11]
    assert rr_query_times(5, [1, 4], 2).tolist() == [[1, 5], [4, 8]]
    for M in (2, 5, 30):
        for ell in range(1, M):
            times = rr_query_times(M, ell, 200)
            for t in range(0, 200):
                kappa = rr_counts(M, ell, t)
                assert kappa == np.sum(times <= t)
                if t >= 1:  # the case split printed in Prop. 3
                    base, last = (t - 1) // (M - 1), (t - 1) % (M - 1) + 1
                    assert kappa == (base + 1 if ell <= last else base)


def test_rr_positions_are_validated():
    with pytest.raises(ValueError, match="^position = "):
        rr_counts(5, 5, 10)
    with pytest.raises(ValueError, match="^M = "):
        rr_counts(1, 1, 10)


# ----------------------------------------------------------------- baselines


def test_local_and_ideal_closed_forms():
    assert local_mse(3000, 0.25) == pytest.approx(0.25 / 3000)
    assert local_mse(np.array([1.0, 2.0]), [1.0, 3.0]).tolist() == [2.0, 1.0]
    assert ideal_mse(10.0, [1.0, 1.0, 4.0], [2, 2, 1]) == pytest.approx((0.5 + 0.5 + 4.0) / 30)


@pytest.mark.parametrize(("M", "classes"), [(2, 1), (15, 3), (30, 3), (200, 3), (7, 4)])
def test_expected_inverse_class_size(M, classes):
    k = np.arange(M)
    brute = np.sum(binom.pmf(k, M - 1, 1 / classes) / (1 + k))
    assert expected_inverse_class_size(M, classes) == pytest.approx(brute, rel=1e-10)


def test_ideal_values_of_reference_table():
    assert 0.25 * expected_inverse_class_size(200, 3) / 3000 == pytest.approx(1.25e-6, rel=4e-3)
    assert 0.25 * expected_inverse_class_size(30, 3) / 3000 == pytest.approx(8.3e-6, rel=6e-3)
    assert 0.25 * expected_inverse_class_size(15, 3) / 30000 == pytest.approx(1.66e-6, rel=3e-3)


# ------------------------------------------------------------- Prop. 3 oracle

L = math.sqrt(3) / 2
S2 = 0.25
G1 = noise_sigma2("gaussian", L, 1.0, 1e-6)
G2 = noise_sigma2("gaussian", L, *mechanism_budget("pm2", 1.0, 1e-6, 30000))
L1 = noise_sigma2("laplace", L, 1.0, 0.0)
L2 = noise_sigma2("laplace", L, *mechanism_budget("pm2", 1.0, 0.0, 30000))
T = np.array([3000, 30000])


def _quoted_tol(quoted: float, se: float, extra: float = 0.01) -> float:
    # docs/papers.md §1.7 quotes 3 significant digits (half a unit of the 3rd digit) from its own
    # Monte Carlo, whose error it does not state: allow `extra` (relative) for it, plus 4 of our SE.
    half_ulp = 0.5 * 10 ** (math.floor(math.log10(quoted)) - 2)
    return half_ulp + extra * quoted + 4 * se


def _check_quoted(M, s2dp, mechanism, kind, quoted, formula="exact", extra=0.01):
    mean, se = oracle_mse(T, M, 1 / 3, S2, s2dp, mechanism, kind, formula=formula, seed=1)
    for got, err, q in zip(mean, se, quoted, strict=True):
        assert abs(got - q) < _quoted_tol(q, err, extra), (got, q)


@pytest.mark.parametrize(
    ("mechanism", "kind", "formula", "quoted"),
    [
        ("pm1", "last", "exact", (3.45e-6, 3.29e-7)),
        ("pm1", "mom", "exact", (8.41e-6, 7.06e-7)),
        ("pm2", "last", "exact", (5.12e-5, 1.57e-6)),
        ("pm2", "mom", "exact", (6.36e-5, 2.76e-6)),
        ("pm2", "mom", "eq21", (6.43e-5, 3.03e-6)),
        ("pm2", "wmom", "exact", (4.40e-5, 6.82e-7)),
        ("pm2", "wmom", "eq21", (4.70e-5, 8.97e-7)),
    ],
)
def test_oracle_reference_table_M200(mechanism, kind, formula, quoted):
    _check_quoted(200, G1 if mechanism == "pm1" else G2, mechanism, kind, quoted, formula)


@pytest.mark.parametrize(
    ("mechanism", "kind", "formula", "quoted"),
    [
        ("pm1", "last", "exact", (4.78e-5, 4.76e-6)),
        ("pm1", "mom", "exact", (6.31e-5, 6.11e-6)),
        ("pm2", "last", "exact", (7.70e-5, 4.55e-6)),
        ("pm2", "mom", "exact", (8.05e-5, 6.71e-6)),
        ("pm2", "wmom", "exact", (7.27e-5, 2.94e-6)),
        ("pm2", "wmom", "eq21", (7.60e-5, 3.29e-6)),
    ],
)
def test_oracle_reference_table_M30(mechanism, kind, formula, quoted):
    _check_quoted(30, G1 if mechanism == "pm1" else G2, mechanism, kind, quoted, formula)


def test_oracle_M30_wmom_is_best_at_low_error():
    t = np.array([30000])
    values = {
        (mech, kind): oracle_mse(t, 30, 1 / 3, S2, G1 if mech == "pm1" else G2, mech, kind)[0][0]
        for mech, kind in [
            ("pm1", "last"),
            ("pm1", "mom"),
            ("pm2", "last"),
            ("pm2", "mom"),
            ("pm2", "wmom"),
        ]
    }
    assert min(values, key=values.get) == ("pm2", "wmom")


def test_oracle_M15_gaussian_and_laplace():
    t = np.array([30000])

    def exact(s2dp, mech):
        return oracle_mse(t, 15, 1 / 3, S2, s2dp, mech, "last", method="exact")[0][0]

    g1, g2, l1, l2 = exact(G1, "pm1"), exact(G2, "pm2"), exact(L1, "pm1"), exact(L2, "pm2")
    assert abs(g1 - 7.03e-6) < _quoted_tol(7.03e-6, 0.0)
    assert abs(g2 - 6.87e-6) < _quoted_tol(6.87e-6, 0.0)
    # Our values are an exact enumeration; the reference Laplace values are 1.7–1.9% lower,
    # consistent with a plain Monte Carlo whose relative spread is larger for Laplace (small
    # noise, so 1/e tracks the random class size). Hence the wider 3% allowance there.
    assert abs(l1 - 3.21e-6) < _quoted_tol(3.21e-6, 0.0, extra=0.03)
    assert abs(l2 - 2.85e-6) < _quoted_tol(2.85e-6, 0.0, extra=0.03)
    # The claims: PM-II beats PM-I at low error, Laplace beats Gaussian (§VII claims 10, 11).
    assert g2 < g1 and l2 < l1 and l1 < g1 and l2 < g2


@pytest.mark.parametrize(
    ("mechanism", "kind", "s2dp"),
    [("pm1", "last", 84.23), ("pm1", "mom", 6.0), ("pm2", "wmom", 1350.0), ("pm2", "last", 500.0)],
)
def test_oracle_exact_and_montecarlo_agree(mechanism, kind, s2dp):
    t = np.array([1, 5, 11, 12, 40, 333, 2000])
    exact, zero = oracle_mse(t, 12, 0.3, S2, s2dp, mechanism, kind, method="exact")
    assert np.all(zero == 0)
    mc, se = oracle_mse(t, 12, 0.3, S2, s2dp, mechanism, kind, n_draws=4000, seed=11)
    assert np.all(se > 0)
    assert np.all(np.abs(mc - exact) < 4 * se + 1e-12 * exact)


def _direct_all_classmates(t, M, s2dp, mechanism, kind):
    """1/e with every other agent a class-mate, from `var_T` release by release."""
    e = t / S2
    for ell in range(1, M):
        kappa = int(rr_counts(M, ell, t))
        if kappa:
            times = rr_query_times(M, ell, kappa)
            e += 1 / var_T(times, weights(kind, kappa), S2, s2dp, mechanism)
    return 1 / e


@pytest.mark.parametrize("kind", ["last", "mom", "wmom"])
@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
def test_oracle_limits_p0_and_p1(kind, mechanism):
    t = np.array([1, 7, 8, 50, 777])
    for method in ("exact", "montecarlo"):
        mean, se = oracle_mse(t, 9, 0.0, S2, 100.0, mechanism, kind, method=method)
        np.testing.assert_allclose(mean, S2 / t, rtol=1e-12)
        mean, se = oracle_mse(t, 9, 1.0, S2, 100.0, mechanism, kind, method=method)
        direct = [_direct_all_classmates(tt, 9, 100.0, mechanism, kind) for tt in t]
        np.testing.assert_allclose(mean, direct, rtol=1e-10)
        np.testing.assert_allclose(se, 0.0, atol=0)
    # With everyone a class-mate, rRR queries exactly as RR does (Remark 3 reduces to Prop. 3).
    rrr, _ = oracle_mse_rrr(t, 9, 1.0, S2, 100.0, mechanism, kind)
    np.testing.assert_allclose(rrr, direct, rtol=1e-10)


def test_rrr_against_brute_force_sum_over_class_sizes():
    t = np.array([3, 20, 400])
    M, p = 8, 0.4
    got, _ = oracle_mse_rrr(t, M, p, S2, 50.0, "pm2", "mom")
    expected = np.zeros(len(t))
    for k in range(M):
        for i, tt in enumerate(t):
            expected[i] += binom.pmf(k, M - 1, p) * (
                S2 / tt if k == 0 else _direct_all_classmates(tt, k + 1, 50.0, "pm2", "mom")
            )
    np.testing.assert_allclose(got, expected, rtol=1e-10)


def test_oracle_per_class_variances_average_classes():
    t = np.array([10, 100])
    a, _ = oracle_mse(t, 6, 0.5, 0.1, 5.0, "pm1", "last", method="exact")
    b, _ = oracle_mse(t, 6, 0.5, 0.3, 5.0, "pm1", "last", method="exact")
    both, _ = oracle_mse(t, 6, 0.5, [0.1, 0.3], 5.0, "pm1", "last", method="exact")
    np.testing.assert_allclose(both, (a + b) / 2, rtol=1e-12)


def test_oracle_is_reproducible_and_validates():
    t = np.array([100, 1000])
    a = oracle_mse(t, 50, 1 / 3, S2, G1, "pm1", "last", n_draws=500, seed=5)
    b = oracle_mse(t, 50, 1 / 3, S2, G1, "pm1", "last", n_draws=500, seed=5)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    with pytest.raises(ValueError, match="^method = 'exact'"):
        oracle_mse(t, 22, 1 / 3, S2, G1, "pm1", "last", method="exact")
    with pytest.raises(ValueError, match="^t = "):
        oracle_mse(np.array([0, 5]), 10, 1 / 3, S2, G1, "pm1", "last")
    with pytest.raises(ValueError, match="^p = "):
        oracle_mse(t, 10, 1.5, S2, G1, "pm1", "last")


def test_inverse_variances_zero_before_first_release():
    inv = rr_inverse_variances(np.array([1, 3]), 6, S2, 10.0, "pm1", "last")
    assert inv.shape == (2, 5)
    assert np.all(inv[0, 1:] == 0) and inv[0, 0] > 0
    assert np.all(inv[1, :3] > 0) and np.all(inv[1, 3:] == 0)
