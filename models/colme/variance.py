"""Reference maths of Private-ColME with unknown data variance (seed 002 §III-C2 and §V).

Pure, non-incremental versions of everything agent a needs when σ_b² is unknown: its own sample
variance V_a^{(t)}, the Welch–Satterthwaite test of §III-C2, the inverse-variance weights (5),
the Sch-Var-1 release (6)–(8) of Lemma 6, the Sch-Var-2 estimator of Lemma 7 in a general form
that stays unbiased with unequal p-sum lengths and under PM-II, and the Bayesian fix (19).

Notation (seed 002): κ releases from b to a at query times t_1 < … < t_κ (t_0 = 0); a p-sum
split τ_0 = 0 < τ_1 < … < τ_k = t with lengths d_i = τ_i − τ_{i−1}; σ_DP² is the variance of
the noise on one p-sum (Lemmas 1–2) and σ_{2,DP}² that on one partial sample variance (Lemma 3).
Functions broadcast over leading axes; the split or release index runs along the last axis.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from desim.models.privacy.bits import lowest_set_bit, popcount

# scipy.special (slow to import) is imported inside the functions that use it: loading the
# plug-ins imports this module for every run, whatever its protocol.

Mechanism = Literal["pm1", "pm2"]
Prior = Literal["paper", "jeffreys", "uniform"]

MECHANISMS: tuple[str, ...] = ("pm1", "pm2")
PRIORS: tuple[str, ...] = ("paper", "jeffreys", "uniform")


def _out(x: np.ndarray) -> float | np.ndarray:
    return float(x) if np.ndim(x) == 0 else x


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} = {value!r}: must be one of {', '.join(allowed)}")


def _nonneg(name: str, value: ArrayLike, allow_inf: bool = True) -> np.ndarray:
    x = np.asarray(value, dtype=float)
    ok = (x >= 0) if allow_inf else ((x >= 0) & np.isfinite(x))
    if not np.all(ok):
        bad = x[~ok] if x.ndim else x
        what = "≥ 0" if allow_inf else "finite and ≥ 0"
        raise ValueError(f"{name} = {np.ravel(bad)[0]!r}: must be {what} (no NaN)")
    return x


def _at_least(name: str, value: ArrayLike, low: float) -> np.ndarray:
    x = np.asarray(value, dtype=float)
    if not x.min(initial=low) >= low:  # NaN fails too
        raise ValueError(f"{name} = {value!r}: must be ≥ {low:g} (no NaN)")
    return x


# ------------------------------------------------------------------ agent a's own side


def sample_variance(sum_x: ArrayLike, sum_x2: ArrayLike, t: ArrayLike) -> float | np.ndarray:
    """V_a^{(t)} = (Σx² − t·x̄²)/(t−1) of §III-C2 from running sums; +∞ when t < 2.

    Round-off below 0 (the exact value is ≥ 0) is clipped to 0.
    """
    n = np.asarray(t, dtype=float)
    if not n.min(initial=0.0) >= 0:  # one reduction: this runs once per slot
        raise ValueError(f"t = {t!r}: must be ≥ 0 (no NaN)")
    s1 = np.asarray(sum_x, dtype=float)
    s2 = np.asarray(sum_x2, dtype=float)
    v = np.maximum((s2 - s1 * s1 / np.maximum(n, 1.0)) / np.maximum(n - 1.0, 1.0), 0.0)
    return _out(np.where(n < 2, np.inf, v))


def welch_dof(
    v_own: ArrayLike, t: ArrayLike, var_T: ArrayLike, n_other: ArrayLike
) -> float | np.ndarray:
    """Welch–Satterthwaite ν of §III-C2: (A + B)²/(A²/(t−1) + B²/(n_other−1)), A = V_a/t, B = V̂ar.

    Pass n_other = t_κ for the formula as printed (the paper's 1/(t_{κ_{b→a}} − 1)), or
    n_other = κ for the alternative of docs/papers.md §1.6 (a Sch-Var-2 V_{b→a} has ~κ−1 degrees
    of freedom). A term whose count is 1 makes its denominator infinite (ν = 0, an infinite
    threshold). Where the formula is indeterminate (A and B both 0 or both +∞) ν is the Welch
    lower bound min(t, n_other) − 1; a single infinite term gives its own count − 1 (the limit).
    """
    v = _nonneg("v_own", v_own)
    n1 = _at_least("t", t, 1)
    n2 = _at_least("n_other", n_other, 1)
    B = _nonneg("var_T", var_T)
    A = v / n1
    with np.errstate(divide="ignore", invalid="ignore"):
        nu = (A + B) ** 2 / (A**2 / (n1 - 1) + B**2 / (n2 - 1))
    inf_a, inf_b = np.isinf(A), np.isinf(B)
    nu = np.where(inf_a & ~inf_b, n1 - 1, nu)
    nu = np.where(inf_b & ~inf_a, n2 - 1, nu)
    both = (inf_a & inf_b) | ((A == 0) & (B == 0))
    nu = np.where(both, np.minimum(n1, n2) - 1, nu)
    return _out(nu)


def welch_threshold(theta: ArrayLike, nu: ArrayLike) -> float | np.ndarray:
    """Φ⁻¹_{t,ν}(1 − θ/2) of §III-C2 (Student-t quantile); normal quantile at ν = ∞, +∞ at ν = 0."""
    from scipy.special import ndtri, stdtrit

    th = np.asarray(theta, dtype=float)
    if not np.all((th > 0) & (th < 1)):
        raise ValueError(f"theta = {theta!r}: must lie in (0, 1)")
    df = _nonneg("nu", nu)
    p = 1.0 - th / 2.0
    with np.errstate(invalid="ignore"):
        q = np.where(np.isinf(df), ndtri(p), stdtrit(np.where(df > 0, df, 1.0), p))
    return _out(np.where(df == 0, np.inf, q))


def welch_accepts(
    diff: np.ndarray,
    v_own: np.ndarray,
    t: np.ndarray,
    var_T: np.ndarray,
    n_other: np.ndarray,
    theta: float | np.ndarray,
) -> np.ndarray:
    """χ_a(b) of §III-C2: |X̄_a − T_{b→a}| < Φ⁻¹_{t,ν}(1−θ/2)·√(V_a/t + V̂ar[T_{b→a}]).

    `diff` is X̄_a − T_{b→a}. The hot-path form of `welch_threshold(θ, welch_dof(…))`, with the
    same result: it compares z = |diff|/√(V_a/t + V̂ar) with quantile bounds first — the
    normal quantile is below every Student-t quantile, and ν ≥ min(t, n_other) − 1 (Welch)
    bounds the t quantile above — and evaluates the t CDF only for z between the two. A test
    with an infinite variance (unknown V) accepts (z = 0). Inputs are trusted arrays.
    """
    from scipy.special import ndtri, stdtr, stdtrit

    z = np.abs(diff) / np.sqrt(v_own / t + var_T)  # an infinite variance gives z = 0
    # scalar bounds (one quantile each): smallest normal, largest Student-t quantile in use
    th = np.asarray(theta, dtype=float)
    inside = z < ndtri(1.0 - th.max() / 2.0)
    df_low = min(t.min(), n_other.min()) - 1.0
    upper = stdtrit(df_low, 1.0 - th.min() / 2.0) if df_low >= 1 else np.inf
    unsure = ~inside & (z < upper)
    if unsure.any():
        pick = lambda x: x[unsure] if np.ndim(x) else x  # noqa: E731
        nu = welch_dof(pick(v_own), pick(t), pick(var_T), pick(n_other))
        nu = np.atleast_1d(nu)
        cdf = stdtr(np.where(nu > 0, nu, 1.0), pick(z))
        p = np.broadcast_to(1.0 - th / 2.0, z.shape)
        inside[unsure] = (nu == 0) | (cdf < p[unsure])
    return inside


def plug_in_var_T(
    v_b: ArrayLike, data_term: ArrayLike, noise_term: ArrayLike, sigma2_dp: float
) -> float | np.ndarray:
    """V̂ar[T_{b→a}] = V_{b→a}·data_term + σ_DP²·noise_term of §III-C2; +∞ when V_{b→a} is +∞/NaN.

    data_term and noise_term are the two sums of (2)
    (desim.models.colme.analytic.data_term/noise_term).
    A negative V_{b→a} is rejected: apply the paper's rule (`negative_to_inf`) or (19) first.
    """
    v = np.asarray(v_b, dtype=float)
    if np.any(v < 0):
        raise ValueError(f"v_b = {np.ravel(v[v < 0])[0]!r}: must be ≥ 0, +∞ or NaN")
    dt = _nonneg("data_term", data_term, allow_inf=False)
    nt = _nonneg("noise_term", noise_term, allow_inf=False)
    s2 = float(_nonneg("sigma2_dp", sigma2_dp, allow_inf=False))
    with np.errstate(invalid="ignore"):
        out = v * dt + s2 * nt
    return _out(np.where(np.isnan(v) | np.isinf(v), np.inf, out))


def negative_to_inf(v: ArrayLike) -> float | np.ndarray:
    """The §V-A rule "if V_{b→a} < 0 set it to infinity" (α_{b→a} = 0); NaN also maps to +∞."""
    x = np.asarray(v, dtype=float)
    return _out(np.where((x >= 0), x, np.inf))


def combination_weights(
    t: ArrayLike, v_own: ArrayLike, var_T: ArrayLike, included: ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    """Random inverse-variance weights α of (5): α_{a→a} ∝ t/V_a^{(t)}, α_{b→a} ∝ 1/V̂ar[T_{b→a}].

    Rows are agents a: t and v_own have shape (..., M); var_T and included have shape
    (..., M, M) with entry [a, b] for the pair b → a (the diagonal is ignored). Returns
    (α_self of shape (..., M), α_others of shape (..., M, M), zero on the diagonal and outside
    `included`); each row sums to 1, as in the corrected bracketing of (3)–(5)
    (docs/papers.md §1.2).
    Degenerate rows: zero variances (infinite precision) share the weight equally; a row with no
    precision at all (V_a = +∞ and nobody usable) puts all weight on a's own mean.
    """
    v = _nonneg("v_own", v_own)
    tt = np.broadcast_to(_nonneg("t", t), v.shape)
    inc = np.asarray(included, dtype=bool)
    m = v.shape[-1]
    eye = np.eye(m, dtype=bool)
    var = np.asarray(var_T, dtype=float)
    if var.shape[-2:] != (m, m) or inc.shape[-2:] != (m, m):
        raise ValueError(
            f"var_T/included shapes {var.shape}/{inc.shape}: last two axes must be ({m}, {m})"
        )
    use = inc & ~eye
    _nonneg("var_T", np.where(use, var, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        p_self = np.where(tt == 0, 0.0, tt / v)
        p_oth = np.where(use, 1.0 / np.where(use, var, 1.0), 0.0)
    inf_self, inf_oth = np.isinf(p_self), np.isinf(p_oth)
    n_inf = inf_self + inf_oth.sum(axis=-1)
    total = p_self + np.where(inf_oth, 0.0, p_oth).sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        a_self = np.where(n_inf > 0, inf_self / n_inf, p_self / total)
        a_oth = np.where(
            (n_inf > 0)[..., None], inf_oth / n_inf[..., None], p_oth / total[..., None]
        )
    empty = (n_inf == 0) & (total == 0)
    a_self = np.where(empty, 1.0, a_self)
    a_oth = np.where(empty[..., None], 0.0, a_oth)
    return a_self, a_oth


# --------------------------------------------------------------------- p-sum splits


def dyadic_split(kappa: int) -> list[tuple[int, int]]:
    """PM-II nodes of release κ as query-index intervals [start, end] (1-based), in order.

    One node per set bit of κ = 2^{s_1} + 2^{s_2} + … (s_1 > s_2 > …): node (s, m), m odd,
    covers query indices [(m−1)2^s + 1, m2^s]. The node's samples are (t_{start−1}, t_end], and
    its Z and W are drawn once and reused by every release whose split contains it.
    """
    if isinstance(kappa, bool) or int(kappa) != kappa or kappa < 1:
        raise ValueError(f"kappa = {kappa!r}: must be an integer ≥ 1")
    kappa = int(kappa)
    out, end = [], 0
    for s in range(kappa.bit_length() - 1, -1, -1):
        if kappa >> s & 1:
            out.append((end + 1, end + (1 << s)))
            end += 1 << s
    return out


def release_split(times: ArrayLike, mechanism: str) -> np.ndarray:
    """τ_1 < … < τ_k of release κ = len(times): the query times (PM-I, k = κ) or the dyadic
    node ends t_end of `dyadic_split(κ)` (PM-II, k = w_H(κ)) — §IV."""
    _check_choice("mechanism", mechanism, MECHANISMS)
    t = np.asarray(times)
    if t.ndim != 1 or t.size == 0 or np.any(t[0] < 1) or np.any(np.diff(t) <= 0):
        raise ValueError(f"times = {times!r}: must be a non-empty increasing 1-D array ≥ 1")
    if mechanism == "pm1":
        return t.copy()
    return t[[end - 1 for _, end in dyadic_split(t.size)]]


def _check_taus(taus: ArrayLike) -> np.ndarray:
    tau = np.asarray(taus)
    ok = (
        tau.ndim == 1
        and tau.size > 0
        and np.issubdtype(tau.dtype, np.number)
        and bool(np.all(tau == np.round(tau)))
        and tau[0] >= 1
        and not np.any(np.diff(tau) <= 0)
    )
    if not ok:
        raise ValueError(f"taus = {taus!r}: must be a non-empty increasing 1-D integer array ≥ 1")
    return tau.astype(np.int64)


# ------------------------------------------------------------------------ Sch-Var-1


def schvar1_release(
    x: ArrayLike, taus: ArrayLike, Z: ArrayLike, W: ArrayLike, sigma2_dp: float
) -> float | np.ndarray:
    """Sch-Var-1 release V_{b→a} of (6)–(8), unbiased for σ_b² (Lemma 6); not clipped.

    x: samples of b on the last axis (the first t = τ_k are used); taus: τ_1..τ_k (1-D);
    Z, W: (..., k) noises of the p-sums (variance σ_DP², the mean release's) and of the partial
    sample variances (variance σ_{2,DP}²). With S_i, Q_i the sum and sum of squares over
    (τ_{i−1}, τ_i] and d_i = τ_i − τ_{i−1}:

        Ṽ̃_i = Q_i − S_i²/d_i + (d_i−1)/d_i·W_i + (S_i + Z_i)²/d_i                (6), (7)
        V = Σ Ṽ̃_i/(t−1) − (ΣS_i + ΣZ_i)²/(t(t−1)) − σ_DP²(Σ 1/d_i − k/t)/(t−1)      (8)

    since t(x̄ + Z^{(t)})² = (ΣS + ΣZ)²/t. E[V] = σ_b²: the squared noise terms have means
    σ_DP²Σ1/d_i/(t−1) and kσ_DP²/(t(t−1)), which (15) removes (any noise law, Z ⟂ W ⟂ x).
    +∞ when t < 2. For PM-II pass `release_split(times, "pm2")` and the nodes' reused Z, W.
    """
    tau = _check_taus(taus)
    xs = np.asarray(x, dtype=float)
    t = int(tau[-1])
    if xs.ndim == 0 or xs.shape[-1] < t:
        raise ValueError(f"x: last axis has {np.shape(xs)[-1:]} samples, need τ_k = {t}")
    z = np.asarray(Z, dtype=float)
    w = np.asarray(W, dtype=float)
    k = tau.size
    if z.shape[-1:] != (k,) or w.shape[-1:] != (k,):
        raise ValueError(f"Z/W shapes {z.shape}/{w.shape}: last axis must be k = {k}")
    s2 = float(_nonneg("sigma2_dp", sigma2_dp, allow_inf=False))
    lead = np.broadcast_shapes(xs.shape[:-1], z.shape[:-1], w.shape[:-1])
    if t < 2:
        return _out(np.full(lead, np.inf))
    xs = xs[..., :t]
    idx = np.concatenate(([0], tau))
    c1 = np.concatenate((np.zeros(xs.shape[:-1] + (1,)), np.cumsum(xs, axis=-1)), axis=-1)
    c2 = np.concatenate((np.zeros(xs.shape[:-1] + (1,)), np.cumsum(xs**2, axis=-1)), axis=-1)
    S = np.diff(c1[..., idx], axis=-1)
    Q = np.diff(c2[..., idx], axis=-1)
    d = np.diff(idx).astype(float)
    vtt = Q - S**2 / d + (d - 1) / d * w + (S + z) ** 2 / d
    total = S.sum(axis=-1) + z.sum(axis=-1)
    v = vtt.sum(axis=-1) / (t - 1) - total**2 / (t * (t - 1))
    v = v - s2 * (np.sum(1.0 / d) - k / t) / (t - 1)
    return _out(np.broadcast_to(v, lead).copy())


# ------------------------------------------------------------------------ Sch-Var-2


def noise_counts(k: int, mechanism: str) -> tuple[np.ndarray, int]:
    """(c_1..c_k, c_tot): Var of the i-th release increment's noise and of their sum, over σ_DP².

    The querier sees releases R_i = (S(t_i) + Z(i))/t_i and differences them, P_i = t_iR_i −
    t_{i−1}R_{i−1} = S_i + N_i, N_i = Z(i) − Z(i−1). PM-I: N_i is one fresh p-sum noise, c_i = 1,
    ΣN_i = Z(k) has k noises, c_tot = k. PM-II: i and i−1 share the nodes above bit lsb(i); i
    adds one node at level lsb(i) and i−1 had the lsb(i) nodes below it, so c_i = 1 + lsb(i);
    ΣN_i = Z(k) has c_tot = w_H(k) nodes. The N_i are correlated under PM-II; only these two
    variances enter the estimator's mean.
    """
    _check_choice("mechanism", mechanism, MECHANISMS)
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"k = {k!r}: must be an integer ≥ 1")
    k = int(k)
    if mechanism == "pm1":
        return np.ones(k), k
    i = np.arange(1, k + 1)
    return (1 + lowest_set_bit(i)).astype(float), int(popcount(np.asarray(k)))


def _psums_lengths(psums: ArrayLike, lengths: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(psums, dtype=float)
    if p.ndim == 0:
        raise ValueError("psums: need a last axis of p-sums")
    d = np.broadcast_to(np.asarray(lengths, dtype=float), p.shape)
    if not np.all(d > 0):
        raise ValueError(f"lengths = {lengths!r}: must all be > 0")
    return p, d


def schvar2_raw_and_K(
    psums: ArrayLike,
    lengths: ArrayLike,
    mechanism: str = "pm1",
    *,
    counts: tuple[ArrayLike, float] | None = None,
) -> tuple[float | np.ndarray, float | np.ndarray]:
    """(V', K) of §V-B1 in the general form: V_{b→a} = V' − K·σ_DP² (Sch-Var-2, Lemma 7).

    With noisy p-sums P_i = S_i + N_i over intervals of lengths d_i (last axis), D = Σd_i and
    (c_i, c_tot) from `noise_counts` (or `counts`):

        V' = [Σ P_i²/d_i − (ΣP_i)²/D]/(k−1) = Σ d_i(P_i/d_i − ΣP/D)²/(k−1) ≥ 0,
        K  = (Σ c_i/d_i − c_tot/D)/(k−1).

    E[P_i²/d_i] = d_iμ² + σ² + c_iσ_DP²/d_i and E[(ΣP)²/D] = Dμ² + σ² + c_totσ_DP²/D, so
    E[V'] = σ_b² + Kσ_DP²: V is unbiased for any gaps, and reduces to (16) when all d_i are equal
    (PM-I, RR: K = 1/(M−1)). (16) itself is biased by μ_b²·s²(√d_i) with unequal gaps
    (`schvar2_eq16`). k < 2 gives (+∞, 0), so V = +∞.
    """
    p, d = _psums_lengths(psums, lengths)
    k = p.shape[-1]
    if k < 2:
        return _out(np.full(p.shape[:-1], np.inf)), _out(np.zeros(p.shape[:-1]))
    if counts is None:
        c, c_tot = noise_counts(k, mechanism)
    else:
        _check_choice("mechanism", mechanism, MECHANISMS)
        c = _nonneg("counts[0]", counts[0], allow_inf=False)
        c_tot = float(_nonneg("counts[1]", counts[1], allow_inf=False))
        if c.shape[-1:] not in ((k,), ()):
            raise ValueError(f"counts[0] shape {c.shape}: last axis must be k = {k}")
    D = d.sum(axis=-1)
    mean = p.sum(axis=-1) / D
    v_raw = np.sum(d * (p / d - mean[..., None]) ** 2, axis=-1) / (k - 1)
    K = (np.sum(c / d, axis=-1) - c_tot / D) / (k - 1)
    return _out(v_raw), _out(K)


def schvar2_estimate(
    psums: ArrayLike,
    lengths: ArrayLike,
    sigma2_dp: float,
    mechanism: str = "pm1",
    *,
    counts: tuple[ArrayLike, float] | None = None,
) -> float | np.ndarray:
    """Sch-Var-2 V_{b→a} = V' − K·σ_DP² (general unbiased form of (16), Lemma 7); not clipped.

    See `schvar2_raw_and_K`; +∞ when k < 2. For PM-II, P_i must be the increments of releases
    1..k (the c_i depend on the absolute release index).
    """
    s2 = float(_nonneg("sigma2_dp", sigma2_dp, allow_inf=False))
    v_raw, K = schvar2_raw_and_K(psums, lengths, mechanism, counts=counts)
    return _out(np.asarray(v_raw) - np.asarray(K) * s2)


def schvar2_eq16(psums: ArrayLike, lengths: ArrayLike, sigma2_dp: float) -> float | np.ndarray:
    """(16) as printed: sample variance of Y_i + Z̃_i = P_i/√d_i minus (σ_DP²/k)Σ1/d_i (PM-I).

    Unbiased only when all d_i are equal (or μ_b = 0): E[(16)] = σ_b² + μ_b²·s²(√d_1..√d_k),
    since E[P_i/√d_i] = √d_i·μ_b differs between p-sums. +∞ when k < 2.
    """
    p, d = _psums_lengths(psums, lengths)
    s2 = float(_nonneg("sigma2_dp", sigma2_dp, allow_inf=False))
    k = p.shape[-1]
    if k < 2:
        return _out(np.full(p.shape[:-1], np.inf))
    y = p / np.sqrt(d)
    return _out(np.var(y, axis=-1, ddof=1) - s2 * np.sum(1.0 / d, axis=-1) / k)


# ---------------------------------------------------------------- Bayesian fix (19)


#: a − κ/2 for each prior of §V-B1 (footnotes 2 and 3).
_PRIOR_SHIFT = {"paper": 1.0, "jeffreys": 0.5, "uniform": -1.0}


def posterior_shape(kappa: ArrayLike, prior: str = "paper") -> float | np.ndarray:
    """Shape a of the §V-B1 posterior: (κ+2)/2 (paper), (κ+1)/2 (Jeffreys), (κ−2)/2 (uniform).

    With the likelihood s^{−κ/2}e^{−β/s} of s = σ_b² + Kσ_DP² used by the paper and a prior
    ∝ s^{−p} this is a = κ/2 + p − 1: p = 2 (footnote 2), 3/2 (Jeffreys' σ^{−3}), 0 (footnote 3).
    """
    _check_choice("prior", prior, PRIORS)
    k = _at_least("kappa", kappa, 2)
    return _out(k / 2 + _PRIOR_SHIFT[prior])


def _h_minus_a(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """g = h − a with h = x^a e^{−x}/γ(a, x), stable for all x ≥ 0 (h → a as x → 0, → 0 as x → ∞).

    x ≤ a: from γ(a, x) = x^a e^{−x} Σ_n x^n/(a(a+1)…(a+n)), 1/h = F₁/a with F₁ = ₁F₁(1; a+1; x)
    ≤ (a+1)/(a+1−x) (no overflow), and h − a = −a(F₁−1)/F₁, F₁ − 1 = x/(a+1)·₁F₁(1; a+2; x)
    (no cancellation). x > a: P(a, x) ≳ 1/2, so h = exp(a ln x − x − ln Γ(a))/P(a, x) is safe.
    """
    from scipy.special import gammainc, gammaln, hyp1f1

    if a.shape != x.shape:
        a, x = np.broadcast_arrays(a, x)
    small = x <= a
    g = np.empty(x.shape)
    if small.any():  # each branch is evaluated on its own entries only
        xs, as_ = x[small], a[small]
        f1 = hyp1f1(1.0, as_ + 1.0, xs)
        g[small] = -as_ * (xs / (as_ + 1.0)) * hyp1f1(1.0, as_ + 2.0, xs) / f1
    large = ~small
    if large.any():
        xl, al = x[large], a[large]
        with np.errstate(divide="ignore", over="ignore", under="ignore", invalid="ignore"):
            h_large = np.exp(al * np.log(xl) - xl - gammaln(al)) / gammainc(al, xl)
        g[large] = np.where(np.isinf(xl), 0.0, h_large) - al
    return g


def bayes_posterior_mean(
    v_raw: ArrayLike,
    K_sigma2: ArrayLike,
    kappa: ArrayLike,
    prior: str = "paper",
    check: bool = True,
) -> float | np.ndarray:
    """Posterior mean E[σ_b² | V'] of §V-B1 under the truncated inverse-gamma posterior.

    Posterior of s = σ_b² + c, c = Kσ_DP²: ∝ s^{−a−1}e^{−β/s} on s ≥ c, a = `posterior_shape`,
    β = (κ−1)V'/2. With u = β/s, ∫_c^∞ s^{−a−1}e^{−β/s}ds = β^{−a}γ(a, x), x = β/c, so
    E[s] = β·γ(a−1, x)/γ(a, x) = β·P(a−1, x)/((a−1)P(a, x)) (the paper's V'(κ−1)/2·f(−1)/f(0)).
    Using γ(a, x) = (a−1)γ(a−1, x) − x^{a−1}e^{−x} this is (β + c·h)/(a−1), h = x^a e^{−x}/γ(a, x),
    so E[σ_b²] = c(x + 1 + h − a)/(a−1), evaluated without under/overflow. Limits: V' → 0 gives
    c/(a−1) (a Pareto posterior); x → ∞ gives β/(a−1) − c (untruncated); c = 0 gives β/(a−1).
    +∞ when a ≤ 1 (the mean diverges; for a ≤ 0, e.g. uniform prior with κ = 2, the posterior
    is improper too). `check = False` skips argument validation (trusted hot-path callers).
    """
    k = np.asarray(kappa, dtype=float)
    v = np.asarray(v_raw, dtype=float)
    c = np.asarray(K_sigma2, dtype=float)
    if check:
        a = np.asarray(posterior_shape(kappa, prior), dtype=float)
        if not (
            v.min(initial=0.0) >= 0 and c.min(initial=0.0) >= 0 and np.isfinite(v.sum() + c.sum())
        ):
            _nonneg("v_raw", v_raw, allow_inf=False)  # names the bad argument
            _nonneg("K_sigma2", K_sigma2, allow_inf=False)
    else:  # trusted callers (a protocol's hot path): the same shape, without the checks
        a = k / 2 + _PRIOR_SHIFT[prior]
    if not (a.shape == k.shape == v.shape == c.shape):
        a, k, v, c = np.broadcast_arrays(a, k, v, c)
    beta = (k - 1) * v / 2
    ok = a > 1
    a1 = np.where(ok, a, 2.0)
    pos_c = c > 0
    x = np.divide(beta, c, out=np.zeros(beta.shape), where=pos_c)  # c = 0: untruncated, below
    g = _h_minus_a(a1, x)
    mean = np.where(pos_c, c * (x + 1.0 + g), beta) / (a1 - 1.0)
    return _out(np.where(ok, mean, np.inf))


def schvar2_bayes(
    v: ArrayLike,
    v_raw: ArrayLike,
    K_sigma2: ArrayLike,
    kappa: ArrayLike,
    prior: str = "paper",
) -> float | np.ndarray:
    """Improved estimator (19): V_{b→a} if V_{b→a} ≥ 0, else the posterior mean of σ_b².

    v = V' − Kσ_DP² (`schvar2_estimate`); +∞ stays +∞. Only the negative entries are passed to
    `bayes_posterior_mean`, so κ < 2 entries (V = +∞) need no valid prior.
    """
    vv = np.asarray(v, dtype=float)
    if np.any(np.isnan(vv)):
        raise ValueError("v: must not contain NaN")
    vr, kc, kp = np.broadcast_arrays(
        np.asarray(v_raw, dtype=float), np.asarray(K_sigma2, dtype=float), np.asarray(kappa)
    )
    vv, vr, kc, kp = np.broadcast_arrays(vv, vr, kc, kp)
    out = vv.astype(float).copy()
    neg = vv < 0
    if np.any(neg):
        out[neg] = bayes_posterior_mean(vr[neg], kc[neg], kp[neg], prior)
    return _out(out)
