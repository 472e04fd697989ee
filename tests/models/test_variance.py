"""Unknown-variance maths of seed 002 (§III-C2, §V): hand values, Lemmas 6–7 by Monte Carlo,
the Bayesian posterior mean (19) against numerical integration."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from desim.models.colme.analytic import data_term, noise_term, var_T, weights
from desim.models.colme.variance import (
    bayes_posterior_mean,
    combination_weights,
    dyadic_split,
    negative_to_inf,
    noise_counts,
    plug_in_var_T,
    posterior_shape,
    release_split,
    sample_variance,
    schvar1_release,
    schvar2_bayes,
    schvar2_eq16,
    schvar2_estimate,
    schvar2_raw_and_K,
    welch_dof,
    welch_threshold,
)
from desim.models.privacy.calibration import gaussian_sigma2, variance_sigma2

SIGMA = 0.5
SIGMA2 = SIGMA**2
L = SIGMA * math.sqrt(3)  # uniform on [μ − L, μ + L] has variance σ²
MU = 0.8  # non-zero so that (16)'s bias with unequal gaps shows
EPS, DELTA = 1.0, 1e-6
S2DP = gaussian_sigma2(L, EPS, DELTA)  # 84.23
S2DP_VAR = variance_sigma2(L, EPS, DELTA, "gaussian")  # 252.7


def _uniform(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(MU - L, MU + L, shape)


def _assert_mean(samples: np.ndarray, target: float, n_se: float = 4.0) -> float:
    """Assert |mean − target| < n_se · SE of the Monte Carlo mean; return the mean."""
    m = float(np.mean(samples))
    se = float(np.std(samples, ddof=1)) / math.sqrt(samples.size)
    assert abs(m - target) < n_se * se, f"mean {m:.5f} vs {target:.5f}, SE {se:.5f}"
    return m


def _psums(rng: np.random.Generator, reps: int, lengths: np.ndarray) -> np.ndarray:
    """(reps, k) exact p-sums S_i of d_i uniform samples each."""
    return np.stack([_uniform(rng, (reps, int(d))).sum(axis=1) for d in lengths], axis=1)


# ------------------------------------------------------------ own sample variance


def test_sample_variance_matches_numpy_ddof1():
    rng = np.random.default_rng(1)
    x = rng.normal(3.0, 2.0, (7, 25))
    for t in (2, 3, 10, 25):
        got = sample_variance(x[:, :t].sum(1), (x[:, :t] ** 2).sum(1), t)
        np.testing.assert_allclose(got, np.var(x[:, :t], axis=1, ddof=1), rtol=1e-10)
    assert sample_variance(3.0, 9.0, 1) == math.inf
    assert sample_variance(0.0, 0.0, 0) == math.inf
    # (Σx² − t x̄²)/(t−1) by hand: x = 1, 2, 4 → (21 − 49/3)/2 = 7/3.
    assert sample_variance(7.0, 21.0, 3) == pytest.approx(7 / 3, rel=1e-14)


# ------------------------------------------------------------------- Welch test


def test_welch_dof_by_hand():
    # A = V_a/t = 2/10 = 0.2, B = 0.3, t−1 = 9, n_other−1 = 4:
    # ν = 0.5²/(0.04/9 + 0.09/4) = 0.25·36/(0.16 + 0.81) = 9/0.97 = 900/97 ≈ 9.278.
    assert welch_dof(2.0, 10, 0.3, 5) == pytest.approx(900 / 97, rel=1e-14)
    # Equal terms with equal counts n: ν = 4A²/(2A²/(n−1)) = 2(n−1).
    assert welch_dof(1.1, 11, 0.1, 11) == pytest.approx(20.0, rel=1e-13)
    # Lies between min(n1, n2) − 1 and n1 + n2 − 2.
    rng = np.random.default_rng(2)
    v, b = rng.exponential(1, 50), rng.exponential(0.1, 50)
    nu = welch_dof(v, 30, b, 8)
    assert np.all(nu >= 7 - 1e-12) and np.all(nu <= 36 + 1e-12)


def test_welch_dof_limits():
    assert welch_dof(1.0, 20, math.inf, 9) == 8  # B → ∞: n_other − 1
    assert welch_dof(math.inf, 20, 0.3, 9) == 19  # A → ∞: t − 1
    assert welch_dof(math.inf, 20, math.inf, 9) == 8  # indeterminate: Welch lower bound
    assert welch_dof(0.0, 20, 0.0, 9) == 8
    assert welch_dof(1.0, 20, 0.5, 1) == 0.0  # one release: no degrees of freedom


def test_welch_threshold_matches_scipy():
    for theta in (0.05, 0.01, 0.05 / math.log(1001)):
        for nu in (0.5, 1, 2.5, 9.278, 40, 1e4):
            assert welch_threshold(theta, nu) == pytest.approx(
                stats.t.ppf(1 - theta / 2, nu), rel=1e-10
            )
        assert welch_threshold(theta, math.inf) == pytest.approx(
            stats.norm.ppf(1 - theta / 2), rel=1e-12
        )
    assert welch_threshold(0.05, 0.0) == math.inf
    got = welch_threshold(np.array([0.05, 0.1]), np.array([[3.0], [math.inf]]))
    assert got.shape == (2, 2)
    assert got[1, 0] == pytest.approx(1.959963984540054, rel=1e-12)


# ---------------------------------------------------------- plug-in and weights


def test_plug_in_var_T_by_hand_and_against_analytic():
    assert plug_in_var_T(0.5, 0.1, 0.002, 84.0) == pytest.approx(0.05 + 0.168, rel=1e-14)
    assert plug_in_var_T(math.inf, 0.1, 0.002, 84.0) == math.inf
    assert plug_in_var_T(math.nan, 0.1, 0.002, 84.0) == math.inf
    got = plug_in_var_T(np.array([0.5, math.inf]), 0.1, 0.0, 84.0)
    assert got.tolist() == [pytest.approx(0.05), math.inf]
    # With V_{b→a} = σ_b² it is exactly Var[T] of (2).
    times = np.array([3.0, 22.0, 41.0, 60.0, 79.0])
    for kind in ("last", "mom", "wmom"):
        w = weights(kind, times.size)
        for mech in ("pm1", "pm2"):
            ref = var_T(times, w, SIGMA2, S2DP, mech)
            got = plug_in_var_T(SIGMA2, data_term(times, w), noise_term(times, w, mech), S2DP)
            assert got == pytest.approx(ref, rel=1e-13)


def test_negative_to_inf():
    assert negative_to_inf(np.array([-0.1, 0.0, 0.3, math.nan])).tolist() == [
        math.inf,
        0.0,
        0.3,
        math.inf,
    ]


def test_combination_weights_by_hand():
    t = 10
    v_own = np.array([1.0, 2.0, 4.0])
    var = np.array([[9.9, 0.2, 0.5], [0.1, 9.9, math.inf], [0.25, 0.5, 9.9]])
    inc = np.array([[True, True, True], [True, True, True], [False, True, True]])
    a_self, a_oth = combination_weights(t, v_own, var, inc)
    # Row 0: precisions 10/1 = 10, 1/0.2 = 5, 1/0.5 = 2 → /17.
    np.testing.assert_allclose([a_self[0], *a_oth[0, 1:]], [10 / 17, 5 / 17, 2 / 17])
    # Row 1: 10/2 = 5, 1/0.1 = 10, +∞ variance → 0 → /15.
    np.testing.assert_allclose([a_self[1], a_oth[1, 0], a_oth[1, 2]], [1 / 3, 2 / 3, 0])
    # Row 2: agent 0 excluded; 10/4 = 2.5, 1/0.5 = 2 → /4.5.
    np.testing.assert_allclose([a_self[2], *a_oth[2, :2]], [2.5 / 4.5, 0, 2 / 4.5])
    np.testing.assert_allclose(a_self + a_oth.sum(1), 1.0)
    assert np.all(np.diag(a_oth) == 0)


def test_combination_weights_degenerate_rows_and_batch():
    inf = math.inf
    var = np.full((2, 2), inf)
    a_self, a_oth = combination_weights(1, [inf, 1.0], var, np.ones((2, 2), bool))
    assert a_self.tolist() == [1.0, 1.0] and np.all(a_oth == 0)  # nothing usable: own mean
    a_self, a_oth = combination_weights(
        5, [1.0, 1.0], np.array([[0, 0.0], [1, 0]]), np.ones((2, 2), bool)
    )
    assert a_self[0] == 0 and a_oth[0, 1] == 1  # zero variance takes everything
    rng = np.random.default_rng(3)
    v = rng.exponential(1, (4, 5))
    var_b = rng.exponential(1, (4, 5, 5))
    inc = rng.random((4, 5, 5)) < 0.6
    a_self, a_oth = combination_weights(np.arange(1, 5)[:, None], v, var_b, inc)
    for r in range(4):
        s1, o1 = combination_weights(r + 1, v[r], var_b[r], inc[r])
        np.testing.assert_allclose(a_self[r], s1)
        np.testing.assert_allclose(a_oth[r], o1)


# -------------------------------------------------------------------- splits


def test_dyadic_split_and_release_split():
    assert dyadic_split(1) == [(1, 1)]
    assert dyadic_split(8) == [(1, 8)]
    assert dyadic_split(11) == [(1, 8), (9, 10), (11, 11)]
    assert dyadic_split(7) == [(1, 4), (5, 6), (7, 7)]
    for kappa in range(1, 200):
        nodes = dyadic_split(kappa)
        assert len(nodes) == bin(kappa).count("1")
        assert nodes[0][0] == 1 and nodes[-1][1] == kappa
        assert all(b[0] == a[1] + 1 for a, b in zip(nodes, nodes[1:], strict=False))
        for start, end in nodes:  # node (s, m), m odd: [(m−1)2^s + 1, m2^s]
            size = end - start + 1
            assert size & (size - 1) == 0 and (end // size) % 2 == 1
    times = np.array([3, 8, 13, 18, 23, 28, 33, 38, 43, 48, 53])
    assert release_split(times, "pm1").tolist() == times.tolist()
    assert release_split(times, "pm2").tolist() == [38, 48, 53]


def _node_incidence(kmax: int) -> tuple[list[tuple[int, int]], np.ndarray]:
    """All PM-II nodes used by releases 1..kmax and the (kmax, n_nodes) 0/1 usage matrix."""
    nodes = sorted({n for k in range(1, kmax + 1) for n in dyadic_split(k)})
    col = {n: i for i, n in enumerate(nodes)}
    B = np.zeros((kmax, len(nodes)))
    for k in range(1, kmax + 1):
        for n in dyadic_split(k):
            B[k - 1, col[n]] = 1
    return nodes, B


def test_noise_counts_match_the_pm2_node_construction():
    # Z(i) = Σ of the node noises of release i, reused across releases; N_i = Z(i) − Z(i−1).
    kmax = 70
    _, B = _node_incidence(kmax)
    inc = np.diff(np.vstack([np.zeros(B.shape[1]), B]), axis=0)
    for k in (2, 3, 7, 8, 12, 64, 70):
        c, c_tot = noise_counts(k, "pm2")
        np.testing.assert_array_equal(c, (inc[:k] ** 2).sum(1))  # Var N_i / σ_DP²
        assert c_tot == B[k - 1].sum()  # Var Z(k) / σ_DP² = w_H(k)
        c1, t1 = noise_counts(k, "pm1")
        assert c1.tolist() == [1.0] * k and t1 == k


# ----------------------------------------------------------- Sch-Var-1 (Lemma 6)


def _schvar1_literal(x, taus, Z, W, s2):
    """(6), (7), (8) transcribed term by term, one replicate."""
    t = taus[-1]
    bounds = [0, *taus]
    vtt = []
    for i in range(len(taus)):
        seg = x[bounds[i] : bounds[i + 1]]
        d = len(seg)
        v_tilde = np.sum(seg**2) - np.sum(seg) ** 2 / d + (d - 1) / d * W[i]  # (6)
        vtt.append(v_tilde + (np.sum(seg) + Z[i]) ** 2 / d)  # (7)
    xbar, zt = np.mean(x[:t]), np.sum(Z) / t  # Z^{(t)} = (1/t)Σ Z_i
    dd = np.diff(bounds)
    return (
        np.sum(vtt) / (t - 1)
        - t / (t - 1) * (xbar + zt) ** 2
        - s2 / (t - 1) * (np.sum(1 / dd) - len(taus) / t)
    )  # (8)


def _schvar1_decomposition(x, taus, Z, W, s2):
    """V_b^{(t)} + U as in (9)–(15)."""
    t = taus[-1]
    bounds = [0, *taus]
    dd = np.diff(bounds)
    S = np.array([np.sum(x[bounds[i] : bounds[i + 1]]) for i in range(len(taus))])
    xbar = np.mean(x[:t])
    return (
        np.var(x[:t], ddof=1)  # (9)
        + np.sum(Z**2 / dd) / (t - 1)  # (10)
        + np.sum((dd - 1) / dd * W) / (t - 1)  # (11)
        + 2 / (t - 1) * np.sum(Z * S / dd)  # (12)
        - 2 / (t - 1) * xbar * np.sum(Z)  # (13)
        - np.sum(Z) ** 2 / (t * (t - 1))  # (14)
        - s2 / (t - 1) * (np.sum(1 / dd) - len(taus) / t)  # (15)
    )


SPLITS = {
    "equal": np.array([10, 20, 30, 40]),
    "unequal": np.array([1, 3, 10, 11, 25, 40]),
    "pm1-rr": release_split(np.array([7, 26, 45]), "pm1"),  # first gap ℓ_b = 7, then M−1 = 19
    "pm2-dyadic": release_split(3 + 4 * np.arange(11), "pm2"),  # κ = 11: t_8, t_10, t_11
    "single": np.array([30]),
}


def test_schvar1_matches_literal_equations_and_decomposition():
    rng = np.random.default_rng(4)
    for taus in SPLITS.values():
        k, t = taus.size, int(taus[-1])
        x = _uniform(rng, (5, t + 3))
        Z = rng.normal(0, math.sqrt(S2DP), (5, k))
        W = rng.normal(0, math.sqrt(S2DP_VAR), (5, k))
        got = schvar1_release(x, taus, Z, W, S2DP)
        for r in range(5):
            assert got[r] == pytest.approx(_schvar1_literal(x[r], taus, Z[r], W[r], S2DP))
            assert got[r] == pytest.approx(_schvar1_decomposition(x[r], taus, Z[r], W[r], S2DP))
        # Without noise it is the plain sample variance, whatever the split.
        zero = np.zeros((5, k))
        np.testing.assert_allclose(
            schvar1_release(x, taus, zero, zero, 0.0), np.var(x[:, :t], axis=1, ddof=1)
        )
    assert schvar1_release(np.ones(5), np.array([1]), [0.0], [0.0], S2DP) == math.inf


@pytest.mark.parametrize("name", list(SPLITS))
def test_lemma6_schvar1_is_unbiased(name):
    taus = SPLITS[name]
    rng = np.random.default_rng(60 + list(SPLITS).index(name))
    reps, k, t = 100_000, taus.size, int(taus[-1])
    x = _uniform(rng, (reps, t))
    Z = rng.normal(0, math.sqrt(S2DP), (reps, k))
    W = rng.normal(0, math.sqrt(S2DP_VAR), (reps, k))
    v = schvar1_release(x, taus, Z, W, S2DP)
    _assert_mean(v, SIGMA2)
    # Sensitivity: the mean of the squared-noise terms (10) + (14) that (15) removes is large
    # against the standard error, so dropping (15) would fail the test.
    se = np.std(v, ddof=1) / math.sqrt(reps)
    correction = S2DP / (t - 1) * (np.sum(1 / np.diff([0, *taus])) - k / t)
    assert correction > 8 * se or k == 1


def test_schvar1_pm2_nodes_reused_across_releases():
    # Each release of PM-II reuses its nodes' Z and W; every release is unbiased on its own.
    rng = np.random.default_rng(7)
    reps, kmax = 60_000, 12
    times = 2 + 3 * np.arange(kmax)
    nodes, B = _node_incidence(kmax)
    x = _uniform(rng, (reps, int(times[-1])))
    Zn = rng.normal(0, math.sqrt(S2DP), (reps, len(nodes)))
    Wn = rng.normal(0, math.sqrt(S2DP_VAR), (reps, len(nodes)))
    col = {n: i for i, n in enumerate(nodes)}
    for kappa in (5, 8, 11, 12):
        cols = [col[n] for n in dyadic_split(kappa)]
        taus = release_split(times[:kappa], "pm2")
        v = schvar1_release(x, taus, Zn[:, cols], Wn[:, cols], S2DP)
        _assert_mean(v, SIGMA2)
        # The mean release's noise Z^{(t)} = ΣZ_i/t has variance w_H(κ)σ_DP²/t² (§IV).
        assert B[kappa - 1].sum() == len(cols) == bin(kappa).count("1")


# ----------------------------------------------------------- Sch-Var-2 (Lemma 7)


def test_schvar2_general_form_reduces_to_eq16_with_equal_gaps():
    rng = np.random.default_rng(8)
    d = np.full(6, 19.0)
    P = _psums(rng, 4, d) + rng.normal(0, math.sqrt(S2DP), (4, 6))
    np.testing.assert_allclose(schvar2_estimate(P, d, S2DP), schvar2_eq16(P, d, S2DP))
    v_raw, K = schvar2_raw_and_K(P, d)
    np.testing.assert_allclose(K, 1 / 19)  # K^{(κ)} = 1/(M−1) of §V-B1
    # V' is the sample variance of Y + Z̃ = P/√d, and the two-pass form equals the printed one.
    np.testing.assert_allclose(v_raw, np.var(P / np.sqrt(d), axis=1, ddof=1))
    d2 = np.array([3.0, 10, 4, 30])
    P2 = P[:, :4]
    printed = ((P2**2 / d2).sum(1) - P2.sum(1) ** 2 / d2.sum()) / 3
    np.testing.assert_allclose(schvar2_raw_and_K(P2, d2)[0], printed)
    assert schvar2_estimate(P[:, :1], d[:1], S2DP).tolist() == [math.inf] * 4


def test_lemma7_pm1_equal_gaps_unbiased():
    rng = np.random.default_rng(9)
    reps, d = 100_000, np.full(6, 20)
    P = _psums(rng, reps, d) + rng.normal(0, math.sqrt(S2DP), (reps, 6))
    _assert_mean(schvar2_estimate(P, d, S2DP, "pm1"), SIGMA2)
    v_raw, K = schvar2_raw_and_K(P, d, "pm1")
    _assert_mean(v_raw, SIGMA2 + K[0] * S2DP)  # E[V'] = σ² + Kσ_DP²


def test_lemma7_pm1_unequal_gaps_general_form_unbiased_but_eq16_biased():
    # RR-like gaps with an unequal first gap ℓ_b = 7 and a few longer ones.
    rng = np.random.default_rng(10)
    reps, d = 100_000, np.array([7, 19, 19, 40, 60, 90])
    P = _psums(rng, reps, d) + rng.normal(0, math.sqrt(S2DP), (reps, d.size))
    _assert_mean(schvar2_estimate(P, d, S2DP, "pm1"), SIGMA2)
    # (16) as printed: E = σ² + μ²·s²(√d_i), because E[P_i/√d_i] = √d_i μ differs between i.
    v16 = schvar2_eq16(P, d, S2DP)
    bias = MU**2 * np.var(np.sqrt(d), ddof=1)
    _assert_mean(v16, SIGMA2 + bias)
    se = np.std(v16, ddof=1) / math.sqrt(reps)
    assert bias > 20 * se


def test_lemma7_pm2_increments_unbiased():
    # Simulate PM-II literally: node noises reused; a sees R_i = (S(t_i) + Z(i))/t_i and
    # differences consecutive releases, P_i = t_i R_i − t_{i−1} R_{i−1} = S_i + Z(i) − Z(i−1).
    rng = np.random.default_rng(11)
    reps, kmax = 100_000, 12
    times = 5 + 15 * np.arange(kmax)  # RR with ℓ_b = 5, M − 1 = 15
    d = np.diff(np.concatenate(([0], times)))
    _, B = _node_incidence(kmax)
    Zn = rng.normal(0, math.sqrt(S2DP), (reps, B.shape[1]))
    Zrel = Zn @ B.T  # (reps, kmax): Z(i)
    S = _psums(rng, reps, d)
    R = (np.cumsum(S, axis=1) + Zrel) / times
    tr = R * times
    P = np.diff(np.concatenate((np.zeros((reps, 1)), tr), axis=1), axis=1)
    v2 = schvar2_estimate(P, d, S2DP, "pm2")
    _assert_mean(v2, SIGMA2)
    # Treating the increments as PM-I p-sums ignores the extra noise of the lsb nodes.
    v1 = schvar2_estimate(P, d, S2DP, "pm1")
    K1, K2 = schvar2_raw_and_K(P[:1], d, "pm1")[1], schvar2_raw_and_K(P[:1], d, "pm2")[1]
    m1 = _assert_mean(v1, SIGMA2 + float((K2 - K1)[0]) * S2DP)
    assert abs(m1 - SIGMA2) > 20 * np.std(v1, ddof=1) / math.sqrt(reps)
    # Explicit counts reproduce the mechanism shortcut.
    c, c_tot = noise_counts(kmax, "pm2")
    np.testing.assert_allclose(schvar2_estimate(P[:3], d, S2DP, counts=(c, c_tot)), v2[:3])


# ------------------------------------------------------------ Bayesian fix (19)


def _posterior_mean_quad(v_raw: float, c: float, kappa: int, a: float) -> float:
    """E[σ²] under p(σ²) ∝ (σ²+c)^{−a−1} e^{−β/(σ²+c)}, σ² ≥ 0, by quadrature in w = ln(σ²+c)."""
    beta = (kappa - 1) * v_raw / 2
    w0 = math.log(c)
    w_peak = max(w0, math.log(beta / a) if beta > 0 else w0)

    def logp(w):  # log of s^{−a−1}e^{−β/s}·s (ds = s dw), shifted by its peak
        return -a * w - beta * math.exp(-w) - (-a * w_peak - beta * math.exp(-w_peak))

    width = 1 / math.sqrt(a)
    hi = w_peak + 60 / (a - 1) + 40 * width
    pts = [p for p in (w_peak, w_peak + width, w_peak + 5 * width) if w0 < p < hi]
    opts = dict(limit=400, epsabs=0, epsrel=1e-12, points=pts)
    norm = integrate.quad(lambda w: math.exp(logp(w)), w0, hi, **opts)[0]
    first = integrate.quad(lambda w: (math.exp(w) - c) * math.exp(logp(w)), w0, hi, **opts)[0]
    return first / norm


BAYES_CASES = [
    # (kappa, V', c = Kσ_DP², prior)
    (5, 1.0, 0.5, "paper"),
    (20, 0.3, 1.2, "paper"),
    (20, 0.3, 1.2, "jeffreys"),
    (9, 0.3, 1.2, "uniform"),
    (6, 2.0, 0.1, "uniform"),
    (2, 0.5, 4.2, "paper"),
    (2, 0.5, 4.2, "jeffreys"),
    (100, 1e-6, 8.4, "paper"),  # V' tiny: essentially c/(a−1)
    (50, 50.0, 1.0, "paper"),  # V' large: essentially the untruncated β/(a−1) − c
    (400, 3.0, 4.2, "jeffreys"),  # x = 142.5 < a = 200.5 (series branch)
    (400, 6.0, 4.2, "jeffreys"),  # x = 285 > a (incomplete-gamma branch)
    (401, 4.2 * 201 * 2 / 400, 4.2, "paper"),  # x = a exactly (branch boundary)
    (3000, 0.5, 1.0, "paper"),  # x ≪ a with a large: P(a, x) underflows
]


@pytest.mark.parametrize(("kappa", "v_raw", "c", "prior"), BAYES_CASES)
def test_bayes_posterior_mean_matches_quadrature(kappa, v_raw, c, prior):
    a = posterior_shape(kappa, prior)
    got = bayes_posterior_mean(v_raw, c, kappa, prior)
    ref = _posterior_mean_quad(v_raw, c, kappa, a)
    assert got == pytest.approx(ref, rel=1e-7)
    assert got > 0


def test_bayes_posterior_mean_limits():
    c = 84.23 / 199
    for kappa, prior in ((2, "paper"), (20, "jeffreys"), (9, "uniform"), (5000, "paper")):
        a = posterior_shape(kappa, prior)
        assert bayes_posterior_mean(0.0, c, kappa, prior) == pytest.approx(c / (a - 1), rel=1e-13)
        assert bayes_posterior_mean(1e-12, c, kappa, prior) == pytest.approx(c / (a - 1), rel=1e-6)
        # Far above the truncation: the inverse-gamma mean β/(a−1) − c.
        v = 1e4
        assert bayes_posterior_mean(v, c, kappa, prior) == pytest.approx(
            (kappa - 1) * v / 2 / (a - 1) - c, rel=1e-12
        )
    # No DP noise (c = 0): no truncation.
    assert bayes_posterior_mean(2.0, 0.0, 10, "paper") == pytest.approx(9 * 2.0 / 2 / 5)
    # Mean diverges for a ≤ 1 (uniform prior with κ ≤ 4).
    assert bayes_posterior_mean([1.0, 1.0, 1.0], c, [2, 3, 4], "uniform").tolist() == [math.inf] * 3
    assert posterior_shape(10, "paper") == 6 and posterior_shape(10, "jeffreys") == 5.5
    assert posterior_shape(10, "uniform") == 4


def test_bayes_posterior_mean_continuous_and_increasing():
    c, kappa = 0.4, 60
    a = posterior_shape(kappa)
    x = np.concatenate((np.geomspace(1e-8, 1e4, 400), a * (1 + np.array([-1e-9, 0, 1e-9]))))
    x.sort()
    m = bayes_posterior_mean(x * c * 2 / (kappa - 1), c, kappa)
    assert np.all(np.diff(m) >= -1e-12 * m[1:]) and np.all(m > 0)
    i = np.searchsorted(x, a)
    assert m[i - 1] == pytest.approx(m[i + 1], rel=1e-7)  # across the branch switch


def test_schvar2_bayes_rule_19():
    c, kappa = 0.5, 12
    v_raw = np.array([1.0, 0.2, 0.5, math.inf])
    v = v_raw - c
    got = schvar2_bayes(v, v_raw, c, np.array([kappa, kappa, kappa, 1]))
    assert got[0] == 0.5 and got[2] == 0.0 and got[3] == math.inf
    assert got[1] == pytest.approx(bayes_posterior_mean(0.2, c, kappa))
    assert 0 < got[1] < c


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: sample_variance(1.0, 1.0, -1), "t"),
        (lambda: welch_dof(-1.0, 5, 0.1, 3), "v_own"),
        (lambda: welch_dof(1.0, 0, 0.1, 3), "t"),
        (lambda: welch_dof(1.0, 5, math.nan, 3), "var_T"),
        (lambda: welch_dof(1.0, 5, 0.1, 0), "n_other"),
        (lambda: welch_threshold(0.0, 3), "theta"),
        (lambda: welch_threshold(0.05, -1), "nu"),
        (lambda: plug_in_var_T(-0.1, 0.1, 0.1, 1.0), "v_b"),
        (lambda: plug_in_var_T(0.1, 0.1, 0.1, -1.0), "sigma2_dp"),
        (lambda: combination_weights(3, [1.0, -1.0], np.ones((2, 2)), np.ones((2, 2))), "v_own"),
        (lambda: combination_weights(3, [1.0, 1.0], np.ones((3, 3)), np.ones((3, 3))), "var_T"),
        (lambda: dyadic_split(0), "kappa"),
        (lambda: release_split([3, 2], "pm1"), "times"),
        (lambda: release_split([1, 2], "pm3"), "mechanism"),
        (lambda: schvar1_release(np.ones(5), np.array([3, 3]), [0, 0], [0, 0], 1.0), "taus"),
        (lambda: schvar1_release(np.ones(5), np.array([2, 9]), [0, 0], [0, 0], 1.0), "x"),
        (lambda: schvar1_release(np.ones(5), np.array([2, 4]), [0], [0, 0], 1.0), "Z"),
        (lambda: noise_counts(0, "pm1"), "k"),
        (lambda: schvar2_estimate([1.0, 2.0], [1.0, 0.0], 1.0), "lengths"),
        (lambda: schvar2_estimate([1.0, 2.0], [1.0, 1.0], 1.0, "pm9"), "mechanism"),
        (lambda: bayes_posterior_mean(-1.0, 1.0, 5), "v_raw"),
        (lambda: bayes_posterior_mean(1.0, -1.0, 5), "K_sigma2"),
        (lambda: bayes_posterior_mean(1.0, 1.0, 1), "kappa"),
        (lambda: bayes_posterior_mean(1.0, 1.0, 5, "flat"), "prior"),
    ],
)
def test_invalid_arguments_raise_naming_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()
